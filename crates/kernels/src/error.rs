//! The crate's error type, [`KernelError`], and the checks that build it.
//!
//! Contract: callers pass dimensions they have validated against the ONNX spec; every kernel
//! still checks each length and offset it touches and returns a [`KernelError`] instead of
//! panicking, so a wrong caller cannot read or write out of bounds. Callers wrap it with the
//! node and op it came from.

/// Why a kernel refused its arguments.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    #[error("{what} holds {actual} elements, expected {expected}")]
    Length {
        what: &'static str,
        expected: usize,
        actual: usize,
    },
    #[error("index {index} is out of range for axis {axis} of size {dim} (valid: -{dim}..{dim})")]
    Index { index: i64, axis: usize, dim: usize },
    #[error("{0}")]
    Shape(String),
}

/// Checks `slice.len() == expected`.
pub(crate) fn check_len(
    what: &'static str,
    actual: usize,
    expected: usize,
) -> Result<(), KernelError> {
    if actual == expected {
        Ok(())
    } else {
        Err(KernelError::Length {
            what,
            expected,
            actual,
        })
    }
}

/// The element count of `dims`, or an error when it overflows.
pub(crate) fn numel(dims: &[usize]) -> Result<usize, KernelError> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| KernelError::Shape(format!("shape {dims:?} overflows")))
}
