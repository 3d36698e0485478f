//! Decoding `TensorProto` into [`Tensor`]: dims, dtypes, `raw_data` and the typed fields.
//!
//! Storage rules follow the comments on `TensorProto` in `onnx.proto` (onnx 1.22) and the
//! reference reader `onnx.numpy_helper.to_array`:
//! - `raw_data` is little-endian, fixed width; bool is one byte per element; int4/uint4 are
//!   packed two per byte, first element in the low nibble (`numel.div_ceil(2)` bytes).
//! - Without `raw_data`, values sit in the field of their dtype: `float_data` (float32),
//!   `double_data` (float64), `int64_data` (int64), `uint64_data` (uint32, uint64) and
//!   `int32_data` for everything else: int32, int16, int8, uint16, uint8, bool, and the
//!   bit patterns of float16/bfloat16, one element per entry, while int4/uint4 keep one packed
//!   byte (two elements) per entry. Narrow values keep their low bits, as the reference does;
//!   bools become 0/1.
//!
//! `raw_data` decoded from a [`bytes::Bytes`] buffer is borrowed in place when aligned
//! ([`Tensor::from_bytes`]). All sizes are checked before anything is allocated: a buffer is
//! only ever allocated for values that are already present in the decoded message. This
//! reader assumes a little-endian host, as the whole of oxgen does.

use std::path::Path;

use bytes::Bytes;
use oxgen_tensor::{AlignedBuf, DType, Tensor};
use prost::Message;

use crate::OnnxError;
use crate::proto::TensorProto;
use crate::proto::tensor_proto::DataLocation;

/// Largest element count accepted from a file: the bytes of any dtype must fit in an
/// allocation (`isize::MAX` bytes), and the widest dtype has 8 bytes per element.
pub const MAX_ELEMENTS: usize = isize::MAX as usize / 8;

/// The tensor's name for messages.
pub(crate) fn name_of(t: &TensorProto) -> String {
    match t.name.as_deref() {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => "<unnamed>".to_string(),
    }
}

/// Whether the tensor's data lives in an external file.
pub(crate) fn is_external(t: &TensorProto) -> bool {
    t.data_location == Some(DataLocation::External as i32)
}

/// The dimensions of `t`, checked: no negative dimension, and an element count that neither
/// overflows nor exceeds [`MAX_ELEMENTS`].
pub fn dims_of(t: &TensorProto) -> Result<Vec<usize>, OnnxError> {
    dims_in(t, Path::new(""))
}

/// [`dims_of`], naming `file` in errors.
pub(crate) fn dims_in(t: &TensorProto, file: &Path) -> Result<Vec<usize>, OnnxError> {
    let bad = |problem: String| OnnxError::BadDims {
        file: file.to_path_buf(),
        tensor: name_of(t),
        dims: t.dims.clone(),
        problem,
    };
    let mut dims = Vec::with_capacity(t.dims.len());
    let mut numel: usize = 1;
    for (axis, &d) in t.dims.iter().enumerate() {
        let d =
            usize::try_from(d).map_err(|_| bad(format!("dimension {axis} is negative ({d})")))?;
        numel = numel
            .checked_mul(d)
            .filter(|&n| n <= MAX_ELEMENTS)
            .ok_or_else(|| bad(format!("the element count exceeds {MAX_ELEMENTS}")))?;
        dims.push(d);
    }
    Ok(dims)
}

/// The dtype of `t`, or [`OnnxError::UnsupportedDType`].
pub(crate) fn dtype_in(t: &TensorProto, file: &Path) -> Result<DType, OnnxError> {
    let code = t.data_type.unwrap_or(0);
    DType::from_onnx(code).ok_or_else(|| OnnxError::UnsupportedDType {
        file: file.to_path_buf(),
        tensor: name_of(t),
        code,
        type_name: DType::onnx_name(code),
    })
}

/// Decodes a `TensorProto` whose data is inside the message (`raw_data` or a typed field).
///
/// Tensors with `data_location = EXTERNAL` need the model's folder: decode them with
/// [`crate::Model::tensor`].
pub fn tensor_from_proto(t: &TensorProto) -> Result<Tensor, OnnxError> {
    decode_inline(t, Path::new(""))
}

/// Reads a standalone serialized `TensorProto` (such as an ONNX node test's
/// `test_data_set_0/input_0.pb`) and returns its name (empty when unnamed) and value.
pub fn load_tensor_file(path: &Path) -> Result<(String, Tensor), OnnxError> {
    let bytes = crate::model::map_file(path)?;
    let t = TensorProto::decode(bytes).map_err(|source| OnnxError::Decode {
        file: path.to_path_buf(),
        message: "TensorProto",
        source,
    })?;
    let tensor = decode_inline(&t, path)?;
    Ok((t.name.unwrap_or_default(), tensor))
}

