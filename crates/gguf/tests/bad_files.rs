//! One crafted file per way a GGUF file can be bad (DESIGN.md §5.3). Each test checks the
//! error variant and that the message names the file, the key or tensor, and the offset
//! where there is one. Files are built byte by byte with [`Raw`], so every field can lie.

use std::path::Path;

use oxgen_gguf::{GgmlType, GgufError, GgufFile, GgufWriter, Value};

/// A GGUF image under construction, little-endian.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    /// Magic, version and the two counts.
    fn header(version: u32, tensors: u64, kvs: u64) -> Raw {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(version).u64(tensors).u64(kvs);
        r
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend(b);
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    /// A uint32 metadata entry.
    fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.str(key).u32(4).u32(v)
    }
    fn tensor_info(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Zero padding to a multiple of `align`.
    fn pad(&mut self, align: usize) -> &mut Self {
        let len = self.0.len().next_multiple_of(align);
        self.0.resize(len, 0);
        self
    }
    fn offset(&self) -> u64 {
        self.0.len() as u64
    }
}

/// Parses `bytes` through a real file, so messages carry its path.
fn open_err(bytes: &[u8]) -> (GgufError, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.gguf");
    std::fs::write(&path, bytes).unwrap();
    let e = GgufFile::open(&path).expect_err("the file must be rejected");
    assert_eq!(e.file(), path.as_path());
    let msg = e.to_string();
    assert!(
        msg.contains(&path.display().to_string()),
        "message should name the file: {msg}"
    );
    (e, msg)
}

fn assert_names(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "message should name {p:?}: {msg}");
    }
}

#[test]
fn bad_magic() {
    let (e, msg) = open_err(b"GGML\x03\0\0\0rest of a file");
    assert!(
        matches!(e, GgufError::BadMagic { found, .. } if &found == b"GGML"),
        "{e}"
    );
    assert_names(&msg, &["GGUF", "not a GGUF file"]);
}

#[test]
fn empty_file_is_truncated_not_a_panic() {
    let (e, msg) = open_err(b"");
    assert!(matches!(e, GgufError::Truncated { offset: 0, .. }), "{e}");
    assert_names(&msg, &["magic", "re-download"]);
}

#[test]
fn unknown_versions() {
    for (version, hint) in [
        (4, "versions 2 and 3"),
        (1, "v1"),
        (0x0300_0000, "big-endian"),
    ] {
        let (e, msg) = open_err(&Raw::header(version, 0, 0).0);
        assert!(matches!(e, GgufError::UnsupportedVersion { version: v, .. } if v == version));
        assert_names(&msg, &[&version.to_string(), hint]);
    }
}

#[test]
fn version_2_and_3_both_read() {
    for version in [2, 3] {
        let mut w = GgufWriter::new();
        w.version(version).kv("k", Value::U32(7));
        w.tensor("t", &[2], GgmlType::F32, vec![0; 8]);
        let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
        assert_eq!((f.version(), f.get_u32("k").unwrap()), (version, 7));
    }
}

#[test]
fn absurd_tensor_count() {
    let (e, msg) = open_err(&Raw::header(3, 1 << 40, 0).0);
    assert!(
        matches!(e, GgufError::AbsurdCount { field: "tensor_count", count, offset: 8, .. } if count == 1 << 40),
        "{e}"
    );
    assert_names(&msg, &["tensor_count", "1099511627776", "offset 8"]);
}

#[test]
fn absurd_kv_count() {
    let mut r = Raw::header(3, 0, u64::MAX);
    r.kv_u32("a", 1);
    let (e, msg) = open_err(&r.0);
    assert!(
        matches!(
            e,
            GgufError::AbsurdCount {
                field: "metadata_kv_count",
                ..
            }
        ),
        "{e}"
    );
    assert_names(
        &msg,
        &["metadata_kv_count", &u64::MAX.to_string(), "offset 16"],
    );
}

#[test]
fn absurd_key_length() {
    let mut r = Raw::header(3, 0, 1);
    r.u64(u64::MAX / 2).bytes(b"general.name");
    let (e, msg) = open_err(&r.0);
    assert!(
        matches!(e, GgufError::AbsurdLength { offset: 24, .. }),
        "{e}"
    );
    assert_names(&msg, &["key of metadata entry #0", "offset 24"]);
}

