//! Writer → loader round trips for every dtype, with data inline and in an external file.

use std::path::Path;

use bytes::Bytes;
use oxgen_onnx::proto::tensor_proto::DataLocation;
use oxgen_onnx::writer::{EXTERNAL_ALIGN, attr};
use oxgen_onnx::{Dim, Model, ModelBuilder, load_tensor_file, save_tensor_file};
use oxgen_tensor::{AlignedBuf, DType, Tensor};
use prost::Message;

const DIMS: [usize; 2] = [3, 5];

/// A [3, 5] tensor of `dtype` with distinct bytes (bools 0/1).
fn sample(dtype: DType) -> Tensor {
    let n = dtype.bytes_for(DIMS.iter().product()).unwrap();
    let bytes: Vec<u8> = (0..n)
        .map(|i| {
            if dtype == DType::Bool {
                (i % 2) as u8
            } else {
                (i as u8)
                    .wrapping_mul(37)
                    .wrapping_add(dtype.to_onnx() as u8)
            }
        })
        .collect();
    Tensor::from_buf(dtype, DIMS, AlignedBuf::from_bytes(&bytes)).unwrap()
}

fn builder() -> ModelBuilder {
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 21).opset("com.microsoft", 1);
    b.input(
        "x",
        DType::F32,
        &[Dim::Symbolic("batch".into()), Dim::Fixed(4)],
    );
    b.output("y", DType::F32, &["batch".into(), 4.into()]);
    b.node("Identity", "", "id", &["x"], &["y"], vec![]);
    b.node(
        "Constant",
        "",
        "c",
        &[],
        &["k"],
        vec![attr::tensor(
            "value",
            &Tensor::from_slice([2], &[7i64, -1]).unwrap(),
        )],
    );
    for d in DType::ALL {
        b.initializer(&format!("w_{}", d.name()), sample(d));
    }
    b
}

fn check_all_initializers(model: &Model) {
    let graph = model.graph();
    assert_eq!(graph.initializer.len(), DType::ALL.len());
    for (t, d) in graph.initializer.iter().zip(DType::ALL) {
        let v = model.tensor(t).unwrap();
        let want = sample(d);
        assert_eq!((v.dtype(), v.dims()), (d, &DIMS[..]), "{}", d);
        assert_eq!(v.as_bytes(), want.as_bytes(), "{d}: data differs");
    }
}

fn no_temp_files_left(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            !name.contains(".tmp-"),
            "temporary file left behind: {name}"
        );
    }
}

#[test]
fn inline_round_trip_every_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.onnx");
    builder().save(&path, None).unwrap();
    assert!(!dir.path().join("model.onnx.data").exists());
    no_temp_files_left(dir.path());

    let model = Model::load(&path).unwrap();
    assert_eq!(model.path(), Some(path.as_path()));
    assert_eq!(
        (
            model.opset(""),
            model.opset("ai.onnx"),
            model.opset("com.microsoft")
        ),
        (Some(21), Some(21), Some(1))
    );
    assert_eq!(model.opset("com.other"), None);
    assert_eq!(model.opsets().len(), 2);
    assert!(model.external_files().is_empty());
    check_all_initializers(&model);

    let constant = &model.graph().node[1].attribute[0];
    let k = model.tensor(constant.t.as_ref().unwrap()).unwrap();
    assert_eq!(k.as_slice::<i64>().unwrap(), &[7, -1]);

    // The in-memory builder output decodes the same.
    let bytes = Bytes::from(builder().build().encode_to_vec());
    check_all_initializers(&Model::from_bytes(bytes, None).unwrap());
}

#[test]
fn external_round_trip_every_dtype_borrows_aligned_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.onnx");
    // 8 bytes: the 4-bit tensors (8 bytes) and the rest go external; the Constant stays inline.
    builder().save(&path, Some(8)).unwrap();
    no_temp_files_left(dir.path());
    let data_path = dir.path().join("model.onnx.data");
    assert!(data_path.is_file());

    // Loading the folder finds model.onnx.
    let model = Model::load(dir.path()).unwrap();
    check_all_initializers(&model);
    for t in &model.graph().initializer {
        assert_eq!(
            t.data_location,
            Some(DataLocation::External as i32),
            "{:?}",
            t.name
        );
        assert!(t.raw_data.is_none());
        let offset: usize = t
            .external_data
            .iter()
            .find(|e| e.key.as_deref() == Some("offset"))
            .unwrap()
            .value
            .as_deref()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(offset % EXTERNAL_ALIGN, 0);
        assert!(
            model.tensor(t).unwrap().is_shared(),
            "{:?}: an aligned external tensor must be borrowed",
            t.name
        );
    }

    let files = model.external_files();
    assert_eq!(files.len(), 1);
    let expected: u64 = DType::ALL.iter().map(|d| sample(*d).nbytes() as u64).sum();
    assert_eq!(files[0].bytes_referenced, expected);
    assert_eq!(
        files[0].file_size,
        std::fs::metadata(&data_path).unwrap().len()
    );
    assert_eq!(files[0].path, data_path.canonicalize().unwrap());

    // from_bytes with a base folder resolves the same data.
    let bytes = Bytes::from(std::fs::read(&path).unwrap());
    check_all_initializers(&Model::from_bytes(bytes, Some(dir.path())).unwrap());
}

