//! oxgen-onnx: ONNX protobuf types, model loading and model writing.
//!
//! Loads `.onnx` files and their external data (memory-mapped, initializers borrowed in place
//! where alignment allows), and writes models with external data for the importer and test
//! fixtures. Files are untrusted: every path, offset, length and dimension is checked before
//! use. This crate must never execute a graph or interpret an operator's semantics.
//!
//! - [`Model`] loads a model ([`Model::load`]) and decodes its tensors ([`Model::tensor`]).
//! - [`tensor_from_proto`], [`load_tensor_file`] and [`dims_of`] decode standalone tensors.
//! - [`writer::ModelBuilder`] builds and saves models; [`writer::attr`] builds attributes.

pub mod error;
mod external;
mod model;
pub mod proto;
mod tensor;
pub mod writer;

pub use error::OnnxError;
pub use model::{DEFAULT_MODEL_FILE, ExternalFileInfo, Model};
pub use tensor::{MAX_ELEMENTS, dims_of, load_tensor_file, tensor_from_proto};
pub use writer::{Dim, ModelBuilder, save_tensor_file, tensor_to_proto};
