//! The onnxruntime oracle itself works: a small graph gives the same answer both ways.

use oxgen_onnx::writer::{Dim, ModelBuilder};
use oxgen_tensor::{DType, Tensor};
use oxgen_testkit::compare::{Tolerance, mismatch};

#[test]
fn onnxruntime_and_native_agree_on_a_small_graph() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 21);
    b.input("a", DType::F32, &[Dim::Fixed(2), Dim::Fixed(3)]);
    b.input("b", DType::F32, &[Dim::Fixed(3), Dim::Fixed(4)]);
    b.node("MatMul", "", "mm", &["a", "b"], &["c"], vec![]);
    b.node("Softmax", "", "sm", &["c"], &["y"], vec![]);
    b.output("y", DType::F32, &[Dim::Fixed(2), Dim::Fixed(4)]);
    let path = dir.path().join("m.onnx");
    b.save(&path, None).unwrap();
    let a = Tensor::from_slice([2, 3], &[0.1f32, -0.2, 0.3, 0.4, 0.5, -0.6]).unwrap();
    let w =
        Tensor::from_slice([3, 4], &(0..12).map(|i| i as f32 / 7.0).collect::<Vec<_>>()).unwrap();
    let inputs = vec![("a".to_string(), a), ("b".to_string(), w)];
    let ort = oxgen_testkit::ort_oracle::run(&path, &inputs).unwrap();
    let mut native = oxgen_testkit::node_tests::native_session(&path).unwrap();
    let ours = native.run(inputs).unwrap();
    assert_eq!(ort.len(), 1);
    assert_eq!(
        mismatch(
            &ours[0].1,
            &ort[0],
            Tolerance {
                rtol: 1e-6,
                atol: 1e-7
            }
        ),
        None
    );
}