/// Checks the parts of `t` common to inline and external data: no segment, a supported
/// dtype and valid dims. Returns the dtype, dims and the byte size the data must have.
pub(crate) fn header(
    t: &TensorProto,
    file: &Path,
) -> Result<(DType, Vec<usize>, usize), OnnxError> {
    if t.segment.is_some() {
        return Err(bad_tensor(
            t,
            file,
            "segment",
            "segmented tensors are not supported; re-save the model with whole tensors".into(),
        ));
    }
    let dtype = dtype_in(t, file)?;
    let dims = dims_in(t, file)?;
    let numel = dims.iter().product::<usize>();
    // Cannot fail: numel <= MAX_ELEMENTS, so numel * 8 fits in usize.
    let nbytes = dtype.bytes_for(numel).ok_or_else(|| {
        bad_tensor(
            t,
            file,
            "dims",
            format!("{numel} elements of {dtype} overflow usize"),
        )
    })?;
    Ok((dtype, dims, nbytes))
}

pub(crate) fn bad_tensor(
    t: &TensorProto,
    file: &Path,
    field: &'static str,
    problem: String,
) -> OnnxError {
    OnnxError::BadTensor {
        file: file.to_path_buf(),
        tensor: name_of(t),
        field,
        problem,
    }
}

/// Decodes a tensor whose data is inside the message, naming `file` in errors.
pub(crate) fn decode_inline(t: &TensorProto, file: &Path) -> Result<Tensor, OnnxError> {
    let (dtype, dims, nbytes) = header(t, file)?;
    if is_external(t) {
        return Err(bad_tensor(
            t,
            file,
            "data_location",
            "the data is in an external file, which needs the model's folder; decode it with Model::tensor".into(),
        ));
    }
    let field = typed_field(dtype);
    check_other_fields_empty(t, file, dtype, field)?;
    let count_err = |field: &'static str, unit, expected, actual| OnnxError::DataCount {
        file: file.to_path_buf(),
        tensor: name_of(t),
        field,
        dtype,
        dims: dims.clone(),
        unit,
        expected,
        actual,
    };

    if let Some(raw) = &t.raw_data {
        if field_len(t, field) != 0 {
            return Err(bad_tensor(
                t,
                file,
                field.name(),
                "both raw_data and this field hold data; keep one".into(),
            ));
        }
        if raw.len() != nbytes {
            return Err(count_err("raw_data", "bytes", nbytes, raw.len()));
        }
        return from_bytes(t, file, dtype, &dims, raw.clone());
    }

    let numel: usize = dims.iter().product();
    let expected = if dtype.bits() == 4 {
        numel.div_ceil(2)
    } else {
        numel
    };
    let actual = field_len(t, field);
    if actual != expected {
        return Err(count_err(field.name(), "values", expected, actual));
    }
    // The buffer is sized from values already in memory: `actual` entries, at most 8 bytes each.
    let buf = match (field, dtype) {
        (Field::Float, _) => fill(&t.float_data, |v| v.to_le_bytes()),
        (Field::Double, _) => fill(&t.double_data, |v| v.to_le_bytes()),
        (Field::Int64, _) => fill(&t.int64_data, |v| v.to_le_bytes()),
        (Field::Uint64, DType::U32) => fill(&t.uint64_data, |v| (v as u32).to_le_bytes()),
        (Field::Uint64, _) => fill(&t.uint64_data, |v| v.to_le_bytes()),
        (Field::Int32, DType::I32) => fill(&t.int32_data, |v| v.to_le_bytes()),
        (Field::Int32, DType::Bool) => fill(&t.int32_data, |v| [u8::from(v != 0)]),
        (Field::Int32, d) if d.bits() == 16 => fill(&t.int32_data, |v| (v as u16).to_le_bytes()),
        (Field::Int32, _) => fill(&t.int32_data, |v| [v as u8]),
    };
    Tensor::from_buf(dtype, dims.as_slice(), buf)
        .map_err(|e| bad_tensor(t, file, field.name(), e.to_string()))
}

/// Wraps checked bytes (raw or external) in a tensor, borrowing them when aligned.
pub(crate) fn from_bytes(
    t: &TensorProto,
    file: &Path,
    dtype: DType,
    dims: &[usize],
    bytes: Bytes,
) -> Result<Tensor, OnnxError> {
    Tensor::from_bytes(dtype, dims, bytes)
        .map_err(|e| bad_tensor(t, file, "raw_data", e.to_string()))
}

