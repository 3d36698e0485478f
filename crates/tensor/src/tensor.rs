//! The tensor: dtype + shape + owned or shared bytes.

use bytes::Bytes;

use crate::{AlignedBuf, DType, Element, Shape, TensorError};

#[derive(Clone)]
enum Data {
    Owned(AlignedBuf),
    /// Immutable shared bytes whose start is aligned for the dtype (checked on construction).
    Shared(Bytes),
}

/// A dense row-major tensor.
#[derive(Clone)]
pub struct Tensor {
    dtype: DType,
    shape: Shape,
    data: Data,
}

fn expected_bytes(dtype: DType, shape: &Shape) -> Result<(usize, usize), TensorError> {
    let numel = crate::checked_numel(shape.dims())
        .ok_or_else(|| TensorError::Overflow(shape.dims().to_vec()))?;
    let bytes = dtype
        .bytes_for(numel)
        .ok_or_else(|| TensorError::Overflow(shape.dims().to_vec()))?;
    Ok((numel, bytes))
}

fn check_len(dtype: DType, shape: &Shape, actual: usize) -> Result<(), TensorError> {
    let (numel, expected) = expected_bytes(dtype, shape)?;
    if expected != actual {
        return Err(TensorError::SizeMismatch {
            shape: shape.dims().to_vec(),
            dtype,
            numel,
            expected,
            actual,
        });
    }
    Ok(())
}

impl Tensor {
    /// A zero-filled tensor (all-false for bool).
    pub fn zeros(dtype: DType, shape: impl Into<Shape>) -> Result<Tensor, TensorError> {
        let shape = shape.into();
        let (_, bytes) = expected_bytes(dtype, &shape)?;
        Ok(Tensor {
            dtype,
            shape,
            data: Data::Owned(AlignedBuf::zeroed(bytes)),
        })
    }

    /// A tensor over an owned buffer whose length must match `dtype` and `shape`.
    pub fn from_buf(
        dtype: DType,
        shape: impl Into<Shape>,
        buf: AlignedBuf,
    ) -> Result<Tensor, TensorError> {
        let shape = shape.into();
        check_len(dtype, &shape, buf.len())?;
        Ok(Tensor {
            dtype,
            shape,
            data: Data::Owned(buf),
        })
    }

    /// A tensor holding a copy of `values`.
    pub fn from_slice<T: Element>(
        shape: impl Into<Shape>,
        values: &[T],
    ) -> Result<Tensor, TensorError> {
        Self::from_buf(
            T::DTYPE,
            shape,
            AlignedBuf::from_bytes(bytemuck::cast_slice(values)),
        )
    }

    /// A tensor of `bool` values.
    pub fn from_bools(shape: impl Into<Shape>, values: &[bool]) -> Result<Tensor, TensorError> {
        let bytes: Vec<u8> = values.iter().map(|&b| b as u8).collect();
        Self::from_buf(DType::Bool, shape, AlignedBuf::from_bytes(&bytes))
    }

    /// A rank-0 tensor.
    pub fn scalar<T: Element>(value: T) -> Tensor {
        Self::from_slice(Shape::scalar(), &[value]).expect("one element fits a scalar shape")
    }

    /// A tensor over shared bytes (for example a slice of a memory-mapped file). The bytes are
    /// used in place when their start is aligned for `dtype`, and copied otherwise.
    pub fn from_bytes(
        dtype: DType,
        shape: impl Into<Shape>,
        bytes: Bytes,
    ) -> Result<Tensor, TensorError> {
        let shape = shape.into();
        check_len(dtype, &shape, bytes.len())?;
        let align = (dtype.bits() / 8).max(1);
        let data = if (bytes.as_ptr() as usize).is_multiple_of(align) {
            Data::Shared(bytes)
        } else {
            Data::Owned(AlignedBuf::from_bytes(&bytes))
        };
        Ok(Tensor { dtype, shape, data })
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    pub fn rank(&self) -> usize {
        self.shape.rank()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.numel()
    }

    /// Whether the bytes are borrowed from a shared buffer rather than owned.
    pub fn is_shared(&self) -> bool {
        matches!(self.data, Data::Shared(_))
    }

    pub fn as_bytes(&self) -> &[u8] {
        match &self.data {
            Data::Owned(buf) => buf.as_bytes(),
            Data::Shared(bytes) => bytes,
        }
    }

    /// Mutable bytes; shared data is copied into an owned buffer first.
    pub fn as_mut_bytes(&mut self) -> &mut [u8] {
        if let Data::Shared(bytes) = &self.data {
            self.data = Data::Owned(AlignedBuf::from_bytes(bytes));
        }
        match &mut self.data {
            Data::Owned(buf) => buf.as_mut_bytes(),
            Data::Shared(_) => unreachable!("shared data was just made owned"),
        }
    }

    /// A typed view; fails when `T` cannot view this dtype.
    pub fn as_slice<T: Element>(&self) -> Result<&[T], TensorError> {
        self.check_view::<T>()?;
        Ok(bytemuck::cast_slice(self.as_bytes()))
    }

    /// A mutable typed view; fails when `T` cannot view this dtype.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T], TensorError> {
        self.check_view::<T>()?;
        Ok(bytemuck::cast_slice_mut(self.as_mut_bytes()))
    }

