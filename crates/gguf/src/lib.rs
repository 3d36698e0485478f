//! oxgen-gguf: reads GGUF files (llama.cpp's model format), dequantizes ggml block formats,
//! and repacks quantized weights into onnxruntime's `MatMulNBits` / `GatherBlockQuantized`
//! layouts without requantizing them.
//!
//! GGUF files are untrusted (DESIGN.md §5.3): every count, length, type id, shape, alignment
//! and data range is checked before use — counts and lengths against the bytes that remain,
//! before anything is allocated for them — and each failure is a [`GgufError`] naming the
//! file, the key or tensor, the offset and what to do. Parsing never panics on file data.
//!
//! - [`GgufFile`] opens (memory-maps) or wraps a file; typed metadata accessors
//!   ([`GgufFile::get_u32`], [`GgufFile::get_str_array`], ...); [`TensorInfo`]s and data.
//! - [`blocks`]: the block structs (`BlockQ4_0`, `BlockQ4_1`, `BlockQ8_0`; F32/F16/BF16) and
//!   dequantization bit-identical to ggml and gguf-py.
//! - [`repack`]: [`repack::matmul_nbits`] and [`repack::gather_block_quantized`].
//! - [`writer::GgufWriter`]: writes small GGUF files for tests and fixtures.
//!
//! This crate must never know about ONNX graphs or protobufs: it produces tensors and the
//! attribute values a node needs; building the ONNX package (the importer) belongs to a crate
//! that depends on `oxgen-onnx`. It never writes to the file it reads.
//!
//! # File layout
//!
//! ggml `docs/gguf.md`, versions 2 and 3 (3 only adds big-endian files, which this reader
//! rejects: their version field reads byte-swapped); little-endian throughout:
//!
//! ```text
//! magic "GGUF" | version u32 | tensor_count u64 | metadata_kv_count u64
//! metadata_kv_count × { key: string, value_type u32, value }
//! tensor_count × { name: string, n_dims u32, ne[n_dims] u64, ggml_type u32, offset u64 }
//! zero padding to general.alignment (default 32) | tensor data (data start + offset each)
//! string = len u64, UTF-8 bytes (no NUL); array = elem_type u32, count u64, values
//! ```
//!
//! `ne[0]` varies fastest: a weight with `ne = [K, N]` is N rows of K elements, ONNX shape
//! `[N, K]`. The type table comes from gguf-py `gguf/constants.py` (0.19.0).

pub mod blocks;
pub mod error;
mod file;
mod ggml_type;
mod parse;
pub mod repack;
pub mod value;
pub mod writer;

pub use error::GgufError;
pub use file::{GgufFile, TensorInfo};
pub use ggml_type::GgmlType;
pub use parse::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT};
pub use repack::{GatherBlockQuantizedWeight, MatMulNBitsWeight, Requantized};
pub use value::{Array, Value, ValueType};
pub use writer::GgufWriter;

/// Most dimensions a tensor may have (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// Deepest nesting of metadata arrays accepted (an array of arrays is depth 2). Real files
/// nest at most 2; the limit keeps the recursive parser's stack bounded.
pub const MAX_ARRAY_DEPTH: usize = 8;
