//! oxgen-ort: the backend seam over ONNX Runtime.
//!
//! ONNX Runtime is loaded at run time (the `ort` crate's `load-dynamic`), so nothing is
//! downloaded at build time: the shared library is the one the PyPI `onnxruntime` wheel ships
//! (`onnxruntime/capi/libonnxruntime.so*`), found from an explicit path, then
//! `ORT_DYLIB_PATH`, then by asking Python where the `onnxruntime` package is.
//!
//! [`OrtSession`] runs named tensors ([`oxgen_runtime::Session`]); [`OrtLm`] steps a language
//! model ([`oxgen_runtime::LanguageModel`]) with each sequence's KV bound through I/O binding:
//! for `GroupQueryAttention` graphs past and present share one buffer sized to the context
//! (nothing copied per step), for concatenating graphs each step's present becomes the next
//! step's past without a copy.

mod lm;
mod locate;
mod session;

pub use lm::{OrtLm, OrtOptions};
pub use locate::locate_library;
pub use session::OrtSession;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ort::value::{DynTensor, TensorElementType};
use oxgen_runtime::RuntimeError;
use oxgen_tensor::{DType, Tensor};

/// Errors of the ONNX Runtime backend.
#[derive(Debug, thiserror::Error)]
pub enum OrtError {
    #[error(
        "ONNX Runtime's shared library was not found ({looked}); install the onnxruntime wheel \
         (python3 -m pip install onnxruntime) or give its libonnxruntime.so with --ort-lib \
         PATH or ORT_DYLIB_PATH"
    )]
    NotFound { looked: String },
    #[error(
        "loading ONNX Runtime from {path}: {reason} (oxgen needs onnxruntime 1.31 or newer \
         (API 31); pip install -U onnxruntime)"
    )]
    Load { path: String, reason: String },
    #[error("ONNX Runtime: {0}")]
    Ort(String),
}

impl From<ort::Error> for OrtError {
    fn from(e: ort::Error) -> Self {
        OrtError::Ort(e.to_string())
    }
}

impl From<OrtError> for RuntimeError {
    fn from(e: OrtError) -> Self {
        RuntimeError::Backend(Box::new(e))
    }
}

/// The process's one ONNX Runtime environment, loaded from the first library asked for.
/// The process's one ONNX Runtime environment and the library it came from (or why that
/// library did not load).
static ENVIRONMENT: OnceLock<(PathBuf, Result<ort::environment::Environment, String>)> =
    OnceLock::new();

