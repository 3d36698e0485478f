//! [`GgufFile`]: a parsed GGUF file over its bytes (memory-mapped or owned), with typed
//! metadata accessors and per-tensor data, dequantization and repacking.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use oxgen_tensor::Tensor;

use crate::parse::{Parsed, parse};
use crate::repack::{GatherBlockQuantizedWeight, MatMulNBitsWeight};
use crate::value::{Array, Value};
use crate::{GgmlType, GgufError};

/// One tensor's entry in the file's tensor infos, checked against the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// `ne`, fastest-varying first (ggml order): a weight with `dims = [K, N]` is N rows of K
    /// contiguous elements, i.e. ONNX/NumPy shape `[N, K]` ([`TensorInfo::onnx_dims`]).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Data offset relative to the start of the data section, as stored.
    pub offset: u64,
    /// Absolute offset of the data in the file.
    pub data_offset: u64,
    pub n_elements: u64,
    /// Bytes of data: `n_elements / block_elems * block_bytes`.
    pub n_bytes: u64,
    /// Where this tensor info starts in the file (for messages).
    pub info_offset: u64,
}

impl TensorInfo {
    /// The shape in ONNX/NumPy order (slowest first): `dims` reversed.
    pub fn onnx_dims(&self) -> Vec<usize> {
        // Each dim is at most `n_elements` (or the tensor is empty), which fits in memory.
        self.dims
            .iter()
            .rev()
            .map(|&d| usize::try_from(d).unwrap_or(usize::MAX))
            .collect()
    }
}

enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

