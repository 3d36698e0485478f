//! Parsing the GGUF header, metadata and tensor infos from untrusted bytes.
//!
//! The layout is in the [crate docs](crate#file-layout).
//!
//! Every count and length is checked against the bytes that remain *before* anything is
//! allocated for it, using the fewest bytes an item can take (a tensor info 24, a metadata
//! entry 13, a string 8, a nested array 12). Lists parsed item by item reserve at most a
//! few thousand slots up front and grow only as items parse, so memory follows what the file
//! actually holds, whatever its header claims. Version 3 only adds big-endian files, which this
//! reader rejects (their version field reads byte-swapped).

use std::collections::HashMap;
use std::path::Path;

use crate::value::{Array, Value, ValueType};
use crate::{GgmlType, GgufError, MAX_ARRAY_DEPTH, MAX_DIMS, TensorInfo};

/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// The metadata key that sets the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Bytes before the metadata: magic, version, two counts.
const HEADER_BYTES: u64 = 4 + 4 + 8 + 8;
/// The smallest metadata entry: an empty key, a type tag and a one-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// The smallest tensor info: an empty name, `n_dims = 0`, a type and an offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// Everything before the tensor data.
pub(crate) struct Parsed {
    pub version: u32,
    pub alignment: u64,
    pub data_offset: u64,
    pub metadata: Vec<(String, Value)>,
    pub metadata_index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    pub tensor_index: HashMap<String, usize>,
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    file: &'a Path,
}

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                file: self.file.to_path_buf(),
                offset: self.offset(),
                what: what(),
                needed: n,
                available: self.remaining(),
            });
        }
        // `n <= remaining`, which is a usize.
        let n = n as usize;
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let b = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Fails with [`GgufError::AbsurdLength`] unless `count` items of at least `min_size`
    /// bytes fit in what remains.
    fn check_fits(
        &self,
        at: u64,
        count: u64,
        min_size: u64,
        what: impl FnOnce() -> String,
        unit: impl FnOnce() -> String,
    ) -> Result<(), GgufError> {
        match count.checked_mul(min_size) {
            Some(needed) if needed <= self.remaining() => Ok(()),
            needed => Err(GgufError::AbsurdLength {
                file: self.file.to_path_buf(),
                offset: at,
                what: what(),
                len: count,
                unit: unit(),
                needed: needed.unwrap_or(u64::MAX),
                remaining: self.remaining(),
            }),
        }
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let at = self.offset();
        let len = self.u64(|| format!("{}: string length", what()))?;
        self.check_fits(at, len, 1, what, || "bytes".into())?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::BadUtf8 {
            file: self.file.to_path_buf(),
            offset: at,
            what: what(),
        })
    }

    fn value_type(&mut self, key: &str) -> Result<ValueType, GgufError> {
        let at = self.offset();
        let id = self.u32(|| format!("metadata '{key}': value type"))?;
        ValueType::from_id(id).ok_or_else(|| GgufError::BadValueType {
            file: self.file.to_path_buf(),
            offset: at,
            key: key.to_string(),
            type_id: id,
        })
    }

    fn value(&mut self, ty: ValueType, key: &str, depth: usize) -> Result<Value, GgufError> {
        let what = || format!("metadata '{key}': {} value", ty.name());
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(what)?[0]),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            ValueType::Bool => {
                let at = self.offset();
                let [byte] = self.array::<1>(what)?;
                Value::Bool(self.bool(byte, at, key)?)
            }
            ValueType::String => Value::String(self.string(&what)?),
            ValueType::Array => Value::Array(self.array_value(key, depth + 1)?),
        })
    }

    fn bool(&self, byte: u8, at: u64, key: &str) -> Result<bool, GgufError> {
        match byte {
            0 => Ok(false),
            1 => Ok(true),
            byte => Err(GgufError::BadBool {
                file: self.file.to_path_buf(),
                offset: at,
                key: key.to_string(),
                byte,
            }),
        }
    }

    /// An array at nesting `depth` (1 for a top-level array value).
    fn array_value(&mut self, key: &str, depth: usize) -> Result<Array, GgufError> {
        let at = self.offset();
        if depth > MAX_ARRAY_DEPTH {
            return Err(GgufError::NestingTooDeep {
                file: self.file.to_path_buf(),
                offset: at,
                key: key.to_string(),
                max: MAX_ARRAY_DEPTH,
            });
        }
        let elem = self.value_type(key)?;
        let count_at = self.offset();
        let count = self.u64(|| format!("metadata '{key}': array length"))?;
        self.check_fits(
            count_at,
            count,
            elem.min_size(),
            || format!("metadata '{key}': array"),
            || format!("{} items", elem.name()),
        )?;
        // `count * min_size <= remaining`, so `count` fits in usize.
        let n = count as usize;
        let reserve = capacity(count);
        if let Some(size) = elem.fixed_size() {
            let bytes = self.take(count * size, || format!("metadata '{key}': array"))?;
            return self.fixed_array(elem, bytes, at, key);
        }
        Ok(match elem {
            ValueType::String => {
                let mut v = Vec::with_capacity(reserve);
                for i in 0..n {
                    v.push(self.string(&|| format!("metadata '{key}': string item #{i}"))?);
                }
                Array::String(v)
            }
            _ => {
                let mut v = Vec::with_capacity(reserve);
                for _ in 0..n {
                    v.push(self.array_value(key, depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }

    fn fixed_array(
        &self,
        elem: ValueType,
        bytes: &[u8],
        at: u64,
        key: &str,
    ) -> Result<Array, GgufError> {
        fn le<const N: usize, T>(bytes: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
            bytes
                .chunks_exact(N)
                .map(|c| {
                    let mut a = [0u8; N];
                    a.copy_from_slice(c);
                    f(a)
                })
                .collect()
        }
        Ok(match elem {
            ValueType::U8 => Array::U8(bytes.to_vec()),
            ValueType::I8 => Array::I8(le(bytes, i8::from_le_bytes)),
            ValueType::U16 => Array::U16(le(bytes, u16::from_le_bytes)),
            ValueType::I16 => Array::I16(le(bytes, i16::from_le_bytes)),
            ValueType::U32 => Array::U32(le(bytes, u32::from_le_bytes)),
            ValueType::I32 => Array::I32(le(bytes, i32::from_le_bytes)),
            ValueType::F32 => Array::F32(le(bytes, f32::from_le_bytes)),
            ValueType::U64 => Array::U64(le(bytes, u64::from_le_bytes)),
            ValueType::I64 => Array::I64(le(bytes, i64::from_le_bytes)),
            ValueType::F64 => Array::F64(le(bytes, f64::from_le_bytes)),
            ValueType::Bool => Array::Bool(
                bytes
                    .iter()
                    .enumerate()
                    .map(|(i, &b)| self.bool(b, at + 12 + i as u64, key))
                    .collect::<Result<_, _>>()?,
            ),
            ValueType::String | ValueType::Array => {
                unreachable!("fixed_array is called for fixed-size element types only")
            }
        })
    }
}

/// Capacity reserved up front for `count` items of a list whose elements are parsed one by
/// one. Counts are checked against the bytes that remain, but an item in memory (a `String`,
/// a map entry) is larger than its smallest encoding, so reserving the full count for a
/// lying header could still be a multiple of the file size; beyond this the list grows only
/// as items actually parse.
fn capacity(count: u64) -> usize {
    const MAX_RESERVE: u64 = 4096;
    count.min(MAX_RESERVE) as usize
}

fn version_hint(version: u32) -> Option<&'static str> {
    match version {
        2 | 3 => None,
        1 => Some(
            "GGUF v1 used 32-bit counts and is obsolete; re-convert the model with a current \
             llama.cpp (convert_hf_to_gguf.py)",
        ),
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => Some(
            "this looks like a big-endian GGUF file; oxgen reads little-endian files only, \
             use the little-endian release of the model",
        ),
        _ => Some("oxgen reads GGUF versions 2 and 3; the file is corrupt or from a newer tool"),
    }
}

/// Parses everything up to the tensor data, and checks every tensor's data lies in `bytes`.
pub(crate) fn parse(bytes: &[u8], file: &Path) -> Result<Parsed, GgufError> {
    let mut c = Cursor {
        bytes,
        pos: 0,
        file,
    };
    let magic: [u8; 4] = c.array(|| "the GGUF magic".into())?;
    if &magic != b"GGUF" {
        return Err(GgufError::BadMagic {
            file: file.to_path_buf(),
            found: magic,
        });
    }
    let version = c.u32(|| "the GGUF version".into())?;
    if let Some(hint) = version_hint(version) {
        return Err(GgufError::UnsupportedVersion {
            file: file.to_path_buf(),
            version,
            hint,
        });
    }
    let tensor_count = c.u64(|| "header field tensor_count".into())?;
    let kv_count = c.u64(|| "header field metadata_kv_count".into())?;
    let remaining = c.remaining();
    let absurd = |field, offset, count, max| GgufError::AbsurdCount {
        file: file.to_path_buf(),
        offset,
        field,
        count,
        remaining,
        max,
    };
    let max_kv = remaining / MIN_KV_BYTES;
    if kv_count > max_kv {
        return Err(absurd("metadata_kv_count", 16, kv_count, max_kv));
    }
    let max_tensors = (remaining - kv_count * MIN_KV_BYTES) / MIN_TENSOR_INFO_BYTES;
    if tensor_count > max_tensors {
        return Err(absurd("tensor_count", 8, tensor_count, max_tensors));
    }
    debug_assert_eq!(c.offset(), HEADER_BYTES);

    let mut metadata = Vec::with_capacity(capacity(kv_count));
    let mut metadata_index = HashMap::with_capacity(capacity(kv_count));
    for i in 0..kv_count {
        let at = c.offset();
        let key = c.string(&|| format!("key of metadata entry #{i}"))?;
        let ty = c.value_type(&key)?;
        let value = c.value(ty, &key, 0)?;
        if metadata_index.contains_key(&key) {
            return Err(GgufError::DuplicateKey {
                file: file.to_path_buf(),
                offset: at,
                key,
            });
        }
        metadata_index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }
    let alignment = match metadata_index.get(ALIGNMENT_KEY) {
        Some(&i) => alignment(&metadata[i].1, file)?,
        None => DEFAULT_ALIGNMENT,
    };

    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(capacity(tensor_count));
    let mut tensor_index = HashMap::with_capacity(capacity(tensor_count));
    for i in 0..tensor_count {
        let info_offset = c.offset();
        let name = c.string(&|| format!("name of tensor #{i}"))?;
        let t = tensor_info(&mut c, name, info_offset, alignment)?;
        if tensor_index.contains_key(&t.name) {
            return Err(GgufError::DuplicateTensor {
                file: file.to_path_buf(),
                offset: info_offset,
                tensor: t.name,
            });
        }
        tensor_index.insert(t.name.clone(), tensors.len());
        tensors.push(t);
    }

    // Alignment is a power of two at most 2^31, and the position at most the file size.
    let data_offset = c.offset().next_multiple_of(alignment);
    let file_size = bytes.len() as u64;
    for t in &mut tensors {
        let start = data_offset.checked_add(t.offset);
        match start.and_then(|s| s.checked_add(t.n_bytes)) {
            Some(end) if end <= file_size => t.data_offset = data_offset + t.offset,
            _ => {
                return Err(GgufError::DataOutOfBounds {
                    file: file.to_path_buf(),
                    tensor: t.name.clone(),
                    start: start.unwrap_or(u64::MAX),
                    len: t.n_bytes,
                    file_size,
                });
            }
        }
    }
    Ok(Parsed {
        version,
        alignment,
        data_offset,
        metadata,
        metadata_index,
        tensors,
        tensor_index,
    })
}

fn alignment(value: &Value, file: &Path) -> Result<u64, GgufError> {
    let bad = |problem: String| GgufError::BadAlignment {
        file: file.to_path_buf(),
        value: value.to_string(),
        problem,
    };
    let Some(v) = value.as_integer() else {
        return Err(bad(format!(
            "is {}, expected uint32",
            value.type_description()
        )));
    };
    match u32::try_from(v) {
        Ok(a) if a.is_power_of_two() => Ok(a.into()),
        _ => Err(bad("must be a power of two that fits in uint32".into())),
    }
}

/// The rest of a tensor info after its name; checks everything but the data bounds.
fn tensor_info(
    c: &mut Cursor<'_>,
    name: String,
    info_offset: u64,
    alignment: u64,
) -> Result<TensorInfo, GgufError> {
    let file = c.file;
    let dims_at = c.offset();
    let n_dims = c.u32(|| format!("tensor '{name}': n_dims"))?;
    if n_dims as usize > MAX_DIMS {
        return Err(GgufError::TooManyDims {
            file: file.to_path_buf(),
            offset: dims_at,
            tensor: name,
            n_dims,
            max: MAX_DIMS,
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        dims.push(c.u64(|| format!("tensor '{name}': ne[{d}]"))?);
    }
    let type_at = c.offset();
    let type_id = c.u32(|| format!("tensor '{name}': ggml type"))?;
    let Some(ggml_type) = GgmlType::from_id(type_id) else {
        return Err(GgufError::UnknownGgmlType {
            file: file.to_path_buf(),
            offset: type_at,
            tensor: name,
            type_id,
        });
    };
    let offset = c.u64(|| format!("tensor '{name}': data offset"))?;
    let bad_shape = |problem: String| GgufError::BadShape {
        file: file.to_path_buf(),
        tensor: name.clone(),
        dims: dims.clone(),
        problem: format!("{problem}; the file is corrupt: re-download or re-convert it"),
    };
    // ggml stores `ne` as int64: larger values are negative there.
    let Some(n_elements) = dims.iter().try_fold(1u64, |n, &d| {
        n.checked_mul(d).filter(|&n| n <= i64::MAX as u64)
    }) else {
        return Err(bad_shape("the element count overflows int64".into()));
    };
    let block = u64::from(ggml_type.block_elems());
    if dims.first().is_some_and(|&ne0| ne0 % block != 0) {
        return Err(bad_shape(format!(
            "ne[0] is not a multiple of the {ggml_type} block size {block}"
        )));
    }
    let Some(n_bytes) = (n_elements / block).checked_mul(ggml_type.block_bytes().into()) else {
        return Err(bad_shape("the byte count overflows".into()));
    };
    if offset % alignment != 0 {
        return Err(GgufError::MisalignedOffset {
            file: file.to_path_buf(),
            tensor: name,
            offset,
            alignment,
        });
    }
    Ok(TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
        data_offset: 0,
        n_elements,
        n_bytes,
        info_offset,
    })
}