/// Serializes the first load (two sessions opened at once must not both load the library).
static LOADING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Loads ONNX Runtime (once per process: the first library found is the one used; a lookup
/// that found nothing may be retried) and returns its environment and the library path.
pub fn environment(
    lib: Option<&Path>,
) -> Result<(&'static Path, &'static ort::environment::Environment), OrtError> {
    if ENVIRONMENT.get().is_none() {
        let _loading = LOADING.lock().unwrap_or_else(|e| e.into_inner());
        if ENVIRONMENT.get().is_none() {
            let path = locate_library(lib)?;
            let loaded = ort::init_from(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| b.with_name("oxgen").build().map_err(|e| e.to_string()));
            let _ = ENVIRONMENT.set((path, loaded));
        }
    }
    let (path, loaded) = ENVIRONMENT.get().expect("set above");
    match loaded {
        Ok(env) => Ok((path.as_path(), env)),
        Err(reason) => Err(OrtError::Load {
            path: path.display().to_string(),
            reason: reason.clone(),
        }),
    }
}

/// The ONNX Runtime element type of a dtype.
fn element_type(dtype: DType) -> TensorElementType {
    match dtype {
        DType::F32 => TensorElementType::Float32,
        DType::F64 => TensorElementType::Float64,
        DType::F16 => TensorElementType::Float16,
        DType::BF16 => TensorElementType::Bfloat16,
        DType::I64 => TensorElementType::Int64,
        DType::I32 => TensorElementType::Int32,
        DType::I16 => TensorElementType::Int16,
        DType::I8 => TensorElementType::Int8,
        DType::U64 => TensorElementType::Uint64,
        DType::U32 => TensorElementType::Uint32,
        DType::U16 => TensorElementType::Uint16,
        DType::U8 => TensorElementType::Uint8,
        DType::Bool => TensorElementType::Bool,
        // Both pack two values per byte, the first in the low nibble.
        DType::U4 => TensorElementType::Uint4,
        DType::I4 => TensorElementType::Int4,
        DType::F8E8M0 => TensorElementType::Float8E8M0,
    }
}

fn dtype_of(ty: TensorElementType) -> Option<DType> {
    Some(match ty {
        TensorElementType::Float32 => DType::F32,
        TensorElementType::Float64 => DType::F64,
        TensorElementType::Float16 => DType::F16,
        TensorElementType::Bfloat16 => DType::BF16,
        TensorElementType::Int64 => DType::I64,
        TensorElementType::Int32 => DType::I32,
        TensorElementType::Int16 => DType::I16,
        TensorElementType::Int8 => DType::I8,
        TensorElementType::Uint64 => DType::U64,
        TensorElementType::Uint32 => DType::U32,
        TensorElementType::Uint16 => DType::U16,
        TensorElementType::Uint8 => DType::U8,
        TensorElementType::Bool => DType::Bool,
        TensorElementType::Uint4 => DType::U4,
        TensorElementType::Int4 => DType::I4,
        TensorElementType::Float8E8M0 => DType::F8E8M0,
        _ => return None,
    })
}

/// A new ONNX Runtime tensor holding a copy of `t`.
fn to_ort(allocator: &ort::memory::Allocator, t: &Tensor) -> Result<DynTensor, OrtError> {
    let dims: Vec<i64> = t.dims().iter().map(|&d| d as i64).collect();
    let mut value = DynTensor::new(allocator, element_type(t.dtype()), dims)?;
    let bytes = t.as_bytes();
    if !bytes.is_empty() {
        // SAFETY: the tensor was just allocated with `t`'s dtype and shape, so it holds exactly
        // `bytes.len()` bytes, and nothing else refers to it yet.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                value.data_ptr_mut().cast::<u8>(),
                bytes.len(),
            );
        }
    }
    Ok(value)
}

/// An output value as a tensor.
fn into_tensor(value: ort::value::DynValue) -> Result<DynTensor, OrtError> {
    value
        .downcast::<ort::value::DynTensorValueType>()
        .map_err(|e| OrtError::Ort(format!("an output is not a tensor: {e}")))
}

/// The dtype, dims and bytes of an ONNX Runtime tensor on the CPU.
fn ort_bytes(tensor: &DynTensor) -> Result<(DType, Vec<usize>, &[u8]), OrtError> {
    let ty = *tensor.data_type();
    let dtype = dtype_of(ty)
        .ok_or_else(|| OrtError::Ort(format!("outputs of type {ty:?} are not supported")))?;
    let dims: Vec<usize> = tensor.shape().iter().map(|&d| d.max(0) as usize).collect();
    let len = (dims.iter().product::<usize>() * dtype.bits()).div_ceil(8);
    let bytes = if len == 0 {
        &[][..]
    } else {
        // SAFETY: a CPU tensor of this shape and type holds `len` contiguous bytes, alive as
        // long as `tensor` is borrowed.
        unsafe { std::slice::from_raw_parts(tensor.data_ptr().cast::<u8>(), len) }
    };
    Ok((dtype, dims, bytes))
}

/// A copy of an ONNX Runtime tensor.
fn from_ort(tensor: &DynTensor) -> Result<Tensor, OrtError> {
    let (dtype, dims, bytes) = ort_bytes(tensor)?;
    Tensor::from_buf(dtype, dims, oxgen_tensor::AlignedBuf::from_bytes(bytes))
        .map_err(|e| OrtError::Ort(e.to_string()))
}