#[test]
fn absurd_string_value_length() {
    let mut r = Raw::header(3, 0, 1);
    r.str("general.name").u32(8).u64(1 << 50).bytes(b"SmolLM");
    let (e, msg) = open_err(&r.0);
    assert!(
        matches!(e, GgufError::AbsurdLength { len, .. } if len == 1 << 50),
        "{e}"
    );
    assert_names(
        &msg,
        &["'general.name'", "string", "1125899906842624 bytes"],
    );
}

#[test]
fn absurd_array_length() {
    let mut r = Raw::header(3, 0, 1);
    let at = r.str("tokenizer.ggml.tokens").u32(9).u32(8).offset();
    r.u64(u64::MAX / 4).str("a").str("b");
    let (e, msg) = open_err(&r.0);
    assert!(
        matches!(e, GgufError::AbsurdLength { offset, .. } if offset == at),
        "{e}"
    );
    assert_names(
        &msg,
        &[
            "'tokenizer.ggml.tokens'",
            "string items",
            &format!("offset {at}"),
        ],
    );
}

#[test]
fn unknown_value_type() {
    let mut r = Raw::header(3, 0, 1);
    let at = r.str("llama.block_count").offset();
    r.u32(13).u32(30);
    let (e, msg) = open_err(&r.0);
    assert!(matches!(e, GgufError::BadValueType { type_id: 13, offset, .. } if offset == at));
    assert_names(&msg, &["'llama.block_count'", "value type 13"]);
    // Inside an array too.
    let mut r = Raw::header(3, 0, 1);
    r.str("tokenizer.ggml.scores").u32(9).u32(99).u64(1).u32(0);
    let (e, msg) = open_err(&r.0);
    assert!(
        matches!(e, GgufError::BadValueType { type_id: 99, .. }),
        "{e}"
    );
    assert_names(&msg, &["'tokenizer.ggml.scores'"]);
}

#[test]
fn bool_byte_other_than_0_or_1() {
    let mut r = Raw::header(3, 0, 1);
    r.str("tokenizer.ggml.add_bos_token").u32(7).bytes(&[2]);
    let (e, msg) = open_err(&r.0);
    assert!(matches!(e, GgufError::BadBool { byte: 2, .. }), "{e}");
    assert_names(&msg, &["'tokenizer.ggml.add_bos_token'", "bool byte 2"]);
}

#[test]
fn invalid_utf8() {
    let mut r = Raw::header(3, 0, 1);
    r.str("general.name").u32(8).u64(2).bytes(&[0xC3, 0x28]);
    let (e, msg) = open_err(&r.0);
    assert!(matches!(e, GgufError::BadUtf8 { .. }), "{e}");
    assert_names(&msg, &["'general.name'", "UTF-8"]);
}

#[test]
fn duplicate_key() {
    let mut r = Raw::header(3, 0, 2);
    r.kv_u32("llama.block_count", 30)
        .kv_u32("llama.block_count", 31);
    let (e, msg) = open_err(&r.0);
    assert!(
        matches!(e, GgufError::DuplicateKey { offset, .. } if offset > 24),
        "{e}"
    );
    assert_names(&msg, &["'llama.block_count'", "twice"]);
}

#[test]
fn arrays_nested_too_deep() {
    let mut r = Raw::header(3, 0, 1);
    r.str("deep").u32(9);
    for _ in 0..10_000 {
        r.u32(9).u64(1);
    }
    r.u32(4).u64(0);
    let (e, msg) = open_err(&r.0);
    assert!(matches!(e, GgufError::NestingTooDeep { .. }), "{e}");
    assert_names(&msg, &["'deep'", "8 levels"]);
}

