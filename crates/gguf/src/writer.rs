//! A small GGUF writer for tests and fixtures: metadata of every type, tensors with given
//! raw block bytes, versions 2 and 3, any power-of-two alignment.
//!
//! It writes what it is given; it does not quantize. Layout as in the
//! [crate docs](crate#file-layout).

use std::path::Path;

use crate::GgmlType;
use crate::parse::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT};
use crate::value::{Array, Value};

/// Builds a GGUF image in memory.
#[derive(Debug, Clone)]
pub struct GgufWriter {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty version-3 file with the default alignment (32, no `general.alignment` key).
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// The version written in the header (the layout of 2 and 3 is the same).
    pub fn version(&mut self, version: u32) -> &mut Self {
        self.version = version;
        self
    }

    /// Sets `general.alignment` (a power of two) and aligns the data to it.
    pub fn alignment(&mut self, alignment: u32) -> &mut Self {
        assert!(
            alignment.is_power_of_two(),
            "alignment must be a power of two"
        );
        self.alignment = alignment.into();
        self.kv(ALIGNMENT_KEY, Value::U32(alignment))
    }

    /// Adds a metadata entry (in order; duplicates are written as given).
    pub fn kv(&mut self, key: &str, value: Value) -> &mut Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Adds a tensor with `dims` (ne, fastest first) and its raw data.
    ///
    /// # Panics
    /// If `data` is not the size `dims` and `ty` need.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> &mut Self {
        let n: u64 = dims.iter().product();
        let expected = n / u64::from(ty.block_elems()) * u64::from(ty.block_bytes());
        assert_eq!(data.len() as u64, expected, "data size of tensor '{name}'");
        self.tensors
            .push((name.to_string(), dims.to_vec(), ty, data));
        self
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            write_str(&mut out, key);
            out.extend_from_slice(&value.value_type().id().to_le_bytes());
            write_value(&mut out, value);
        }
        let mut offset = 0u64;
        for (name, dims, ty, data) in &self.tensors {
            write_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + data.len() as u64).next_multiple_of(self.alignment);
        }
        for (_, _, _, data) in &self.tensors {
            pad(&mut out, self.alignment);
            out.extend_from_slice(data);
        }
        if !self.tensors.is_empty() {
            pad(&mut out, self.alignment);
        }
        out
    }

    /// Writes the file.
    pub fn write(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        std::fs::write(path, self.to_bytes())
    }
}

fn pad(out: &mut Vec<u8>, alignment: u64) {
    let len = (out.len() as u64).next_multiple_of(alignment) as usize;
    out.resize(len, 0);
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => out.push(*v),
        Value::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::String(v) => write_str(out, v),
        Value::Array(a) => write_array(out, a),
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
    }
}

fn write_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&a.elem_type().id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    fn each<T: Copy, const N: usize>(out: &mut Vec<u8>, v: &[T], f: fn(T) -> [u8; N]) {
        for &x in v {
            out.extend_from_slice(&f(x));
        }
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => each(out, v, i8::to_le_bytes),
        Array::U16(v) => each(out, v, u16::to_le_bytes),
        Array::I16(v) => each(out, v, i16::to_le_bytes),
        Array::U32(v) => each(out, v, u32::to_le_bytes),
        Array::I32(v) => each(out, v, i32::to_le_bytes),
        Array::F32(v) => each(out, v, f32::to_le_bytes),
        Array::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        Array::String(v) => v.iter().for_each(|s| write_str(out, s)),
        Array::Array(v) => v.iter().for_each(|a| write_array(out, a)),
        Array::U64(v) => each(out, v, u64::to_le_bytes),
        Array::I64(v) => each(out, v, i64::to_le_bytes),
        Array::F64(v) => each(out, v, f64::to_le_bytes),
    }
}