fn fill<T: Copy, const N: usize>(values: &[T], to_le: impl Fn(T) -> [u8; N]) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(values.len() * N);
    for (dst, &v) in buf.as_mut_bytes().chunks_exact_mut(N).zip(values) {
        dst.copy_from_slice(&to_le(v));
    }
    buf
}

/// The typed `TensorProto` fields that can hold numeric data.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Float,
    Int32,
    Int64,
    Double,
    Uint64,
}

impl Field {
    const ALL: [Field; 5] = [
        Field::Float,
        Field::Int32,
        Field::Int64,
        Field::Double,
        Field::Uint64,
    ];

    fn name(self) -> &'static str {
        match self {
            Field::Float => "float_data",
            Field::Int32 => "int32_data",
            Field::Int64 => "int64_data",
            Field::Double => "double_data",
            Field::Uint64 => "uint64_data",
        }
    }
}

/// The typed field that holds values of `dtype` when `raw_data` is absent.
fn typed_field(dtype: DType) -> Field {
    match dtype {
        DType::F32 => Field::Float,
        DType::F64 => Field::Double,
        DType::I64 => Field::Int64,
        DType::U32 | DType::U64 => Field::Uint64,
        DType::I32
        | DType::I16
        | DType::I8
        | DType::U16
        | DType::U8
        | DType::Bool
        | DType::F16
        | DType::BF16
        | DType::U4
        | DType::I4
        | DType::F8E8M0 => Field::Int32,
    }
}

fn field_len(t: &TensorProto, field: Field) -> usize {
    match field {
        Field::Float => t.float_data.len(),
        Field::Int32 => t.int32_data.len(),
        Field::Int64 => t.int64_data.len(),
        Field::Double => t.double_data.len(),
        Field::Uint64 => t.uint64_data.len(),
    }
}

