//! The one error type of `oxgen-gguf`.
//!
//! Every variant names the file (or `<in-memory>` for [`crate::GgufFile::from_bytes`]), and
//! where there is one the metadata key or tensor and the file offset, so a message reads
//! "model.gguf: offset 1234: metadata 'tokenizer.ggml.tokens': array of 4294967295 string
//! items needs at least 34359738360 bytes but only 96 remain; the file is truncated or
//! corrupt: re-download it". Messages end with what to do about it.

use std::path::{Path, PathBuf};

use crate::GgmlType;

/// What to do about a damaged file.
const REDOWNLOAD: &str = "the file is truncated or corrupt: re-download or re-convert it";

/// Errors from reading a GGUF file, looking up its metadata, or converting its tensors.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("{}: cannot {action}: {source}", show(file))]
    Io {
        file: PathBuf,
        /// What was being attempted ("open", "memory-map", ...).
        action: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// A field runs past the end of the file.
    #[error(
        "{}: offset {offset}: {what} needs {needed} bytes but only {available} remain; {REDOWNLOAD}",
        show(file)
    )]
    Truncated {
        file: PathBuf,
        offset: u64,
        what: String,
        needed: u64,
        available: u64,
    },

    /// The file does not start with `GGUF`.
    #[error(
        "{}: starts with bytes {found:02x?} instead of the GGUF magic \"GGUF\" (47 47 55 46); \
         this is not a GGUF file (pass a .gguf file)",
        show(file)
    )]
    BadMagic { file: PathBuf, found: [u8; 4] },

    /// A GGUF version other than 2 or 3.
    #[error("{}: GGUF version {version} is not supported ({hint})", show(file))]
    UnsupportedVersion {
        file: PathBuf,
        version: u32,
        hint: &'static str,
    },

    /// `tensor_count` or `metadata_kv_count` is more than the rest of the file could hold.
    #[error(
        "{}: offset {offset}: header field {field} = {count}, but the {remaining} bytes after \
         the header can hold at most {max}; {REDOWNLOAD}",
        show(file)
    )]
    AbsurdCount {
        file: PathBuf,
        offset: u64,
        field: &'static str,
        count: u64,
        remaining: u64,
        max: u64,
    },

    /// A string or array length is more than the rest of the file could hold.
    #[error(
        "{}: offset {offset}: {what}: {len} {unit} need at least {needed} bytes but only \
         {remaining} remain; {REDOWNLOAD}",
        show(file)
    )]
    AbsurdLength {
        file: PathBuf,
        offset: u64,
        /// The field: "metadata 'k': string", "name of tensor #3", ...
        what: String,
        len: u64,
        /// `bytes` for strings, `<type> items` for arrays.
        unit: String,
        needed: u64,
        remaining: u64,
    },

    /// A metadata value type id the spec does not define.
    #[error(
        "{}: offset {offset}: metadata '{key}' has unknown value type {type_id} (valid: 0..=12); \
         {REDOWNLOAD}",
        show(file)
    )]
    BadValueType {
        file: PathBuf,
        offset: u64,
        key: String,
        type_id: u32,
    },

    /// Arrays nested deeper than [`crate::MAX_ARRAY_DEPTH`].
    #[error(
        "{}: offset {offset}: metadata '{key}' nests arrays deeper than {max} levels; {REDOWNLOAD}",
        show(file)
    )]
    NestingTooDeep {
        file: PathBuf,
        offset: u64,
        key: String,
        max: usize,
    },

    /// A bool byte other than 0 or 1.
    #[error(
        "{}: offset {offset}: metadata '{key}' holds bool byte {byte} (must be 0 or 1); {REDOWNLOAD}",
        show(file)
    )]
    BadBool {
        file: PathBuf,
        offset: u64,
        key: String,
        byte: u8,
    },

    /// A string (key, value or tensor name) that is not UTF-8.
    #[error(
        "{}: offset {offset}: {what} is not valid UTF-8; {REDOWNLOAD}",
        show(file)
    )]
    BadUtf8 {
        file: PathBuf,
        offset: u64,
        what: String,
    },

    /// The same metadata key twice.
    #[error(
        "{}: offset {offset}: metadata key '{key}' appears twice; {REDOWNLOAD}",
        show(file)
    )]
    DuplicateKey {
        file: PathBuf,
        offset: u64,
        key: String,
    },

    /// `general.alignment` is zero or not a power of two.
    #[error(
        "{}: metadata 'general.alignment' = {value}: {problem}; fix the key or re-convert the model",
        show(file)
    )]
    BadAlignment {
        file: PathBuf,
        value: String,
        problem: String,
    },

    /// A tensor with more than [`crate::MAX_DIMS`] dimensions.
    #[error(
        "{}: offset {offset}: tensor '{tensor}' has {n_dims} dimensions (ggml allows at most \
         {max}); {REDOWNLOAD}",
        show(file)
    )]
    TooManyDims {
        file: PathBuf,
        offset: u64,
        tensor: String,
        n_dims: u32,
        max: usize,
    },

    /// A shape whose element or byte count overflows, or that does not fit the type's blocks
    /// (or the requested layout).
    #[error(
        "{}: tensor '{tensor}': dims {dims:?} (ne, fastest first): {problem}",
        show(file)
    )]
    BadShape {
        file: PathBuf,
        tensor: String,
        dims: Vec<u64>,
        problem: String,
    },

    /// A `ggml_type` id this crate does not know.
    #[error(
        "{}: offset {offset}: tensor '{tensor}' has unknown ggml type id {type_id}; the file \
         needs a newer reader, or is corrupt",
        show(file)
    )]
    UnknownGgmlType {
        file: PathBuf,
        offset: u64,
        tensor: String,
        type_id: u32,
    },

    /// A tensor data offset that is not a multiple of the alignment.
    #[error(
        "{}: tensor '{tensor}': data offset {offset} is not a multiple of the alignment \
         {alignment}; {REDOWNLOAD}",
        show(file)
    )]
    MisalignedOffset {
        file: PathBuf,
        tensor: String,
        offset: u64,
        alignment: u64,
    },

    /// A tensor's data runs past the end of the file.
    #[error(
        "{}: tensor '{tensor}': data at file offset {start} with {len} bytes runs past the end \
         of the file ({file_size} bytes); {REDOWNLOAD}",
        show(file)
    )]
    DataOutOfBounds {
        file: PathBuf,
        tensor: String,
        start: u64,
        len: u64,
        file_size: u64,
    },

    /// The same tensor name twice.
    #[error(
        "{}: offset {offset}: tensor name '{tensor}' appears twice; {REDOWNLOAD}",
        show(file)
    )]
    DuplicateTensor {
        file: PathBuf,
        offset: u64,
        tensor: String,
    },

    /// A metadata key the caller needs is absent.
    #[error(
        "{}: metadata key '{key}' is missing; the model was converted without it",
        show(file)
    )]
    MissingKey { file: PathBuf, key: String },

    /// A metadata value of another type than the accessor reads.
    #[error(
        "{}: metadata '{key}' is {found}, expected {expected}; the model was converted by an \
         incompatible tool",
        show(file)
    )]
    WrongType {
        file: PathBuf,
        key: String,
        expected: &'static str,
        found: String,
    },

    /// An integer metadata value outside the accessor's range.
    #[error(
        "{}: metadata '{key}' = {value} does not fit in {expected}",
        show(file)
    )]
    OutOfRange {
        file: PathBuf,
        key: String,
        value: String,
        expected: &'static str,
    },

    /// No tensor of this name.
    #[error("{}: no tensor named '{tensor}'", show(file))]
    TensorNotFound { file: PathBuf, tensor: String },

    /// A conversion this crate does not do for this tensor's type.
    #[error(
        "{}: tensor '{tensor}' ({ggml_type}): cannot {operation}: {hint}",
        show(file)
    )]
    Unsupported {
        file: PathBuf,
        tensor: String,
        ggml_type: GgmlType,
        operation: &'static str,
        hint: String,
    },

    /// The system refused an allocation sized from the file.
    #[error(
        "{}: tensor '{tensor}': cannot allocate {bytes} bytes for its converted data",
        show(file)
    )]
    Alloc {
        file: PathBuf,
        tensor: String,
        bytes: usize,
    },
}

