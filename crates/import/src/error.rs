//! The one error type of `oxgen-import`. Every variant names the input file or the output
//! folder, and where there is one the metadata key or tensor, and says what to do.

use std::path::{Path, PathBuf};

use oxgen_gguf::GgufError;

use crate::genai_graph::WriteError;

/// Errors from importing a model.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// Reading the GGUF file or converting one of its tensors failed (the message names the
    /// file, key or tensor).
    #[error(transparent)]
    Gguf(#[from] GgufError),

    /// `general.architecture` is not one the importer maps.
    #[error(
        "{}: general.architecture '{arch}' is not supported (supported: {supported}); \
         convert a model of a supported architecture",
        file.display()
    )]
    UnsupportedArchitecture {
        file: PathBuf,
        arch: String,
        supported: String,
    },

    /// A model feature (tensor type, rope scaling, tokenizer kind, ...) the importer cannot
    /// map without changing the model's results.
    #[error("{}: {what} is not supported: {hint}", file.display())]
    Unsupported {
        file: PathBuf,
        what: String,
        hint: String,
    },

    /// A metadata value is missing, of the wrong kind, or out of range.
    #[error("{}: metadata '{key}': {problem}; the file is corrupt or not a model of this architecture", file.display())]
    Metadata {
        file: PathBuf,
        key: String,
        problem: String,
    },

    /// A tensor's shape disagrees with the architecture metadata.
    #[error(
        "{}: tensor '{tensor}' has GGUF dims {found:?}, but the metadata ({why}) needs {expected:?}; \
         the file is corrupt or its metadata does not describe its tensors",
        file.display()
    )]
    BadShape {
        file: PathBuf,
        tensor: String,
        found: Vec<u64>,
        expected: Vec<u64>,
        why: String,
    },

    /// A tensor the architecture needs is absent, or one it does not know is present.
    #[error("{}: tensor '{tensor}' {problem}", file.display())]
    Tensor {
        file: PathBuf,
        tensor: String,
        problem: String,
    },

    /// The tokenizer metadata cannot be turned into a `tokenizer.json`.
    #[error("{}: tokenizer: {problem}", file.display())]
    Tokenizer { file: PathBuf, problem: String },

    /// An option given to the importer is invalid.
    #[error("invalid import option: {0}")]
    Options(String),

    /// The output folder exists and overwriting was not asked for.
    #[error(
        "{} already exists; pass --force (ImportOptions::overwrite) to replace it, or choose \
         another folder",
        path.display()
    )]
    Exists { path: PathBuf },

    /// A file-system operation on the output failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// The source folder lacks a file the import needs.
    #[error("{}: {problem}", dir.display())]
    Folder { dir: PathBuf, problem: String },

    /// Writing the ONNX model failed.
    #[error("writing the model into {}: {source}", dir.display())]
    Write {
        dir: PathBuf,
        #[source]
        source: Box<WriteError>,
    },
}

impl ImportError {
    pub(crate) fn io(path: &Path, action: &'static str, source: std::io::Error) -> ImportError {
        ImportError::Io {
            path: path.to_path_buf(),
            action,
            source,
        }
    }
}