/// Rejects data in fields that `dtype` does not use (the spec says they MUST be empty), so a
/// mislabelled tensor is reported instead of read as zeros.
fn check_other_fields_empty(
    t: &TensorProto,
    file: &Path,
    dtype: DType,
    field: Field,
) -> Result<(), OnnxError> {
    if !t.string_data.is_empty() {
        return Err(bad_tensor(
            t,
            file,
            "string_data",
            format!("a {dtype} tensor must not have string data"),
        ));
    }
    for other in Field::ALL {
        if other != field && field_len(t, other) != 0 {
            return Err(bad_tensor(
                t,
                file,
                other.name(),
                format!(
                    "a {dtype} tensor keeps its values in {} or raw_data, not here",
                    field.name()
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxgen_tensor::{bf16, f16};

    fn proto(dtype: DType, dims: &[i64]) -> TensorProto {
        TensorProto {
            name: Some("t".into()),
            data_type: Some(dtype.to_onnx()),
            dims: dims.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn typed_fields_decode_every_dtype() {
        let mut t = proto(DType::F32, &[2]);
        t.float_data = vec![1.5, -2.0];
        assert_eq!(
            tensor_from_proto(&t).unwrap().as_slice::<f32>().unwrap(),
            &[1.5, -2.0]
        );

        let mut t = proto(DType::F16, &[2]);
        t.int32_data = vec![
            f16::from_f32(1.5).to_bits() as i32,
            f16::from_f32(-2.0).to_bits() as i32,
        ];
        let v = tensor_from_proto(&t).unwrap();
        assert_eq!(
            v.as_slice::<f16>().unwrap(),
            &[f16::from_f32(1.5), f16::from_f32(-2.0)]
        );

        let mut t = proto(DType::BF16, &[1]);
        t.int32_data = vec![bf16::from_f32(3.0).to_bits() as i32];
        assert_eq!(
            tensor_from_proto(&t).unwrap().as_slice::<bf16>().unwrap(),
            &[bf16::from_f32(3.0)]
        );

        let mut t = proto(DType::I8, &[3]);
        t.int32_data = vec![-1, 127, -128];
        assert_eq!(
            tensor_from_proto(&t).unwrap().as_slice::<i8>().unwrap(),
            &[-1, 127, -128]
        );

        let mut t = proto(DType::U16, &[1]);
        t.int32_data = vec![65535];
        assert_eq!(
            tensor_from_proto(&t).unwrap().as_slice::<u16>().unwrap(),
            &[65535]
        );

        let mut t = proto(DType::Bool, &[3]);
        t.int32_data = vec![0, 1, 5];
        assert_eq!(
            tensor_from_proto(&t).unwrap().as_slice::<u8>().unwrap(),
            &[0, 1, 1]
        );

        let mut t = proto(DType::U32, &[2]);
        t.uint64_data = vec![7, u32::MAX as u64];
        assert_eq!(
            tensor_from_proto(&t).unwrap().as_slice::<u32>().unwrap(),
            &[7, u32::MAX]
        );

        let mut t = proto(DType::U64, &[1]);
        t.uint64_data = vec![u64::MAX];
        assert_eq!(
            tensor_from_proto(&t).unwrap().as_slice::<u64>().unwrap(),
            &[u64::MAX]
        );

        let mut t = proto(DType::I64, &[]);
        t.int64_data = vec![-9];
        let v = tensor_from_proto(&t).unwrap();
        assert_eq!((v.rank(), v.as_slice::<i64>().unwrap()), (0, &[-9i64][..]));

        let mut t = proto(DType::F64, &[1]);
        t.double_data = vec![0.25];
        assert_eq!(
            tensor_from_proto(&t).unwrap().as_slice::<f64>().unwrap(),
            &[0.25]
        );

        let mut t = proto(DType::I32, &[2]);
        t.int32_data = vec![i32::MIN, 3];
        assert_eq!(
            tensor_from_proto(&t).unwrap().as_slice::<i32>().unwrap(),
            &[i32::MIN, 3]
        );
    }

    #[test]
    fn int4_int32_data_holds_one_packed_byte_per_entry() {
        // Three int4 elements 1, -1, 7: bytes 0xF1, 0x07.
        let mut t = proto(DType::I4, &[3]);
        t.int32_data = vec![0xF1, 0x07];
        let v = tensor_from_proto(&t).unwrap();
        assert_eq!(v.as_bytes(), &[0xF1, 0x07]);
        t.int32_data = vec![0xF1, 0x07, 0];
        assert!(matches!(
            tensor_from_proto(&t),
            Err(OnnxError::DataCount {
                expected: 2,
                actual: 3,
                ..
            })
        ));
    }

    #[test]
    fn raw_data_is_borrowed_from_the_message_buffer() {
        let mut t = proto(DType::U8, &[4]);
        t.raw_data = Some(Bytes::from_static(&[1, 2, 3, 4]));
        let encoded = Bytes::from(t.encode_to_vec());
        let decoded = TensorProto::decode(encoded.clone()).unwrap();
        let v = tensor_from_proto(&decoded).unwrap();
        assert!(v.is_shared());
        let range = encoded.as_ptr_range();
        assert!(
            range.contains(&v.as_bytes().as_ptr()),
            "raw_data must point into the encoded buffer"
        );
    }

    #[test]
    fn bad_tensors_are_rejected_with_their_name() {
        let mut t = proto(DType::F32, &[3]);
        t.float_data = vec![1.0];
        let e = tensor_from_proto(&t).unwrap_err();
        assert!(matches!(
            e,
            OnnxError::DataCount {
                field: "float_data",
                expected: 3,
                actual: 1,
                ..
            }
        ));
        assert!(e.to_string().contains("tensor 't'"), "{e}");

        let mut t = proto(DType::F32, &[2]);
        t.raw_data = Some(Bytes::from_static(&[0; 7]));
        assert!(matches!(
            tensor_from_proto(&t),
            Err(OnnxError::DataCount {
                field: "raw_data",
                ..
            })
        ));

        let mut t = proto(DType::F32, &[1]);
        t.int64_data = vec![1];
        assert!(matches!(
            tensor_from_proto(&t),
            Err(OnnxError::BadTensor {
                field: "int64_data",
                ..
            })
        ));

        let t = proto(DType::F32, &[-1]);
        assert!(matches!(
            tensor_from_proto(&t),
            Err(OnnxError::BadDims { .. })
        ));
        let t = proto(DType::F32, &[1 << 40, 1 << 40]);
        assert!(matches!(dims_of(&t), Err(OnnxError::BadDims { .. })));
        let t = proto(DType::U8, &[1 << 62]);
        assert!(matches!(dims_of(&t), Err(OnnxError::BadDims { .. })));

        let mut t = proto(DType::F32, &[1]);
        t.data_type = Some(8);
        let e = tensor_from_proto(&t).unwrap_err();
        assert!(matches!(
            e,
            OnnxError::UnsupportedDType {
                code: 8,
                type_name: "STRING",
                ..
            }
        ));
        assert!(
            e.to_string().contains("STRING") && e.to_string().contains("<in-memory>"),
            "{e}"
        );

        let mut t = proto(DType::F32, &[1]);
        t.data_location = Some(DataLocation::External as i32);
        assert!(matches!(
            tensor_from_proto(&t),
            Err(OnnxError::BadTensor {
                field: "data_location",
                ..
            })
        ));
    }

    #[test]
    fn empty_tensors_need_no_data() {
        let t = proto(DType::F32, &[0, 3]);
        let v = tensor_from_proto(&t).unwrap();
        assert_eq!((v.dims(), v.nbytes()), (&[0usize, 3][..], 0));
    }
}
