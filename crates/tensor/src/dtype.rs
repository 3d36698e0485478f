//! Element types, numbered as ONNX's `TensorProto.DataType` so conversions are one table.

use half::{bf16, f16};

/// The element type of a tensor.
///
/// `Bool` is stored as one byte per element (0 or 1). `U4`/`I4` are packed two per byte,
/// element `2i` in the low nibble of byte `i` (ONNX's packing). `F8E8M0` is the exponent-only
/// byte of microscaling formats (`2^(e - 127)`, 255 is NaN): the block scales of MXFP4, read
/// as raw bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    I64,
    I32,
    I16,
    I8,
    U64,
    U32,
    U16,
    U8,
    Bool,
    U4,
    I4,
    F8E8M0,
}

impl DType {
    /// All dtypes, for exhaustive tests and tables.
    pub const ALL: [DType; 16] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U64,
        DType::U32,
        DType::U16,
        DType::U8,
        DType::Bool,
        DType::U4,
        DType::I4,
        DType::F8E8M0,
    ];

    /// The `TensorProto.DataType` code, or `None` for codes oxgen does not handle
    /// (strings, complex, float8, float4).
    pub fn from_onnx(code: i32) -> Option<DType> {
        Some(match code {
            1 => DType::F32,
            2 => DType::U8,
            3 => DType::I8,
            4 => DType::U16,
            5 => DType::I16,
            6 => DType::I32,
            7 => DType::I64,
            9 => DType::Bool,
            10 => DType::F16,
            11 => DType::F64,
            12 => DType::U32,
            13 => DType::U64,
            16 => DType::BF16,
            21 => DType::U4,
            22 => DType::I4,
            24 => DType::F8E8M0,
            _ => return None,
        })
    }

    /// The `TensorProto.DataType` code.
    pub fn to_onnx(self) -> i32 {
        match self {
            DType::F32 => 1,
            DType::U8 => 2,
            DType::I8 => 3,
            DType::U16 => 4,
            DType::I16 => 5,
            DType::I32 => 6,
            DType::I64 => 7,
            DType::Bool => 9,
            DType::F16 => 10,
            DType::F64 => 11,
            DType::U32 => 12,
            DType::U64 => 13,
            DType::BF16 => 16,
            DType::U4 => 21,
            DType::I4 => 22,
            DType::F8E8M0 => 24,
        }
    }

    /// ONNX's name for a `TensorProto.DataType` code, for error messages about codes that
    /// have no `DType`.
    pub fn onnx_name(code: i32) -> &'static str {
        const NAMES: [&str; 26] = [
            "UNDEFINED",
            "FLOAT",
            "UINT8",
            "INT8",
            "UINT16",
            "INT16",
            "INT32",
            "INT64",
            "STRING",
            "BOOL",
            "FLOAT16",
            "DOUBLE",
            "UINT32",
            "UINT64",
            "COMPLEX64",
            "COMPLEX128",
            "BFLOAT16",
            "FLOAT8E4M3FN",
            "FLOAT8E4M3FNUZ",
            "FLOAT8E5M2",
            "FLOAT8E5M2FNUZ",
            "UINT4",
            "INT4",
            "FLOAT4E2M1",
            "FLOAT8E8M0",
            "UINT2",
        ];
        usize::try_from(code)
            .ok()
            .and_then(|i| NAMES.get(i))
            .copied()
            .unwrap_or("unknown")
    }

    /// Bits per element.
    pub fn bits(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 64,
            DType::F32 | DType::I32 | DType::U32 => 32,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 16,
            DType::I8 | DType::U8 | DType::Bool | DType::F8E8M0 => 8,
            DType::U4 | DType::I4 => 4,
        }
    }

    /// Bytes needed for `numel` elements (sub-byte types round up), or `None` on overflow.
    pub fn bytes_for(self, numel: usize) -> Option<usize> {
        match self.bits() {
            4 => Some(numel.div_ceil(2)),
            bits => numel.checked_mul(bits / 8),
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    pub fn is_signed_int(self) -> bool {
        matches!(
            self,
            DType::I64 | DType::I32 | DType::I16 | DType::I8 | DType::I4
        )
    }

    pub fn is_unsigned_int(self) -> bool {
        matches!(
            self,
            DType::U64 | DType::U32 | DType::U16 | DType::U8 | DType::U4
        )
    }

    /// Lower-case name as used in ONNX docs and oxgen's output (`float32`, `bfloat16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::I16 => "int16",
            DType::I8 => "int8",
            DType::U64 => "uint64",
            DType::U32 => "uint32",
            DType::U16 => "uint16",
            DType::U8 => "uint8",
            DType::Bool => "bool",
            DType::U4 => "uint4",
            DType::I4 => "int4",
            DType::F8E8M0 => "float8e8m0",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that can view tensor storage.
///
/// `u8` views `U8`, `Bool` (bytes 0/1) and `F8E8M0` (raw exponents) tensors; sub-byte types have no
/// element type and are read as raw bytes.
pub trait Element: bytemuck::Pod + Send + Sync + std::fmt::Debug + PartialEq + 'static {
    /// The dtype a tensor built from this type gets.
    const DTYPE: DType;

    /// Whether a tensor of `dtype` can be viewed as this type.
    fn views(dtype: DType) -> bool {
        dtype == Self::DTYPE
    }
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}

element!(f32 => F32, f64 => F64, f16 => F16, bf16 => BF16, i64 => I64, i32 => I32,
    i16 => I16, i8 => I8, u64 => U64, u32 => U32, u16 => U16);

impl Element for u8 {
    const DTYPE: DType = DType::U8;
    fn views(dtype: DType) -> bool {
        matches!(dtype, DType::U8 | DType::Bool | DType::F8E8M0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn onnx_codes_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_onnx(d.to_onnx()), Some(d));
        }
        assert_eq!(DType::from_onnx(8), None, "strings are not a DType");
        assert_eq!(DType::onnx_name(8), "STRING");
        assert_eq!(DType::onnx_name(-3), "unknown");
    }

    #[test]
    fn sub_byte_sizes_round_up() {
        assert_eq!(DType::U4.bytes_for(3), Some(2));
        assert_eq!(DType::F32.bytes_for(usize::MAX), None);
    }
}
