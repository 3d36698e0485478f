//! The one error type of `oxgen-onnx`.
//!
//! Every variant names the file it concerns and, where there is one, the tensor and the
//! protobuf field, so a message reads "model.onnx: tensor 'w': external data offset 4096 +
//! length 64 runs past the end of model.onnx.data (1024 bytes)". Messages end with what to
//! do about it. Tensors decoded without a file (a `TensorProto` built in memory) show
//! `<in-memory>` where the file would be.

use std::path::{Path, PathBuf};

use oxgen_tensor::DType;

/// Errors from loading, decoding or writing ONNX files.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    /// A file or folder could not be opened, mapped, read or written.
    #[error("{}: cannot {action}: {source}", show(file))]
    Io {
        file: PathBuf,
        /// What was being attempted ("open", "memory-map", "write", ...).
        action: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// The bytes are not a valid protobuf message of the expected type.
    #[error(
        "{}: not a valid ONNX {message} ({source}); the file is truncated, corrupt or not an \
         ONNX file: re-download or re-export it",
        show(file)
    )]
    Decode {
        file: PathBuf,
        /// The protobuf message expected (`ModelProto`, `TensorProto`).
        message: &'static str,
        #[source]
        source: prost::DecodeError,
    },

    /// `ModelProto.graph` is absent.
    #[error(
        "{}: the model has no graph (ModelProto.graph is missing); re-export the model",
        show(file)
    )]
    MissingGraph { file: PathBuf },

    /// A folder passed to [`crate::Model::load`] holds no model, or several and none is
    /// `model.onnx`.
    #[error(
        "{}: {problem}; pass a .onnx file, or a folder holding `model.onnx` or exactly one \
         .onnx file",
        show(dir)
    )]
    ModelNotFound { dir: PathBuf, problem: String },

    /// A model-level field is invalid (opset imports and the like).
    #[error("{}: {field}: {problem}", show(file))]
    Malformed {
        file: PathBuf,
        field: String,
        problem: String,
    },

    /// `TensorProto.dims` holds a negative dimension, or the element count is absurd.
    #[error(
        "{}: tensor '{tensor}': dims {dims:?} are invalid: {problem}; the file is corrupt or \
         was written by a broken exporter",
        show(file)
    )]
    BadDims {
        file: PathBuf,
        tensor: String,
        dims: Vec<i64>,
        problem: String,
    },

    /// The tensor's `data_type` has no [`DType`] (strings, complex, float8, ...).
    #[error(
        "{}: tensor '{tensor}' has data type {type_name} (TensorProto.data_type = {code}), which \
         oxgen does not support; convert it to a numeric type such as float32, float16 or int8",
        show(file)
    )]
    UnsupportedDType {
        file: PathBuf,
        tensor: String,
        code: i32,
        type_name: &'static str,
    },

    /// A data field holds a different number of values (or bytes, for `raw_data`) than the
    /// shape and dtype need.
    #[error(
        "{}: tensor '{tensor}': {field} holds {actual} {unit} but a {dtype} tensor of shape \
         {dims:?} needs {expected}; the file is corrupt",
        show(file)
    )]
    DataCount {
        file: PathBuf,
        tensor: String,
        field: &'static str,
        dtype: DType,
        dims: Vec<usize>,
        /// "values" for typed fields, "bytes" for `raw_data`.
        unit: &'static str,
        expected: usize,
        actual: usize,
    },

    /// A tensor is inconsistent in a way not covered by the variants above (data in a field
    /// its dtype does not use, segments, external data without a folder, ...).
    #[error("{}: tensor '{tensor}': {field}: {problem}", show(file))]
    BadTensor {
        file: PathBuf,
        tensor: String,
        field: &'static str,
        problem: String,
    },

    /// An `external_data` entry is missing or unparsable (`location`, `offset`, `length`).
    #[error(
        "{}: tensor '{tensor}': external_data key '{key}' = {value:?}: {problem}",
        show(file)
    )]
    ExternalKey {
        file: PathBuf,
        tensor: String,
        key: &'static str,
        value: String,
        problem: String,
    },

    /// An external data `location` is absolute, contains `..`, or resolves (through a
    /// symbolic link) outside the model's folder.
    #[error(
        "{}: tensor '{tensor}': external data location {location:?} {problem}; external data \
         files must be plain relative paths inside the model's folder",
        show(file)
    )]
    ExternalPath {
        file: PathBuf,
        tensor: String,
        location: String,
        problem: String,
    },

    /// The external data file named by a tensor does not exist.
    #[error(
        "{}: external data file for tensor '{tensor}' is missing ({source}); copy it next to \
         the model file",
        show(file)
    )]
    MissingDataFile {
        file: PathBuf,
        tensor: String,
        #[source]
        source: std::io::Error,
    },

    /// `offset` + `length` overflows or runs past the end of the external data file.
    #[error(
        "{}: tensor '{tensor}': external data at offset {offset} with length {length} does not \
         fit in the file ({file_size} bytes); the data file is truncated or belongs to another \
         model",
        show(file)
    )]
    ExternalRange {
        file: PathBuf,
        tensor: String,
        offset: u64,
        length: u64,
        file_size: u64,
    },

    /// An external tensor's `length` differs from the bytes its dtype and shape need.
    #[error(
        "{}: tensor '{tensor}': external data length is {length} bytes but a {dtype} tensor of \
         shape {dims:?} needs {expected}; the model file is corrupt",
        show(file)
    )]
    ExternalLength {
        file: PathBuf,
        tensor: String,
        dtype: DType,
        dims: Vec<usize>,
        length: u64,
        expected: u64,
    },
}

impl OnnxError {
    /// The file (or folder) the error is about; empty for in-memory data.
    pub fn file(&self) -> &Path {
        match self {
            OnnxError::Io { file, .. }
            | OnnxError::Decode { file, .. }
            | OnnxError::MissingGraph { file }
            | OnnxError::Malformed { file, .. }
            | OnnxError::BadDims { file, .. }
            | OnnxError::UnsupportedDType { file, .. }
            | OnnxError::DataCount { file, .. }
            | OnnxError::BadTensor { file, .. }
            | OnnxError::ExternalKey { file, .. }
            | OnnxError::ExternalPath { file, .. }
            | OnnxError::MissingDataFile { file, .. }
            | OnnxError::ExternalRange { file, .. }
            | OnnxError::ExternalLength { file, .. } => file,
            OnnxError::ModelNotFound { dir, .. } => dir,
        }
    }

    pub(crate) fn io(file: &Path, action: &'static str, source: std::io::Error) -> Self {
        OnnxError::Io {
            file: file.to_path_buf(),
            action,
            source,
        }
    }
}

/// The file as shown in messages: its path, or `<in-memory>` when there is none.
fn show(file: &Path) -> std::path::Display<'_> {
    if file.as_os_str().is_empty() {
        Path::new("<in-memory>").display()
    } else {
        file.display()
    }
}
