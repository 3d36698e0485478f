//! One crafted file per way a model can be bad (DESIGN.md §5.3). Each test checks the error
//! variant and that the message names the file and the tensor.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use oxgen_onnx::proto::tensor_proto::DataLocation;
use oxgen_onnx::proto::{ModelProto, OperatorSetIdProto, StringStringEntryProto, TensorProto};
use oxgen_onnx::{Model, ModelBuilder, OnnxError};
use oxgen_tensor::Tensor;
use prost::Message;

/// A model with one initializer `w` (float32 [4]); `edit` changes it before saving.
fn model_with(dir: &Path, edit: impl FnOnce(&mut TensorProto)) -> PathBuf {
    let mut b = ModelBuilder::new("bad");
    b.initializer(
        "w",
        Tensor::from_slice([4], &[1.0f32, 2.0, 3.0, 4.0]).unwrap(),
    );
    let mut proto = b.build();
    edit(&mut proto.graph.as_mut().unwrap().initializer[0]);
    write_model(dir, &proto)
}

fn write_model(dir: &Path, proto: &ModelProto) -> PathBuf {
    let path = dir.join("model.onnx");
    std::fs::write(&path, proto.encode_to_vec()).unwrap();
    path
}

/// Points `w` at external data with the given entries.
fn external(t: &mut TensorProto, entries: &[(&str, &str)]) {
    t.raw_data = None;
    t.data_location = Some(DataLocation::External as i32);
    t.external_data = entries
        .iter()
        .map(|(k, v)| StringStringEntryProto {
            key: Some(k.to_string()),
            value: Some(v.to_string()),
        })
        .collect();
}

/// 16 bytes of data: exactly what `w` needs.
fn data_file(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, [0u8; 16]).unwrap();
    path
}

fn load_err(path: &Path) -> OnnxError {
    Model::load(path).expect_err("the model must be rejected")
}

