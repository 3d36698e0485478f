#!/usr/bin/env python3
"""Re-quantizes a package's float-zero-point MatMulNBits weights to uint8 zero points.

Why: oxgen imports a GGUF Q4_1 block (w = d * q + m) exactly as MatMulNBits with *float* zero
points (zp = -m / d). onnxruntime's CPU MatMulNBits only prepacks and runs its fast int4 kernels
(MLAS SQNBitGemm, int8 activations at accuracy_level 4) when zero points are uint8; with float
zero points it dequantizes every weight to f32 on every call and runs an f32 GEMM
(`has_unquantized_zero_point_` -> `ComputeBUnpacked` in
onnxruntime/contrib_ops/cpu/quantization/matmul_nbits.cc). So onnxruntime-genai on oxgen's import
measures that fallback, not onnxruntime's int4 path. This script writes a copy of the package
whose MatMulNBits use the layout onnxruntime-genai's own model builder emits for int4 CPU models
(4 bits, uint8 zero points, same block size and accuracy_level), so the peer runs its fast path.

How: each MatMulNBits weight is dequantized by onnxruntime itself (the node applied to an
identity matrix, so the float-zero-point semantics are onnxruntime's), then re-quantized with
asymmetric round-to-nearest per block (scale = (max - min) / 15, zero point = round(-min /
scale) clamped to [0, 15]), as onnxruntime's default MatMulNBits quantizer does. The weights are
therefore close to, not equal to, the GGUF's: use the copy for speed, not for accuracy.
Every other node and initializer (GatherBlockQuantized embedding included) is unchanged.

Usage: make_ort_int4.py SRC_PACKAGE DST_PACKAGE  (does nothing when DST/model.onnx exists)
"""

import os
import shutil
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def dequantize(node, inits):
    """The node's weight as f32 [N, K], computed by onnxruntime: Y = I_K @ W^T."""
    a = attrs(node)
    k, n = a["K"], a["N"]
    inputs = [helper.make_tensor_value_info("A", TensorProto.FLOAT, [k, k])]
    names = ["A"]
    initializers = []
    for name in node.input[1:4]:
        if not name:
            names.append("")
            continue
        tensor = numpy_helper.from_array(numpy_helper.to_array(inits[name]), name)
        initializers.append(tensor)
        names.append(name)
    mm = helper.make_node("MatMulNBits", names, ["Y"], domain="com.microsoft", **a)
    graph = helper.make_graph(
        [mm], "dequant", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [k, n])], initializers
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"A": np.eye(k, dtype=np.float32)})
    return np.ascontiguousarray(y.T)


def quantize_rtn(w, block_size):
    """Asymmetric 4-bit round-to-nearest per block of K, in MatMulNBits' layout.

    Returns (B [N, blocks, block_size / 2] uint8, two values a byte, low nibble first;
    scales [N * blocks] f32; zero_points [N * ceil(blocks / 2)] uint8, two a byte, low first).
    """
    n, k = w.shape
    blocks = -(-k // block_size)
    padded = np.zeros((n, blocks * block_size), dtype=np.float32)
    padded[:, :k] = w
    x = padded.reshape(n, blocks, block_size)
    lo = np.minimum(x.min(axis=2), 0.0)
    hi = np.maximum(x.max(axis=2), 0.0)
    scale = (hi - lo) / 15.0
    safe = np.where(scale == 0, 1.0, scale)
    zp = np.clip(np.round(-lo / safe), 0, 15).astype(np.uint8)
    q = np.clip(np.round(x / safe[:, :, None]) + zp[:, :, None], 0, 15).astype(np.uint8)
    packed = (q[:, :, 0::2] | (q[:, :, 1::2] << 4)).astype(np.uint8)
    zp_padded = np.zeros((n, blocks + blocks % 2), dtype=np.uint8)
    zp_padded[:, :blocks] = zp
    zp_packed = (zp_padded[:, 0::2] | (zp_padded[:, 1::2] << 4)).astype(np.uint8)
    return packed, scale.astype(np.float32).reshape(-1), zp_packed.reshape(-1)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    if os.path.exists(os.path.join(dst, "model.onnx")):
        print(f"already there: {dst}", file=sys.stderr)
        return
    model = onnx.load(os.path.join(src, "model.onnx"))
    inits = {i.name: i for i in model.graph.initializer}
    converted = 0
    for node in model.graph.node:
        if node.op_type != "MatMulNBits" or len(node.input) < 4 or not node.input[3]:
            continue
        zp = inits.get(node.input[3])
        if zp is None or zp.data_type == TensorProto.UINT8:
            continue
        a = attrs(node)
        if a.get("bits", 4) != 4 or (len(node.input) > 4 and node.input[4]):
            sys.exit(f"{node.name}: only 4-bit MatMulNBits without g_idx are handled")
        w = dequantize(node, inits)
        packed, scales, zps = quantize_rtn(w, a["block_size"])
        for name, array in ((node.input[1], packed), (node.input[2], scales), (node.input[3], zps)):
            inits[name].CopyFrom(numpy_helper.from_array(array, name))
        converted += 1
    # Stale type annotations of the zero points would contradict the new uint8 tensors.
    stale = {n for n in inits if n.endswith(("qzeros", "zero_points"))}
    kept = [v for v in model.graph.value_info if v.name not in stale]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        if name not in ("model.onnx", "model.onnx.data") and os.path.isfile(os.path.join(src, name)):
            shutil.copy2(os.path.join(src, name), os.path.join(dst, name))
    tmp = os.path.join(dst, "model.onnx.tmp")
    onnx.save_model(model, tmp, save_as_external_data=True, all_tensors_to_one_file=True, location="model.onnx.data")
    os.replace(tmp, os.path.join(dst, "model.onnx"))
    print(f"re-quantized {converted} MatMulNBits nodes to uint8 zero points: {dst}", file=sys.stderr)


if __name__ == "__main__":
    main()
