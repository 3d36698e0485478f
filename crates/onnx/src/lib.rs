//! oxgen-onnx: ONNX protobuf types, model loading and model writing.
//!
//! Loads `.onnx` files and their external data (memory-mapped, initializers borrowed in place
//! where alignment allows), and writes models with external data for the importer and test
//! fixtures. Files are untrusted: every path, offset, length and dimension is checked before
//! use. This crate must never execute a graph or interpret an operator's semantics.

pub mod proto;
