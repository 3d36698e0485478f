"""Reference GGUF files from gguf-py (the `gguf` PyPI package, 0.19.0), for
crates/gguf/tests/python_reference.rs.

usage:
  gguf_reference.py blocks FORMAT OUT_DIR SEED
      Writes OUT_DIR/FORMAT.gguf with GGUFWriter: tensor `quantized.weight` (float data
      quantized by gguf.quants.quantize, incl. all-zero, constant and extreme rows) and
      tensor `raw.weight` (random block bytes with finite f16 fields, incl. zero and
      negative-zero scales). Then reads the file back with GGUFReader and writes each
      tensor's gguf.quants.dequantize output as OUT_DIR/<tensor name>.f32 (little-endian
      f32, NumPy order) and its NumPy shape as OUT_DIR/<tensor name>.shape.
  gguf_reference.py metadata OUT_PATH
      Writes a GGUF with one metadata entry of every value type (values listed below and
      asserted by the Rust test), a custom alignment of 64 and two tensors.
"""

import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T, GGUFValueType as V

FORMATS = {
    "F32": T.F32,
    "F16": T.F16,
    "BF16": T.BF16,
    "Q8_0": T.Q8_0,
    "Q4_0": T.Q4_0,
    "Q4_1": T.Q4_1,
    "Q4_K": T.Q4_K,
    "Q5_K": T.Q5_K,
    "Q6_K": T.Q6_K,
    "MXFP4": T.MXFP4,
}

# gguf-py 0.19.0 dequantizes the K-quants but cannot quantize them: both of their tensors are
# random blocks.
K_QUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)


def finite_f16_bits(rng, n):
    """Random f16 bit patterns, made finite (exponent 31 is inf/NaN)."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    inf_nan = (bits & 0x7C00) == 0x7C00
    bits[inf_nan] &= 0xBFFF  # clear the top exponent bit
    return bits


def quantized_source(rng, qtype):
    k = 96
    rows = [
        rng.standard_normal(k) * 0.05,
        np.zeros(k),
        np.full(k, -1.5),
        -np.abs(rng.standard_normal(k)),  # negative minimum, nothing positive
        rng.uniform(-60000, 60000, k),  # near the f16 range
        rng.standard_normal(k) * 1e-6,  # scales in f16 subnormals
        rng.standard_normal(k) * 3 + 1,
    ]
    data = np.stack(rows).astype(np.float32)
    if qtype == T.F32:
        return data, None
    if qtype == T.F16:
        return data.astype(np.float16), None
    if qtype in K_QUANTS:
        return raw_source(rng, qtype)
    return gguf.quants.quantize(data, qtype), qtype


def raw_source(rng, qtype):
    rows, k = 9, 64
    if qtype == T.F32:
        bits = rng.integers(0, 1 << 32, size=rows * k, dtype=np.uint64).astype(np.uint32)
        inf_nan = (bits & 0x7F800000) == 0x7F800000
        bits[inf_nan] &= 0xBFFFFFFF
        return bits.view(np.float32).reshape(rows, k), None
    if qtype == T.F16:
        return finite_f16_bits(rng, rows * k).view(np.float16).reshape(rows, k), None
    if qtype == T.BF16:
        bits = rng.integers(0, 1 << 16, size=rows * k, dtype=np.uint32).astype(np.uint16)
        inf_nan = (bits & 0x7F80) == 0x7F80
        bits[inf_nan] &= 0xBFFF
        return bits.view(np.uint8).reshape(rows, k * 2), qtype
    if qtype in K_QUANTS:
        k = 256
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = rows * k // block_elems
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint16).astype(np.uint8)
    # d (and m, or Q4_K's and Q5_K's dmin) lead the block; Q6_K's d ends it.
    n_f16 = 2 if qtype in (T.Q4_1, T.Q4_K, T.Q5_K) else 1
    f16 = finite_f16_bits(rng, n_blocks * n_f16).reshape(n_blocks, n_f16)
    f16[0, 0] = 0x0000  # zero scale
    f16[1, 0] = 0x8000  # negative-zero scale
    if n_f16 == 2:
        f16[2, 0] = 0x0000
        f16[2, 1] = 0x8000  # zero scale, negative-zero minimum
        f16[3, 1] = 0xFBFF  # minimum -65504
    if qtype == T.MXFP4:
        # Every exponent byte occurs, 0, 1 and 255 among them.
        blocks[:3, 0] = [0, 1, 255]
        return blocks.reshape(rows, -1), qtype
    if qtype == T.Q6_K:
        blocks[:, -2:] = f16.view(np.uint8).reshape(n_blocks, 2)
    else:
        blocks[:, : 2 * n_f16] = f16.view(np.uint8).reshape(n_blocks, 2 * n_f16)
    return blocks.reshape(rows, -1), qtype


def blocks(fmt, out_dir, seed):
    qtype = FORMATS[fmt]
    rng = np.random.default_rng(seed)
    out_dir = Path(out_dir)
    path = out_dir / f"{fmt}.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    for name, (data, raw_dtype) in [
        ("quantized.weight", quantized_source(rng, qtype)),
        ("raw.weight", raw_source(rng, qtype)),
    ]:
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    for t in gguf.GGUFReader(str(path)).tensors:
        assert t.tensor_type == qtype, (t.name, t.tensor_type)
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype("<f4", copy=False)
        assert not np.isnan(values).any(), t.name
        values.tofile(out_dir / f"{t.name}.f32")
        (out_dir / f"{t.name}.shape").write_text(" ".join(map(str, values.shape)))


def metadata(out_path):
    w = gguf.GGUFWriter(str(out_path), arch="llama")
    w.add_custom_alignment(64)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 1.5)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 2.25)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "h\u00e9llo \u2713")
    w.add_array("t.strs", ["a", "bc", ""])
    w.add_array("t.i32s", [1, -2, 3])
    w.add_array("t.f32s", [0.5, -1.0])
    w.add_array("t.bools", [True, False])
    w.add_key_value("t.u64s", [1, 2**40], V.ARRAY, sub_type=V.UINT64)
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_tensor("a", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.add_tensor("b", np.array([1.0, -2.0], dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "blocks":
        blocks(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif cmd == "metadata":
        metadata(sys.argv[2])
    else:
        sys.exit(f"unknown command {cmd!r}")