#[test]
fn threshold_splits_small_and_large_initializers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.onnx");
    let mut b = ModelBuilder::new("t");
    b.initializer("small", Tensor::from_slice([2], &[1.0f32, 2.0]).unwrap());
    b.initializer("big", Tensor::from_slice([100], &[3.0f32; 100]).unwrap());
    b.save(&path, Some(64)).unwrap();
    let model = Model::load(&path).unwrap();
    let [small, big] = &model.graph().initializer[..] else {
        panic!("two initializers")
    };
    assert!(small.raw_data.is_some() && small.external_data.is_empty());
    assert_eq!(big.data_location, Some(DataLocation::External as i32));
    assert_eq!(
        model.tensor(big).unwrap().as_slice::<f32>().unwrap(),
        &[3.0; 100]
    );
    assert_eq!(
        model.tensor(small).unwrap().as_slice::<f32>().unwrap(),
        &[1.0, 2.0]
    );
    assert!(dir.path().join("m.onnx.data").is_file());
}

/// Streaming writes the same files as holding everything until `save`, byte for byte; a
/// streaming builder dropped unsaved leaves nothing, and one saved elsewhere is refused.
#[test]
fn streamed_initializers_give_the_files_a_held_save_gives() {
    let dir = tempfile::tempdir().unwrap();
    let fill = |b: &mut ModelBuilder| {
        for d in DType::ALL {
            b.initializer(d.name(), sample(d));
        }
        b.initializer("small", Tensor::from_slice([2], &[1.0f32, 2.0]).unwrap());
        b.node("Identity", "", "n", &["small"], &["y"], vec![]);
    };
    let (held, streamed) = (dir.path().join("held"), dir.path().join("streamed"));
    for d in [&held, &streamed] {
        std::fs::create_dir(d).unwrap();
    }
    let mut b = ModelBuilder::new("t");
    fill(&mut b);
    b.save(&held.join("m.onnx"), Some(16)).unwrap();
    let mut b = ModelBuilder::new("t");
    b.stream_external_data(&streamed.join("m.onnx"), 16)
        .unwrap();
    fill(&mut b);
    // The data is written under a temporary name until the save renames it.
    assert!(!streamed.join("m.onnx.data").exists());
    b.save(&streamed.join("m.onnx"), Some(16)).unwrap();
    for f in ["m.onnx", "m.onnx.data"] {
        assert_eq!(
            std::fs::read(held.join(f)).unwrap(),
            std::fs::read(streamed.join(f)).unwrap(),
            "{f}"
        );
    }
    no_temp_files_left(&streamed);

    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let mut b = ModelBuilder::new("t");
    b.stream_external_data(&other.join("m.onnx"), 16).unwrap();
    fill(&mut b);
    let e = b.save(&other.join("n.onnx"), None).unwrap_err().to_string();
    assert!(e.contains("streamed for"), "{e}");
    drop(b);
    assert_eq!(std::fs::read_dir(&other).unwrap().count(), 0, "files left");
}

#[test]
fn tensor_files_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    for d in DType::ALL {
        let path = dir.path().join(format!("{}.pb", d.name()));
        save_tensor_file(&path, "input_0", &sample(d)).unwrap();
        let (name, t) = load_tensor_file(&path).unwrap();
        assert_eq!(name, "input_0");
        assert_eq!(
            (t.dtype(), t.dims(), t.as_bytes()),
            (d, &DIMS[..], sample(d).as_bytes())
        );
    }
    no_temp_files_left(dir.path());
}

#[test]
fn failed_save_leaves_no_temporary_files() {
    let dir = tempfile::tempdir().unwrap();
    // The target is a non-empty folder, so renaming the model onto it fails.
    let path = dir.path().join("model.onnx");
    std::fs::create_dir(&path).unwrap();
    std::fs::write(path.join("keep"), b"x").unwrap();
    let e = builder().save(&path, None).unwrap_err();
    assert!(matches!(e, oxgen_onnx::OnnxError::Io { .. }), "{e}");
    assert!(e.to_string().contains("model.onnx"), "{e}");
    no_temp_files_left(dir.path());
}

#[test]
fn model_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Model>();
}