#[test]
fn alignment_zero_or_not_a_power_of_two_or_not_an_integer() {
    for (value, problem) in [(0u32, "power of two"), (48, "power of two")] {
        let mut r = Raw::header(3, 0, 1);
        r.kv_u32("general.alignment", value);
        let (e, msg) = open_err(&r.0);
        assert!(matches!(e, GgufError::BadAlignment { .. }), "{e}");
        assert_names(&msg, &["general.alignment", &value.to_string(), problem]);
    }
    let mut r = Raw::header(3, 0, 1);
    r.str("general.alignment").u32(8).str("32");
    let (e, msg) = open_err(&r.0);
    assert!(matches!(e, GgufError::BadAlignment { .. }), "{e}");
    assert_names(&msg, &["general.alignment", "is string, expected uint32"]);
}

/// A file with one tensor info `(name, dims, ty, offset)` and `data_len` bytes of data.
fn one_tensor(name: &str, dims: &[u64], ty: u32, offset: u64, data_len: usize) -> Vec<u8> {
    let mut r = Raw::header(3, 1, 0);
    r.tensor_info(name, dims, ty, offset).pad(32);
    r.0.resize(r.0.len() + data_len, 0);
    r.0
}

#[test]
fn too_many_dims() {
    let (e, msg) = open_err(&one_tensor(
        "blk.0.attn_q.weight",
        &[1, 1, 1, 1, 1],
        0,
        0,
        4,
    ));
    assert!(matches!(e, GgufError::TooManyDims { n_dims: 5, .. }), "{e}");
    assert_names(
        &msg,
        &["'blk.0.attn_q.weight'", "5 dimensions", "at most 4"],
    );
}

#[test]
fn shape_product_overflows() {
    let (e, msg) = open_err(&one_tensor("huge", &[1 << 32, 1 << 32, 2], 0, 0, 0));
    assert!(matches!(e, GgufError::BadShape { .. }), "{e}");
    assert_names(&msg, &["'huge'", "overflows"]);
}

#[test]
fn row_not_a_whole_number_of_blocks() {
    let (e, msg) = open_err(&one_tensor("blk.0.ffn_up.weight", &[33, 2], 3, 0, 60));
    assert!(matches!(e, GgufError::BadShape { .. }), "{e}");
    assert_names(&msg, &["'blk.0.ffn_up.weight'", "Q4_1 block size 32"]);
}

#[test]
fn unknown_ggml_type() {
    for id in [4u32, 31, 1000] {
        let (e, msg) = open_err(&one_tensor("output.weight", &[32], id, 0, 64));
        assert!(matches!(e, GgufError::UnknownGgmlType { type_id, .. } if type_id == id));
        assert_names(&msg, &["'output.weight'", &format!("ggml type id {id}")]);
    }
}

#[test]
fn offset_not_aligned() {
    let (e, msg) = open_err(&one_tensor("token_embd.weight", &[4], 0, 8, 64));
    assert!(
        matches!(
            e,
            GgufError::MisalignedOffset {
                offset: 8,
                alignment: 32,
                ..
            }
        ),
        "{e}"
    );
    assert_names(&msg, &["'token_embd.weight'", "offset 8", "alignment 32"]);
}

#[test]
fn data_past_the_end() {
    // 4 f32 need 16 bytes; 15 are there.
    let (e, msg) = open_err(&one_tensor("output_norm.weight", &[4], 0, 0, 15));
    assert!(
        matches!(e, GgufError::DataOutOfBounds { len: 16, .. }),
        "{e}"
    );
    assert_names(
        &msg,
        &["'output_norm.weight'", "16 bytes", "runs past the end"],
    );
    // An offset that overflows when added to the data start.
    let (e, _) = open_err(&one_tensor("t", &[4], 0, u64::MAX - 31, 16));
    assert!(matches!(e, GgufError::DataOutOfBounds { .. }), "{e}");
}

#[test]
fn duplicate_tensor_names() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor_info("blk.0.attn_norm.weight", &[8], 0, 0);
    let second = r.offset();
    r.tensor_info("blk.0.attn_norm.weight", &[8], 0, 32).pad(32);
    r.0.resize(r.0.len() + 64, 0);
    let (e, msg) = open_err(&r.0);
    assert!(
        matches!(e, GgufError::DuplicateTensor { offset, .. } if offset == second),
        "{e}"
    );
    assert_names(
        &msg,
        &[
            "'blk.0.attn_norm.weight'",
            "twice",
            &format!("offset {second}"),
        ],
    );
}

