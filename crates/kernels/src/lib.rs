//! oxgen-kernels: CPU kernels over plain slices, and the thread pool they run on.
//!
//! Every kernel family has a portable scalar reference here; optimized versions (SIMD,
//! packed weights) are added beside them and tested against the reference. Kernels take
//! slices and dimensions, never tensors or graph nodes.
//!
//! This crate must never know about ONNX, protobufs or graphs.

pub mod acc;
pub mod activation;
pub mod attention;
pub mod attention_avx2;
pub mod attention_paged;
pub mod broadcast;
pub mod gather;
pub mod layout;
pub mod matmul;
pub mod matmul_nbits;
pub mod matmul_nbits_int8;
pub mod mem;
pub mod nbits_avx2;
pub mod nbits_packed;
mod nbits_tiles;
pub mod norm;
pub mod num;
pub mod par;
pub mod pool;
pub mod quant;
pub mod reduce;
pub mod rotary;
pub mod softmax;
pub mod transpose;

pub use num::{Float, Scalar};
pub use pool::ThreadPool;
