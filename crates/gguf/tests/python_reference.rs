//! Against gguf-py (the `gguf` PyPI package, 0.19.0), the reference implementation that
//! llama.cpp's converters use: files written by its `GGUFWriter` read back with every value,
//! and each block format dequantizes bit for bit as `gguf.quants.dequantize` does.
//!
//! Needs `OXGEN_PYTHON`: a Python with `gguf==0.19.0` and numpy (`scripts/test.sh` sets it
//! to `.cache/venv/bin/python`). The helper script is `tests/python/gguf_reference.py`.

use std::path::{Path, PathBuf};
use std::process::Command;

use oxgen_gguf::{Array, GgmlType, GgufFile, Value};

fn python() -> PathBuf {
    std::env::var_os("OXGEN_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "OXGEN_PYTHON is not set: point it at a Python with gguf==0.19.0 and numpy \
             (scripts/test.sh sets it to .cache/venv/bin/python)"
            )
        })
}

fn run_script(args: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/gguf_reference.py");
    let out = Command::new(python())
        .arg(&script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run $OXGEN_PYTHON ({}): {e}", python().display()));
    assert!(
        out.status.success(),
        "{} {args:?} failed:\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes a file of `fmt` with gguf-py and compares our dequantization of each tensor with
/// gguf-py's, bit for bit.
fn matches_gguf_py(fmt: &str, ty: GgmlType) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_script(&["blocks", fmt, d.to_str().unwrap(), "7"]);
    let file = GgufFile::open(d.join(format!("{fmt}.gguf"))).unwrap();
    assert_eq!(file.tensors().len(), 2);
    for name in ["quantized.weight", "raw.weight"] {
        let t = file.tensor(name).unwrap();
        assert_eq!(t.ggml_type, ty, "{name}");
        let shape: Vec<usize> = std::fs::read_to_string(d.join(format!("{name}.shape")))
            .unwrap()
            .split_whitespace()
            .map(|s| s.parse().unwrap())
            .collect();
        let expected: Vec<u32> = std::fs::read(d.join(format!("{name}.f32")))
            .unwrap()
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let got = file.dequantize(name).unwrap();
        assert_eq!(got.dims(), shape.as_slice(), "{fmt} {name}: shape");
        let got: Vec<u32> = got
            .as_slice::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect();
        assert_eq!(got.len(), expected.len(), "{fmt} {name}: element count");
        if let Some(i) = (0..got.len()).find(|&i| got[i] != expected[i]) {
            panic!(
                "{fmt} {name}: element {i} (block {}) is {:e} ({:#010x}), gguf-py gives {:e} ({:#010x})",
                i / ty.block_elems() as usize,
                f32::from_bits(got[i]),
                got[i],
                f32::from_bits(expected[i]),
                expected[i]
            );
        }
    }
}

#[test]
fn f32_matches_gguf_py() {
    matches_gguf_py("F32", GgmlType::F32);
}

#[test]
fn f16_matches_gguf_py() {
    matches_gguf_py("F16", GgmlType::F16);
}

#[test]
fn bf16_matches_gguf_py() {
    matches_gguf_py("BF16", GgmlType::BF16);
}

#[test]
fn q8_0_matches_gguf_py() {
    matches_gguf_py("Q8_0", GgmlType::Q8_0);
}

#[test]
fn q4_0_matches_gguf_py() {
    matches_gguf_py("Q4_0", GgmlType::Q4_0);
}

#[test]
fn q4_1_matches_gguf_py() {
    matches_gguf_py("Q4_1", GgmlType::Q4_1);
}

#[test]
fn q4_k_matches_gguf_py() {
    matches_gguf_py("Q4_K", GgmlType::Q4_K);
}

#[test]
fn q5_k_matches_gguf_py() {
    matches_gguf_py("Q5_K", GgmlType::Q5_K);
}

#[test]
fn q6_k_matches_gguf_py() {
    matches_gguf_py("Q6_K", GgmlType::Q6_K);
}

#[test]
fn mxfp4_matches_gguf_py() {
    matches_gguf_py("MXFP4", GgmlType::MXFP4);
}

#[test]
fn metadata_written_by_gguf_py_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.gguf");
    run_script(&["metadata", path.to_str().unwrap()]);
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get("t.u8"), Some(&Value::U8(200)));
    assert_eq!(f.get("t.i8"), Some(&Value::I8(-100)));
    assert_eq!(f.get("t.u16"), Some(&Value::U16(60000)));
    assert_eq!(f.get("t.i16"), Some(&Value::I16(-30000)));
    assert_eq!(f.get_u32("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(f.get_i32("t.i32").unwrap(), -2_000_000_000);
    assert_eq!(f.get_f32("t.f32").unwrap(), 1.5);
    assert_eq!(f.get_u64("t.u64").unwrap(), (1 << 63) + 5);
    assert_eq!(f.get_i64("t.i64").unwrap(), -(1 << 62));
    assert_eq!(f.get_f64("t.f64").unwrap(), 2.25);
    assert!(f.get_bool("t.bool").unwrap());
    assert_eq!(f.get_str("t.str").unwrap(), "h\u{e9}llo \u{2713}");
    assert_eq!(f.get_str_array("t.strs").unwrap(), ["a", "bc", ""]);
    assert_eq!(f.get_i32_array("t.i32s").unwrap(), [1, -2, 3]);
    assert_eq!(f.get_f32_array("t.f32s").unwrap(), [0.5, -1.0]);
    assert_eq!(
        f.get_array("t.bools").unwrap(),
        &Array::Bool(vec![true, false])
    );
    assert_eq!(
        f.get_array("t.u64s").unwrap(),
        &Array::U64(vec![1, 1 << 40])
    );
    assert_eq!(
        f.get_array("t.nested").unwrap(),
        &Array::Array(vec![Array::I32(vec![1, 2]), Array::I32(vec![3])])
    );

    let a = f.tensor("a").unwrap();
    assert_eq!(
        (a.ggml_type, a.dims.as_slice()),
        (GgmlType::F32, &[3u64, 2][..])
    );
    let values = f.dequantize("a").unwrap();
    assert_eq!(values.dims(), [2, 3]);
    assert_eq!(values.as_slice::<f32>().unwrap(), [0., 1., 2., 3., 4., 5.]);
    let b = f.dequantize("b").unwrap();
    assert_eq!(b.as_slice::<f32>().unwrap(), [1.0, -2.0]);
    assert_eq!(f.tensor("b").unwrap().data_offset % 64, 0);
}
