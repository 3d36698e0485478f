//! oxgen-testkit: test support shared by the crates' test suites.
//!
//! - [`node_tests`]: runs one case of the official ONNX backend node tests (`model.onnx` plus
//!   `test_data_set_*/{input,output}_N.pb`) on a [`oxgen_runtime::Session`] and compares the
//!   outputs at the ONNX runner's tolerances.
//! - [`fixtures`]: small random-weight language-model packages shaped like onnxruntime-genai's.
//! - [`optimum`]: the same kind of model as optimum exports it (standard ops only, KV grown by
//!   `Concat`), for the graph passes and package detection.
//! - [`compare`]: element-wise comparison with `rtol`/`atol` for every dtype.
//! - [`ort_oracle`]: the same model through onnxruntime (Python wheel), for oracle tests.
//!
//! This crate is a dev-dependency only: no product crate may depend on it.

pub mod compare;
pub mod fixtures;
pub mod node_tests;
pub mod optimum;
pub mod ort_oracle;
