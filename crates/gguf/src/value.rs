//! Metadata values: the 13 `gguf_metadata_value_type`s of ggml's `docs/gguf.md`.
//!
//! Arrays are stored typed (`Vec<u32>`, `Vec<String>`, ...) rather than as a vector of
//! [`Value`]s, so an array costs about as much memory as its bytes in the file, and accessors
//! such as [`crate::GgufFile::get_i32_array`] can lend a slice.

use std::fmt;

/// The type tag of a metadata value (`gguf_metadata_value_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    /// The type with this id, or `None` for ids the spec does not define.
    pub fn from_id(id: u32) -> Option<ValueType> {
        Some(match id {
            0 => ValueType::U8,
            1 => ValueType::I8,
            2 => ValueType::U16,
            3 => ValueType::I16,
            4 => ValueType::U32,
            5 => ValueType::I32,
            6 => ValueType::F32,
            7 => ValueType::Bool,
            8 => ValueType::String,
            9 => ValueType::Array,
            10 => ValueType::U64,
            11 => ValueType::I64,
            12 => ValueType::F64,
            _ => return None,
        })
    }

    /// The id written in files.
    pub fn id(self) -> u32 {
        match self {
            ValueType::U8 => 0,
            ValueType::I8 => 1,
            ValueType::U16 => 2,
            ValueType::I16 => 3,
            ValueType::U32 => 4,
            ValueType::I32 => 5,
            ValueType::F32 => 6,
            ValueType::Bool => 7,
            ValueType::String => 8,
            ValueType::Array => 9,
            ValueType::U64 => 10,
            ValueType::I64 => 11,
            ValueType::F64 => 12,
        }
    }

    /// The spec's name (`"uint32"`, `"string"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "uint8",
            ValueType::I8 => "int8",
            ValueType::U16 => "uint16",
            ValueType::I16 => "int16",
            ValueType::U32 => "uint32",
            ValueType::I32 => "int32",
            ValueType::F32 => "float32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "uint64",
            ValueType::I64 => "int64",
            ValueType::F64 => "float64",
        }
    }

    /// Bytes of one value in a file, for fixed-size types.
    pub(crate) fn fixed_size(self) -> Option<u64> {
        Some(match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
            ValueType::U16 | ValueType::I16 => 2,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
            ValueType::U64 | ValueType::I64 | ValueType::F64 => 8,
            ValueType::String | ValueType::Array => return None,
        })
    }

    /// The fewest bytes one value of this type can take in a file: a string's length prefix,
    /// an array's type tag and length. Used to reject absurd counts before allocating.
    pub(crate) fn min_size(self) -> u64 {
        match self {
            ValueType::String => 8,
            ValueType::Array => 4 + 8,
            fixed => fixed.fixed_size().unwrap_or(1),
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A metadata array: its element type and values. Arrays may nest.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// A description of the type for messages: `"uint32"`, `"array of string"`,
    /// `"array of array of int32"`.
    pub fn type_description(&self) -> String {
        match self {
            Value::Array(a) => a.type_description(),
            v => v.value_type().name().to_string(),
        }
    }

    /// The value as an integer, for any of the eight integer types.
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }
}

impl Array {
    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `"array of <elem>"`; nested arrays name their first element's type (`"array of array
    /// of int32"`), or just `"array of array"` when empty.
    pub fn type_description(&self) -> String {
        match self {
            Array::Array(inner) => match inner.first() {
                Some(first) => format!("array of {}", first.type_description()),
                None => "array of array".to_string(),
            },
            a => format!("array of {}", a.elem_type().name()),
        }
    }
}

/// Writes up to `limit` items, then `", ... (N items)"`.
fn list<T>(
    f: &mut fmt::Formatter<'_>,
    items: &[T],
    limit: usize,
    item: impl Fn(&mut fmt::Formatter<'_>, &T) -> fmt::Result,
) -> fmt::Result {
    f.write_str("[")?;
    for (i, v) in items.iter().take(limit).enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        item(f, v)?;
    }
    if items.len() > limit {
        write!(f, ", ... ({} items)", items.len())?;
    }
    f.write_str("]")
}

/// Arrays show their first few items; `{:#}` shows them all. Strings print `Debug`-quoted.
impl fmt::Display for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = if f.alternate() { usize::MAX } else { 8 };
        match self {
            Array::U8(v) => list(f, v, n, |f, x| write!(f, "{x}")),
            Array::I8(v) => list(f, v, n, |f, x| write!(f, "{x}")),
            Array::U16(v) => list(f, v, n, |f, x| write!(f, "{x}")),
            Array::I16(v) => list(f, v, n, |f, x| write!(f, "{x}")),
            Array::U32(v) => list(f, v, n, |f, x| write!(f, "{x}")),
            Array::I32(v) => list(f, v, n, |f, x| write!(f, "{x}")),
            Array::F32(v) => list(f, v, n, |f, x| write!(f, "{x:?}")),
            Array::Bool(v) => list(f, v, n, |f, x| write!(f, "{x}")),
            Array::String(v) => list(f, v, n, |f, x| write!(f, "{x:?}")),
            Array::Array(v) => list(f, v, n, |f, x| fmt::Display::fmt(x, f)),
            Array::U64(v) => list(f, v, n, |f, x| write!(f, "{x}")),
            Array::I64(v) => list(f, v, n, |f, x| write!(f, "{x}")),
            Array::F64(v) => list(f, v, n, |f, x| write!(f, "{x:?}")),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v:?}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(v) => write!(f, "{v:?}"),
            Value::Array(a) => fmt::Display::fmt(a, f),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v:?}"),
        }
    }
}