/// A valid file with metadata of several types and two tensors, the last ending the file.
fn valid_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.alignment(16)
        .kv("general.architecture", Value::String("llama".into()))
        .kv(
            "tokenizer.ggml.tokens",
            Value::Array(oxgen_gguf::Array::String(vec!["a".into(), "b".into()])),
        )
        .kv("llama.rope.freq_base", Value::F32(1e5))
        .kv("b", Value::Bool(true));
    w.tensor("q", &[32, 1], GgmlType::Q8_0, vec![1; 34]);
    w.tensor("n", &[4], GgmlType::F32, vec![0; 16]);
    w.to_bytes()
}

#[test]
fn truncation_anywhere_is_an_error_never_a_panic() {
    let bytes = valid_file();
    assert!(GgufFile::from_bytes(bytes.clone()).is_ok());
    for len in 0..bytes.len() {
        let e = GgufFile::from_bytes(&bytes[..len]).expect_err("a truncated file must fail");
        assert!(
            matches!(
                e,
                GgufError::Truncated { .. }
                    | GgufError::AbsurdCount { .. }
                    | GgufError::AbsurdLength { .. }
                    | GgufError::DataOutOfBounds { .. }
            ),
            "truncated to {len}: {e}"
        );
        assert!(e.to_string().starts_with("<in-memory>: "), "{e}");
    }
}

#[test]
fn corrupting_any_byte_never_panics() {
    let bytes = valid_file();
    for i in 0..bytes.len() {
        for v in [0x00, 0xFF, 0x80, bytes[i] ^ 0x01] {
            let mut b = bytes.clone();
            b[i] = v;
            if let Ok(f) = GgufFile::from_bytes(b) {
                for t in f.tensors() {
                    let _ = f.dequantize(&t.name);
                    let _ = f.matmul_nbits(&t.name);
                    let _ = f.gather_block_quantized(&t.name);
                }
            }
        }
    }
}

#[test]
fn metadata_accessor_errors_name_key_and_found_type() {
    let f = GgufFile::from_bytes(valid_file()).unwrap();
    let e = f.get_u32("general.architecture").unwrap_err();
    assert!(matches!(e, GgufError::WrongType { .. }), "{e}");
    assert_names(
        &e.to_string(),
        &["'general.architecture'", "is string, expected uint32"],
    );
    let e = f.get_i32_array("tokenizer.ggml.tokens").unwrap_err();
    assert_names(
        &e.to_string(),
        &[
            "'tokenizer.ggml.tokens'",
            "is array of string",
            "array of int32",
        ],
    );
    let e = f.get_str("llama.context_length").unwrap_err();
    assert!(matches!(e, GgufError::MissingKey { .. }), "{e}");
    assert_names(&e.to_string(), &["'llama.context_length'", "missing"]);
    let e = f.get_f32("b").unwrap_err();
    assert_names(&e.to_string(), &["'b'", "is bool, expected float32"]);
    let e = f.tensor("output.weight").unwrap_err();
    assert!(matches!(e, GgufError::TensorNotFound { .. }), "{e}");

    let mut w = GgufWriter::new();
    w.kv("n", Value::I64(-1)).kv("big", Value::U64(1 << 40));
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let e = f.get_u32("n").unwrap_err();
    assert!(matches!(e, GgufError::OutOfRange { .. }), "{e}");
    assert_names(&e.to_string(), &["'n'", "-1", "uint32"]);
    assert!(f.get_u32("big").is_err());
    assert_eq!(f.get_u64("big").unwrap(), 1 << 40);
    assert_eq!(f.get_i64("n").unwrap(), -1);
}

#[test]
fn open_names_missing_and_non_regular_files() {
    let e = GgufFile::open(Path::new("/nonexistent/model.gguf")).unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }), "{e}");
    assert_names(&e.to_string(), &["/nonexistent/model.gguf", "open"]);
    let dir = tempfile::tempdir().unwrap();
    let e = GgufFile::open(dir.path()).unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
}
