//! oxgen-tensor: the element types, shapes and tensors every other oxgen crate speaks.
//!
//! A [`Tensor`] is a dtype, a [`Shape`] and a byte buffer that is either owned (64-byte
//! aligned, mutable) or shared ([`bytes::Bytes`], e.g. a slice of a memory-mapped model file,
//! immutable and cheap to clone). Typed views check the dtype and the alignment.
//!
//! This crate must never do I/O, spawn threads or know about ONNX protobufs: it is the L0
//! vocabulary, nothing more.

mod buffer;
mod dtype;
mod shape;
mod tensor;

pub use buffer::AlignedBuf;
pub use dtype::{DType, Element};
pub use shape::{Dim, Shape, checked_numel};
pub use tensor::Tensor;

pub use half::{bf16, f16};

/// Errors from building or viewing a tensor.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TensorError {
    #[error("tensor holds {actual} but {expected} was requested")]
    DTypeMismatch { expected: DType, actual: DType },
    #[error(
        "shape {shape:?} has {numel} elements of {dtype} = {expected} bytes, but the data has {actual} bytes"
    )]
    SizeMismatch {
        shape: Vec<usize>,
        dtype: DType,
        numel: usize,
        expected: usize,
        actual: usize,
    },
    #[error("shape {0:?} overflows: the element count does not fit in usize")]
    Overflow(Vec<usize>),
    #[error("cannot reshape {from:?} ({from_numel} elements) to {to:?} ({to_numel} elements)")]
    Reshape {
        from: Vec<usize>,
        from_numel: usize,
        to: Vec<usize>,
        to_numel: usize,
    },
}
