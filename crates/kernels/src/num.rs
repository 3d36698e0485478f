//! Numeric element traits the reference kernels are generic over.
//!
//! Integer arithmetic wraps (two's complement, as onnxruntime's CPU kernels do); f16 and bf16
//! compute in f32 and round once per element.

use half::{bf16, f16};

/// An element type kernels compute with.
pub trait Scalar:
    Copy + Default + PartialOrd + PartialEq + Send + Sync + std::fmt::Debug + 'static
{
    const ZERO: Self;
    const ONE: Self;
    const IS_FLOAT: bool;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    /// `self · a + b`: rounded once for f32 and f64 (fused, as the matrix products
    /// accumulate), the product then the sum for the others.
    fn mul_add(self, a: Self, b: Self) -> Self {
        self.mul(a).add(b)
    }
    /// Integer division by zero yields 0 rather than trapping.
    fn div(self, o: Self) -> Self;
    fn to_f64(self) -> f64;
    /// Converts with `as` semantics (saturating float → int, NaN → 0).
    fn from_f64(v: f64) -> Self;
    fn to_f32(self) -> f32 {
        self.to_f64() as f32
    }
    fn from_f32(v: f32) -> Self {
        Self::from_f64(v as f64)
    }
    /// Integers exactly; floats truncated toward zero (saturating, NaN → 0).
    fn to_i128(self) -> i128;
    /// Integers keep the low bits (two's-complement wrap, like C++ `static_cast`); floats
    /// round to nearest.
    fn wrap_from_i128(v: i128) -> Self;
    fn min_value() -> Self;
    fn max_value() -> Self;
    fn is_nan(self) -> bool {
        false
    }
}

/// A floating-point element: math happens in `f32` (or `f64` for `f64`).
pub trait Float: Scalar {
    /// Applies `f` at f32 precision (f64 for f64 elements).
    fn map(self, f32_fn: impl Fn(f32) -> f32, f64_fn: impl Fn(f64) -> f64) -> Self;
}

macro_rules! int_scalar {
    ($($t:ty),*) => {$(
        impl Scalar for $t {
            const ZERO: Self = 0;
            const ONE: Self = 1;
            const IS_FLOAT: bool = false;
            fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            fn sub(self, o: Self) -> Self { self.wrapping_sub(o) }
            fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            fn div(self, o: Self) -> Self { if o == 0 { 0 } else { self.wrapping_div(o) } }
            fn to_f64(self) -> f64 { self as f64 }
            fn from_f64(v: f64) -> Self { v as $t }
            fn to_i128(self) -> i128 { self as i128 }
            fn wrap_from_i128(v: i128) -> Self { v as $t }
            fn min_value() -> Self { <$t>::MIN }
            fn max_value() -> Self { <$t>::MAX }
        }
    )*};
}
int_scalar!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! native_float {
    ($($t:ty),*) => {$(
        impl Scalar for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const IS_FLOAT: bool = true;
            fn add(self, o: Self) -> Self { self + o }
            fn sub(self, o: Self) -> Self { self - o }
            fn mul(self, o: Self) -> Self { self * o }
            fn mul_add(self, a: Self, b: Self) -> Self { <$t>::mul_add(self, a, b) }
            fn div(self, o: Self) -> Self { self / o }
            fn to_f64(self) -> f64 { self as f64 }
            fn from_f64(v: f64) -> Self { v as $t }
            fn to_i128(self) -> i128 { self as i128 }
            fn wrap_from_i128(v: i128) -> Self { v as $t }
            fn min_value() -> Self { <$t>::NEG_INFINITY }
            fn max_value() -> Self { <$t>::INFINITY }
            fn is_nan(self) -> bool { <$t>::is_nan(self) }
        }
    )*};
}
native_float!(f32, f64);

impl Float for f32 {
    fn map(self, f: impl Fn(f32) -> f32, _: impl Fn(f64) -> f64) -> Self {
        f(self)
    }
}

impl Float for f64 {
    fn map(self, _: impl Fn(f32) -> f32, f: impl Fn(f64) -> f64) -> Self {
        f(self)
    }
}

macro_rules! half_float {
    ($($t:ty),*) => {$(
        impl Scalar for $t {
            const ZERO: Self = <$t>::ZERO;
            const ONE: Self = <$t>::ONE;
            const IS_FLOAT: bool = true;
            fn add(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() + o.to_f32()) }
            fn sub(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() - o.to_f32()) }
            fn mul(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() * o.to_f32()) }
            fn div(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() / o.to_f32()) }
            fn to_f64(self) -> f64 { <$t>::to_f64(self) }
            fn from_f64(v: f64) -> Self { <$t>::from_f64(v) }
            fn to_f32(self) -> f32 { <$t>::to_f32(self) }
            fn from_f32(v: f32) -> Self { <$t>::from_f32(v) }
            fn to_i128(self) -> i128 { <$t>::to_f32(self) as i128 }
            fn wrap_from_i128(v: i128) -> Self { <$t>::from_f64(v as f64) }
            fn min_value() -> Self { <$t>::NEG_INFINITY }
            fn max_value() -> Self { <$t>::INFINITY }
            fn is_nan(self) -> bool { <$t>::is_nan(self) }
        }
        impl Float for $t {
            fn map(self, f: impl Fn(f32) -> f32, _: impl Fn(f64) -> f64) -> Self {
                <$t>::from_f32(f(<$t>::to_f32(self)))
            }
        }
    )*};
}
half_float!(f16, bf16);

/// `s` as f32 values, when `T` is f32 (a generic kernel's way onto its f32 fast path).
pub(crate) fn as_f32<T: 'static>(s: &[T]) -> Option<&[f32]> {
    // SAFETY: `T` is f32 (same type id), so the slice's memory is `s.len()` f32 values.
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>())
        .then(|| unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), s.len()) })
}

/// [`as_f32`] of a mutable slice.
pub(crate) fn as_f32_mut<T: 'static>(s: &mut [T]) -> Option<&mut [f32]> {
    // SAFETY: as in `as_f32`; the borrow is `s`'s.
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>())
        .then(|| unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), s.len()) })
}

/// One division or one product by a value, as a graph spells a scaling (`x / c` and
/// `x · (1 / c)` round differently, so the kernels keep the graph's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scale {
    Divide(f32),
    Multiply(f32),
}

impl Scale {
    /// `v` scaled.
    #[inline(always)]
    pub fn apply(self, v: f32) -> f32 {
        match self {
            Scale::Divide(c) => v / c,
            Scale::Multiply(c) => v * c,
        }
    }
}
