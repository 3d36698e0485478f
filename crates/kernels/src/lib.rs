//! oxgen-kernels: CPU kernels over plain slices, and the thread pool they run on.
//!
//! Every kernel family has a portable scalar reference; optimized versions (SIMD, packed
//! weights) sit beside it and are tested against it. Kernels take slices and dimensions,
//! never tensors or graph nodes. [`cpu`] detects the CPU's features once and decides for
//! every family whether a SIMD path may run (`OXGEN_ISA=scalar|avx2|avx512` caps it).
//!
//! Layout: a family with several files (reference, packing, one file per ISA) is a folder;
//! a small family is one file.
//! - [`nbits`]: `MatMulNBits`, f32 and int8-activation references, packed weights, x86 tiles;
//! - [`attention`]: grouped-query attention, contiguous and paged, AVX2 and AVX-512 rows;
//! - [`moe`]: mixture of experts (routing, experts grouped by token, over f32 or
//!   [`nbits`] expert matrices);
//! - [`matmul`], [`norm`], [`softmax`], [`reduce`], [`rotary`], [`quant`], [`sigmoid`]
//!   (with the gated SiLU): one file each;
//! - data movement: [`layout`] (Slice, Expand, Tile, Concat, Split, Trilu, Range),
//!   [`broadcast`], [`gather`], [`transpose`];
//! - support: [`error`] (the crate's [`KernelError`]), [`cpu`], [`acc`] and [`num`] (element
//!   types), [`pool`] and [`par`] (threads), [`mem`] (memory hints).
//!
//! This crate must never know about ONNX, protobufs or graphs.

pub mod acc;
pub mod attention;
pub mod broadcast;
pub mod cpu;
pub mod erf;
pub mod error;
pub mod gather;
pub mod int8;
pub mod integer;
pub mod layout;
pub mod matmul;
mod matmul_f32;
pub mod mem;
pub mod moe;
pub mod mxfp4;
pub mod nbits;
pub mod norm;
pub mod num;
pub mod par;
pub mod pool;
pub mod quant;
pub mod reduce;
pub mod rng;
mod room;
pub mod rotary;
pub mod sigmoid;
mod simd;
pub mod softmax;
pub mod transpose;

pub use error::KernelError;
pub use num::{Float, Scalar};
pub use pool::ThreadPool;