    fn check_view<T: Element>(&self) -> Result<(), TensorError> {
        if T::views(self.dtype) {
            Ok(())
        } else {
            Err(TensorError::DTypeMismatch {
                expected: T::DTYPE,
                actual: self.dtype,
            })
        }
    }

    /// The same data under another shape with the same element count.
    pub fn reshape(mut self, shape: impl Into<Shape>) -> Result<Tensor, TensorError> {
        let shape = shape.into();
        let to_numel = crate::checked_numel(shape.dims())
            .ok_or_else(|| TensorError::Overflow(shape.dims().to_vec()))?;
        if to_numel != self.numel() {
            return Err(TensorError::Reshape {
                from_numel: self.numel(),
                from: self.shape.dims().to_vec(),
                to: shape.dims().to_vec(),
                to_numel,
            });
        }
        self.shape = shape;
        Ok(self)
    }

    /// Takes the owned buffer out (copying shared bytes), for reuse by an allocator.
    pub fn into_buf(self) -> AlignedBuf {
        match self.data {
            Data::Owned(buf) => buf,
            Data::Shared(bytes) => AlignedBuf::from_bytes(&bytes),
        }
    }

    /// Bytes the data occupies.
    pub fn nbytes(&self) -> usize {
        self.as_bytes().len()
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor<{}{}>", self.dtype, self.shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_views_check_dtype() {
        let t = Tensor::from_slice([2, 2], &[1.0f32, 2.0, 3.0, 4.0]).unwrap();
        assert_eq!(t.as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
        assert!(matches!(
            t.as_slice::<i32>(),
            Err(TensorError::DTypeMismatch { .. })
        ));
        let b = Tensor::from_bools([2], &[true, false]).unwrap();
        assert_eq!(b.as_slice::<u8>().unwrap(), &[1, 0]);
    }

    #[test]
    fn shared_bytes_are_borrowed_when_aligned_and_copied_when_not() {
        let words: Vec<u32> = (0..9).collect();
        let bytes = Bytes::copy_from_slice(bytemuck::cast_slice(&words));
        let aligned = bytes.slice(4..36);
        if (aligned.as_ptr() as usize).is_multiple_of(4) {
            let t = Tensor::from_bytes(DType::F32, [8], aligned).unwrap();
            assert!(t.is_shared());
        }
        let odd = bytes.slice(1..33);
        let t = Tensor::from_bytes(DType::U32, [8], odd.clone()).unwrap();
        assert_eq!(t.as_bytes(), &odd[..]);
        assert!((t.as_bytes().as_ptr() as usize).is_multiple_of(4));
    }

    #[test]
    fn size_and_overflow_are_checked() {
        assert!(matches!(
            Tensor::zeros(DType::F32, [usize::MAX, 2]),
            Err(TensorError::Overflow(_))
        ));
        let e = Tensor::from_bytes(DType::F32, [3], Bytes::from_static(&[0; 8])).unwrap_err();
        assert!(matches!(
            e,
            TensorError::SizeMismatch {
                expected: 12,
                actual: 8,
                ..
            }
        ));
        assert!(Tensor::zeros(DType::U4, [3]).unwrap().nbytes() == 2);
    }

    #[test]
    fn mutating_shared_data_copies_it() {
        let bytes = Bytes::from_static(&[0u8; 4]);
        let mut t = Tensor::from_bytes(DType::U8, [4], bytes.clone()).unwrap();
        t.as_mut_slice::<u8>().unwrap()[0] = 7;
        assert_eq!(bytes[0], 0);
        assert_eq!(t.as_slice::<u8>().unwrap()[0], 7);
    }
}