/// A parsed GGUF file (versions 2 and 3, little-endian).
///
/// Opening parses and validates the whole header, metadata and tensor infos — every length,
/// count, shape, type and data range — so later accessors cannot fail on file structure,
/// only on what the caller asks for (a missing key, a wrong type, an unsupported conversion).
pub struct GgufFile {
    path: PathBuf,
    storage: Storage,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, Value)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses `path`.
    ///
    /// The file must not be modified or truncated while the returned value lives (the usual
    /// precondition of a memory map).
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io = |action, source| GgufError::Io {
            file: path.to_path_buf(),
            action,
            source,
        };
        // Checked before opening: opening a FIFO would block.
        let meta = std::fs::metadata(path).map_err(|e| io("open", e))?;
        if !meta.is_file() {
            let e = std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file");
            return Err(io("open", e));
        }
        let file = std::fs::File::open(path).map_err(|e| io("open", e))?;
        let len = file
            .metadata()
            .map_err(|e| io("read metadata of", e))?
            .len();
        let storage = if len == 0 {
            Storage::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only and owned by the `GgufFile`; the file must not be
            // modified while mapped, as documented above.
            Storage::Mapped(unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io("memory-map", e))?)
        };
        Self::new(path.to_path_buf(), storage)
    }

    /// Parses a GGUF image held in memory; messages name the file `<in-memory>`.
    pub fn from_bytes(bytes: impl Into<Vec<u8>>) -> Result<GgufFile, GgufError> {
        Self::new(PathBuf::new(), Storage::Owned(bytes.into()))
    }

    fn new(path: PathBuf, storage: Storage) -> Result<GgufFile, GgufError> {
        let bytes: &[u8] = match &storage {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        };
        let Parsed {
            version,
            alignment,
            data_offset,
            metadata,
            metadata_index,
            tensors,
            tensor_index,
        } = parse(bytes, &path)?;
        Ok(GgufFile {
            path,
            storage,
            version,
            alignment,
            data_offset,
            metadata,
            metadata_index,
            tensors,
            tensor_index,
        })
    }

    /// The path given to [`GgufFile::open`]; empty for [`GgufFile::from_bytes`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }

    /// 2 or 3.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// `general.alignment`, or 32 when absent.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset of the tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    // ---- metadata ----

    /// All metadata entries, in file order.
    pub fn metadata(&self) -> impl ExactSizeIterator<Item = (&str, &Value)> {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            file: self.path.clone(),
            key: key.to_string(),
        })
    }

    fn wrong_type(&self, key: &str, expected: &'static str, found: &Value) -> GgufError {
        GgufError::WrongType {
            file: self.path.clone(),
            key: key.to_string(),
            expected,
            found: found.type_description(),
        }
    }

    /// An integer of any of the eight integer types, converted to `T` when it fits.
    fn integer<T: TryFrom<i128>>(&self, key: &str, expected: &'static str) -> Result<T, GgufError> {
        let v = self.require(key)?;
        let i = v
            .as_integer()
            .ok_or_else(|| self.wrong_type(key, expected, v))?;
        T::try_from(i).map_err(|_| GgufError::OutOfRange {
            file: self.path.clone(),
            key: key.to_string(),
            value: i.to_string(),
            expected,
        })
    }

    /// An integer value (of any integer type: writers mix uint32 and uint64 for counts) that
    /// fits in `u32`.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.integer(key, "uint32")
    }

    /// An integer value that fits in `u64`.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.integer(key, "uint64")
    }

    /// An integer value that fits in `i32`.
    pub fn get_i32(&self, key: &str) -> Result<i32, GgufError> {
        self.integer(key, "int32")
    }

    /// An integer value that fits in `i64`.
    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        self.integer(key, "int64")
    }

    /// A `float32` value.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        match self.require(key)? {
            Value::F32(v) => Ok(*v),
            v => Err(self.wrong_type(key, "float32", v)),
        }
    }

    /// A `float32` or `float64` value (widening is exact).
    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        match self.require(key)? {
            Value::F32(v) => Ok(f64::from(*v)),
            Value::F64(v) => Ok(*v),
            v => Err(self.wrong_type(key, "float64", v)),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            Value::Bool(v) => Ok(*v),
            v => Err(self.wrong_type(key, "bool", v)),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            Value::String(v) => Ok(v),
            v => Err(self.wrong_type(key, "string", v)),
        }
    }

    /// An array of any element type.
    pub fn get_array(&self, key: &str) -> Result<&Array, GgufError> {
        match self.require(key)? {
            Value::Array(a) => Ok(a),
            v => Err(self.wrong_type(key, "array", v)),
        }
    }

    /// An array of strings (`tokenizer.ggml.tokens`, `tokenizer.ggml.merges`).
    pub fn get_str_array(&self, key: &str) -> Result<&[String], GgufError> {
        match self.require(key)? {
            Value::Array(Array::String(v)) => Ok(v),
            v => Err(self.wrong_type(key, "array of string", v)),
        }
    }

    /// An array of int32 (`tokenizer.ggml.token_type`).
    pub fn get_i32_array(&self, key: &str) -> Result<&[i32], GgufError> {
        match self.require(key)? {
            Value::Array(Array::I32(v)) => Ok(v),
            v => Err(self.wrong_type(key, "array of int32", v)),
        }
    }

    /// An array of uint32.
    pub fn get_u32_array(&self, key: &str) -> Result<&[u32], GgufError> {
        match self.require(key)? {
            Value::Array(Array::U32(v)) => Ok(v),
            v => Err(self.wrong_type(key, "array of uint32", v)),
        }
    }

    /// An array of float32 (`tokenizer.ggml.scores`).
    pub fn get_f32_array(&self, key: &str) -> Result<&[f32], GgufError> {
        match self.require(key)? {
            Value::Array(Array::F32(v)) => Ok(v),
            v => Err(self.wrong_type(key, "array of float32", v)),
        }
    }

    // ---- tensors ----

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor_index
            .get(name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| GgufError::TensorNotFound {
                file: self.path.clone(),
                tensor: name.to_string(),
            })
    }

    /// The raw bytes of tensor `name` (its blocks, as stored).
    pub fn tensor_data(&self, name: &str) -> Result<&[u8], GgufError> {
        let t = self.tensor(name)?;
        Ok(self.data_of(t))
    }

    fn data_of(&self, t: &TensorInfo) -> &[u8] {
        // Parsing checked `data_offset + n_bytes <= file size` for every tensor.
        let start = t.data_offset as usize;
        &self.bytes()[start..start + t.n_bytes as usize]
    }

    /// Tensor `name` dequantized to f32, in ONNX shape ([`TensorInfo::onnx_dims`]), bit for
    /// bit as ggml / gguf-py dequantize it. Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1.
    pub fn dequantize(&self, name: &str) -> Result<Tensor, GgufError> {
        let t = self.tensor(name)?;
        crate::repack::dequantize_tensor(t, self.data_of(t)).map_err(|e| e.in_file(&self.path))
    }

    /// Tensor `name` (a 2-D weight, `dims = [K, N]`) repacked for `com.microsoft::MatMulNBits`
    /// without requantization: see [`crate::repack::matmul_nbits`].
    pub fn matmul_nbits(&self, name: &str) -> Result<MatMulNBitsWeight, GgufError> {
        let t = self.tensor(name)?;
        crate::repack::matmul_nbits(&t.name, t.ggml_type, &t.dims, self.data_of(t))
            .map_err(|e| e.in_file(&self.path))
    }

    /// Tensor `name` (an embedding table, `dims = [K, rows]`) repacked for
    /// `com.microsoft::GatherBlockQuantized` without requantization: see
    /// [`crate::repack::gather_block_quantized`].
    pub fn gather_block_quantized(
        &self,
        name: &str,
    ) -> Result<GatherBlockQuantizedWeight, GgufError> {
        let t = self.tensor(name)?;
        crate::repack::gather_block_quantized(&t.name, t.ggml_type, &t.dims, self.data_of(t))
            .map_err(|e| e.in_file(&self.path))
    }
}