fn assert_names(e: &OnnxError, parts: &[&str]) {
    let msg = e.to_string();
    for p in parts {
        assert!(msg.contains(p), "message should name {p:?}: {msg}");
    }
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn parent_dir_location() {
    let d = tmp();
    let model_dir = d.path().join("m");
    std::fs::create_dir(&model_dir).unwrap();
    data_file(d.path(), "w.data");
    let path = model_with(&model_dir, |t| external(t, &[("location", "../w.data")]));
    let e = load_err(&path);
    assert!(matches!(e, OnnxError::ExternalPath { .. }), "{e}");
    assert_names(&e, &[&path.display().to_string(), "'w'", "..", "../w.data"]);
}

#[test]
fn absolute_location() {
    let d = tmp();
    let abs = data_file(d.path(), "w.data");
    let path = model_with(d.path(), |t| {
        external(t, &[("location", abs.to_str().unwrap())])
    });
    let e = load_err(&path);
    assert!(matches!(e, OnnxError::ExternalPath { .. }), "{e}");
    assert_names(&e, &[&path.display().to_string(), "'w'", "absolute"]);
}

#[test]
fn symlink_out_of_the_folder() {
    let d = tmp();
    let model_dir = d.path().join("m");
    std::fs::create_dir(&model_dir).unwrap();
    let outside = data_file(d.path(), "secret.data");
    std::os::unix::fs::symlink(&outside, model_dir.join("w.data")).unwrap();
    let path = model_with(&model_dir, |t| external(t, &[("location", "w.data")]));
    let e = load_err(&path);
    assert!(matches!(e, OnnxError::ExternalPath { .. }), "{e}");
    assert_names(
        &e,
        &[
            &path.display().to_string(),
            "'w'",
            "outside the model folder",
        ],
    );

    // A link that stays inside the folder is fine.
    std::fs::remove_file(model_dir.join("w.data")).unwrap();
    data_file(&model_dir, "real.data");
    std::os::unix::fs::symlink(model_dir.join("real.data"), model_dir.join("w.data")).unwrap();
    Model::load(&path).unwrap();
}

#[test]
fn range_past_end_of_file() {
    let d = tmp();
    let data = data_file(d.path(), "w.data");
    let path = model_with(d.path(), |t| {
        external(
            t,
            &[("location", "w.data"), ("offset", "8"), ("length", "16")],
        )
    });
    let e = load_err(&path);
    assert!(
        matches!(
            e,
            OnnxError::ExternalRange {
                offset: 8,
                length: 16,
                file_size: 16,
                ..
            }
        ),
        "{e}"
    );
    assert_names(&e, &["w.data", "'w'"]);
    assert_eq!(
        e.file().canonicalize().unwrap(),
        data.canonicalize().unwrap()
    );
}

#[test]
fn offset_overflow() {
    let d = tmp();
    data_file(d.path(), "w.data");
    let huge = u64::MAX.to_string();
    let path = model_with(d.path(), |t| {
        external(
            t,
            &[("location", "w.data"), ("offset", &huge), ("length", "16")],
        )
    });
    let e = load_err(&path);
    assert!(
        matches!(
            e,
            OnnxError::ExternalRange {
                offset: u64::MAX,
                ..
            }
        ),
        "{e}"
    );
    assert_names(&e, &["w.data", "'w'"]);
}

#[test]
fn length_mismatch() {
    let d = tmp();
    data_file(d.path(), "w.data");
    let path = model_with(d.path(), |t| {
        external(t, &[("location", "w.data"), ("length", "12")])
    });
    let e = load_err(&path);
    assert!(
        matches!(
            e,
            OnnxError::ExternalLength {
                length: 12,
                expected: 16,
                ..
            }
        ),
        "{e}"
    );
    assert_names(&e, &["w.data", "'w'", "float32"]);
}

#[test]
fn missing_data_file() {
    let d = tmp();
    let path = model_with(d.path(), |t| external(t, &[("location", "gone.data")]));
    let e = load_err(&path);
    assert!(matches!(e, OnnxError::MissingDataFile { .. }), "{e}");
    assert_names(&e, &["gone.data", "'w'"]);
}

#[test]
fn truncated_protobuf() {
    let d = tmp();
    let mut b = ModelBuilder::new("bad");
    b.initializer("w", Tensor::from_slice([256], &[0.5f32; 256]).unwrap());
    let bytes = b.build().encode_to_vec();
    let path = d.path().join("model.onnx");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let e = load_err(&path);
    assert!(
        matches!(
            e,
            OnnxError::Decode {
                message: "ModelProto",
                ..
            }
        ),
        "{e}"
    );
    assert_names(&e, &[&path.display().to_string(), "truncated"]);
}

#[test]
fn garbage_bytes() {
    let d = tmp();
    let path = d.path().join("model.onnx");
    // Field 1 with wire type 7, which does not exist.
    std::fs::write(&path, [0x0f, 0xff, 0xff, 0xff, 0x13, 0x37]).unwrap();
    let e = load_err(&path);
    assert!(matches!(e, OnnxError::Decode { .. }), "{e}");
    assert_names(&e, &[&path.display().to_string()]);
}

#[test]
fn negative_dim() {
    let d = tmp();
    let path = model_with(d.path(), |t| t.dims = vec![-4]);
    let model = Model::load(&path).unwrap();
    let e = model.tensor(&model.graph().initializer[0]).unwrap_err();
    assert!(matches!(e, OnnxError::BadDims { .. }), "{e}");
    assert_names(&e, &[&path.display().to_string(), "'w'", "negative"]);

    // External tensors are checked at load.
    data_file(d.path(), "w.data");
    let path = model_with(d.path(), |t| {
        external(t, &[("location", "w.data")]);
        t.dims = vec![-4];
    });
    assert!(matches!(load_err(&path), OnnxError::BadDims { .. }));
}

#[test]
fn absurd_dims() {
    let d = tmp();
    let path = model_with(d.path(), |t| t.dims = vec![1 << 40, 1 << 40]);
    let model = Model::load(&path).unwrap();
    let e = model.tensor(&model.graph().initializer[0]).unwrap_err();
    assert!(matches!(e, OnnxError::BadDims { .. }), "{e}");
    assert_names(&e, &[&path.display().to_string(), "'w'"]);

    // Large but not overflowing: caught by the data size, before anything is allocated.
    let path = model_with(d.path(), |t| t.dims = vec![1 << 50]);
    let model = Model::load(&path).unwrap();
    let e = model.tensor(&model.graph().initializer[0]).unwrap_err();
    assert!(
        matches!(
            e,
            OnnxError::DataCount {
                field: "raw_data",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn typed_field_count_mismatch() {
    let d = tmp();
    let path = model_with(d.path(), |t| {
        t.raw_data = None;
        t.float_data = vec![1.0, 2.0, 3.0];
    });
    let model = Model::load(&path).unwrap();
    let e = model.tensor(&model.graph().initializer[0]).unwrap_err();
    assert!(
        matches!(
            e,
            OnnxError::DataCount {
                field: "float_data",
                expected: 4,
                actual: 3,
                ..
            }
        ),
        "{e}"
    );
    assert_names(&e, &[&path.display().to_string(), "'w'", "float_data"]);
}

#[test]
fn unsupported_dtype() {
    let d = tmp();
    let path = model_with(d.path(), |t| {
        t.raw_data = None;
        t.data_type = Some(8);
        t.string_data = vec![Bytes::from_static(b"a"); 4];
    });
    let model = Model::load(&path).unwrap();
    let e = model.tensor(&model.graph().initializer[0]).unwrap_err();
    assert!(
        matches!(e, OnnxError::UnsupportedDType { code: 8, .. }),
        "{e}"
    );
    assert_names(&e, &[&path.display().to_string(), "'w'", "STRING"]);
}

#[test]
fn missing_graph() {
    let d = tmp();
    let proto = ModelProto {
        ir_version: Some(10),
        ..Default::default()
    };
    let path = write_model(d.path(), &proto);
    let e = load_err(&path);
    assert!(matches!(e, OnnxError::MissingGraph { .. }), "{e}");
    assert_names(&e, &[&path.display().to_string(), "no graph"]);
}

#[test]
fn conflicting_opsets() {
    let d = tmp();
    let mut proto = ModelBuilder::new("bad").build();
    proto.opset_import.push(OperatorSetIdProto {
        domain: Some("ai.onnx".into()),
        version: Some(13),
    });
    let path = write_model(d.path(), &proto);
    let e = load_err(&path);
    assert!(matches!(e, OnnxError::Malformed { .. }), "{e}");
    assert_names(&e, &[&path.display().to_string(), "opset_import"]);
}

#[test]
fn folder_without_a_single_model() {
    let d = tmp();
    assert!(matches!(
        load_err(d.path()),
        OnnxError::ModelNotFound { .. }
    ));
    let proto = ModelBuilder::new("x").build().encode_to_vec();
    std::fs::write(d.path().join("a.onnx"), &proto).unwrap();
    Model::load(d.path()).unwrap();
    std::fs::write(d.path().join("b.onnx"), &proto).unwrap();
    let e = load_err(d.path());
    assert!(matches!(e, OnnxError::ModelNotFound { .. }), "{e}");
    assert_names(&e, &["a.onnx", "b.onnx"]);
}

#[test]
fn external_data_without_a_folder() {
    let d = tmp();
    data_file(d.path(), "w.data");
    let path = model_with(d.path(), |t| external(t, &[("location", "w.data")]));
    let bytes = Bytes::from(std::fs::read(&path).unwrap());
    let e = Model::from_bytes(bytes.clone(), None).unwrap_err();
    assert!(
        matches!(
            e,
            OnnxError::BadTensor {
                field: "external_data",
                ..
            }
        ),
        "{e}"
    );
    assert_names(&e, &["<in-memory>", "'w'", "base_dir"]);
    Model::from_bytes(bytes, Some(d.path())).unwrap();
}