impl GgufError {
    /// The file the error is about; empty for in-memory data.
    pub fn file(&self) -> &Path {
        match self {
            GgufError::Io { file, .. }
            | GgufError::Truncated { file, .. }
            | GgufError::BadMagic { file, .. }
            | GgufError::UnsupportedVersion { file, .. }
            | GgufError::AbsurdCount { file, .. }
            | GgufError::AbsurdLength { file, .. }
            | GgufError::BadValueType { file, .. }
            | GgufError::NestingTooDeep { file, .. }
            | GgufError::BadBool { file, .. }
            | GgufError::BadUtf8 { file, .. }
            | GgufError::DuplicateKey { file, .. }
            | GgufError::BadAlignment { file, .. }
            | GgufError::TooManyDims { file, .. }
            | GgufError::BadShape { file, .. }
            | GgufError::UnknownGgmlType { file, .. }
            | GgufError::MisalignedOffset { file, .. }
            | GgufError::DataOutOfBounds { file, .. }
            | GgufError::DuplicateTensor { file, .. }
            | GgufError::MissingKey { file, .. }
            | GgufError::WrongType { file, .. }
            | GgufError::OutOfRange { file, .. }
            | GgufError::TensorNotFound { file, .. }
            | GgufError::Unsupported { file, .. }
            | GgufError::Alloc { file, .. } => file,
        }
    }

    /// The same error, about `path` (conversions run on slices and learn the file here).
    pub(crate) fn in_file(mut self, path: &Path) -> Self {
        match &mut self {
            GgufError::Io { file, .. }
            | GgufError::Truncated { file, .. }
            | GgufError::BadMagic { file, .. }
            | GgufError::UnsupportedVersion { file, .. }
            | GgufError::AbsurdCount { file, .. }
            | GgufError::AbsurdLength { file, .. }
            | GgufError::BadValueType { file, .. }
            | GgufError::NestingTooDeep { file, .. }
            | GgufError::BadBool { file, .. }
            | GgufError::BadUtf8 { file, .. }
            | GgufError::DuplicateKey { file, .. }
            | GgufError::BadAlignment { file, .. }
            | GgufError::TooManyDims { file, .. }
            | GgufError::BadShape { file, .. }
            | GgufError::UnknownGgmlType { file, .. }
            | GgufError::MisalignedOffset { file, .. }
            | GgufError::DataOutOfBounds { file, .. }
            | GgufError::DuplicateTensor { file, .. }
            | GgufError::MissingKey { file, .. }
            | GgufError::WrongType { file, .. }
            | GgufError::OutOfRange { file, .. }
            | GgufError::TensorNotFound { file, .. }
            | GgufError::Unsupported { file, .. }
            | GgufError::Alloc { file, .. } => *file = path.to_path_buf(),
        }
        self
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
