//! What the operator-against-onnxruntime tests share: tolerances, tensors from floats, a
//! [`Batch`] of independent cases in one model run by both backends, and the native
//! loader's error for a one-node model. Each test binary uses part of it.
#![allow(dead_code)]

use std::path::Path;

use oxgen_onnx::writer::{Dim, ModelBuilder};
use oxgen_tensor::{DType, Tensor, f16};
use oxgen_testkit::compare::{Tolerance, mismatch};

pub const F32_MATMUL: Tolerance = Tolerance {
    rtol: 1e-5,
    atol: 1e-5,
};
pub const F32_NORM: Tolerance = Tolerance {
    rtol: 1e-5,
    atol: 1e-6,
};
pub const F16: Tolerance = Tolerance {
    rtol: 1e-3,
    atol: 1e-4,
};
pub const EXACT: Tolerance = Tolerance {
    rtol: 0.0,
    atol: 0.0,
};

/// Float values as a tensor of `dtype` (f32 or f16).
pub fn float_tensor(dims: &[usize], values: &[f32], dtype: DType) -> Tensor {
    match dtype {
        DType::F16 => {
            let h: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
            Tensor::from_slice(dims, &h).unwrap()
        }
        _ => Tensor::from_slice(dims, values).unwrap(),
    }
}

pub fn fixed(dims: &[usize]) -> Vec<Dim> {
    dims.iter().map(|&d| Dim::Fixed(d)).collect()
}

pub fn as_f64(t: &Tensor) -> Vec<f64> {
    match t.dtype() {
        DType::F16 => t
            .as_slice::<f16>()
            .unwrap()
            .iter()
            .map(|v| v.to_f64())
            .collect(),
        DType::F32 => t
            .as_slice::<f32>()
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        other => panic!("no float view of {other}"),
    }
}

/// One model of independent cases, run by onnxruntime and natively.
pub struct Batch {
    pub builder: ModelBuilder,
    inputs: Vec<(String, Tensor)>,
    /// Per graph output: the case label and its tolerance.
    checks: Vec<(String, Tolerance)>,
}

impl Batch {
    pub fn new() -> Batch {
        let mut builder = ModelBuilder::new("oxgen-test");
        builder.opset("", 21).opset("com.microsoft", 1);
        Batch {
            builder,
            inputs: Vec::new(),
            checks: Vec::new(),
        }
    }

    pub fn input(&mut self, name: &str, t: Tensor) {
        self.builder.input(name, t.dtype(), &fixed(t.dims()));
        self.inputs.push((name.to_string(), t));
    }

    pub fn init(&mut self, name: &str, t: Tensor) {
        self.builder.initializer(name, t);
    }

    pub fn output(
        &mut self,
        name: &str,
        dtype: DType,
        dims: &[usize],
        case: String,
        tol: Tolerance,
    ) {
        self.builder.output(name, dtype, &fixed(dims));
        self.checks.push((case, tol));
    }

    /// Runs both backends, asserts every output within its tolerance and returns the largest
    /// absolute difference seen.
    pub fn run(self, what: &str) -> f64 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.onnx");
        self.builder.save(&path, None).unwrap();
        let ort = oxgen_testkit::ort_oracle::run(&path, &self.inputs).unwrap();
        let mut native = oxgen_testkit::node_tests::native_session(&path).unwrap();
        let ours = native.run(self.inputs).unwrap();
        assert_eq!(ort.len(), self.checks.len());
        assert_eq!(ours.len(), self.checks.len());
        let mut failures = Vec::new();
        let (mut worst, mut margin) = (0f64, 0f64);
        for (((case, tol), (_, got)), want) in self.checks.iter().zip(&ours).zip(&ort) {
            if let Some(why) = mismatch(got, want, *tol) {
                failures.push(format!("{case}: {why}"));
            } else if got.dtype().is_float() {
                for (g, w) in as_f64(got).iter().zip(as_f64(want)) {
                    worst = worst.max((g - w).abs());
                    margin =
                        margin.max((g - w).abs() / (tol.atol + tol.rtol * w.abs()).max(1e-300));
                }
            }
        }
        assert!(failures.is_empty(), "{what}:\n{}", failures.join("\n"));
        eprintln!(
            "{what}: {} outputs agree; max abs diff {worst:e}, max diff / tolerance {margin:.3}",
            self.checks.len()
        );
        worst
    }
}

/// The native loader's error for a one-node model.
pub fn load_error(build: impl FnOnce(&mut ModelBuilder)) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.onnx");
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 21).opset("com.microsoft", 1);
    build(&mut b);
    b.save(&path, None).unwrap();
    match oxgen_testkit::node_tests::native_session(Path::new(&path)) {
        Ok(_) => panic!("the model loaded"),
        Err(e) => e,
    }
}
