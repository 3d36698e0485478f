//! Accumulator types: the precision each element type reduces in.
//!
//! Contract: f16 and bf16 widen to f32, accumulate there and round once when the result is
//! stored (as onnxruntime's CPU kernels do for half types); f32 accumulates in f32, f64 in
//! f64; integers accumulate in their own type with wrapping arithmetic. Kernels that reduce
//! (matmul, reductions, softmax, normalization) are generic over [`Accum`], so one code path
//! serves every type and the reduction order is the same for all of them.

use half::{bf16, f16};

use crate::Scalar;

/// An element type with the accumulator it reduces in.
pub trait Accum: Scalar {
    /// The type sums, products and statistics are computed in.
    type Acc: AccScalar;
    /// Converts to the accumulator type (exact for every implementing type).
    fn widen(self) -> Self::Acc;
    /// Rounds an accumulated value back to the element type (once, to nearest for floats;
    /// `as` semantics for integers).
    fn narrow(acc: Self::Acc) -> Self;
}

/// Math an accumulator needs beyond [`Scalar`]'s arithmetic. Integers compute these through
/// f64 and truncate back.
pub trait AccScalar: Scalar {
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    fn abs(self) -> Self;
    /// Whether the value is a finite number (always true for integers).
    fn is_finite(self) -> bool;
}

macro_rules! acc_float {
    ($($t:ty),*) => {$(
        impl AccScalar for $t {
            fn exp(self) -> Self { <$t>::exp(self) }
            fn ln(self) -> Self { <$t>::ln(self) }
            fn sqrt(self) -> Self { <$t>::sqrt(self) }
            fn abs(self) -> Self { <$t>::abs(self) }
            fn is_finite(self) -> bool { <$t>::is_finite(self) }
        }
        impl Accum for $t {
            type Acc = $t;
            fn widen(self) -> $t { self }
            fn narrow(acc: $t) -> $t { acc }
        }
    )*};
}
acc_float!(f32, f64);

macro_rules! acc_half {
    ($($t:ty),*) => {$(
        impl Accum for $t {
            type Acc = f32;
            fn widen(self) -> f32 { <$t>::to_f32(self) }
            fn narrow(acc: f32) -> $t { <$t>::from_f32(acc) }
        }
    )*};
}
acc_half!(f16, bf16);

macro_rules! acc_int {
    ($($t:ty => $abs:expr),*) => {$(
        impl AccScalar for $t {
            fn exp(self) -> Self { Self::from_f64((self as f64).exp()) }
            fn ln(self) -> Self { Self::from_f64((self as f64).ln()) }
            fn sqrt(self) -> Self { Self::from_f64((self as f64).sqrt()) }
            fn abs(self) -> Self { $abs(self) }
            fn is_finite(self) -> bool { true }
        }
        impl Accum for $t {
            type Acc = $t;
            fn widen(self) -> $t { self }
            fn narrow(acc: $t) -> $t { acc }
        }
    )*};
}
acc_int!(i8 => i8::wrapping_abs, i16 => i16::wrapping_abs, i32 => i32::wrapping_abs, i64 => i64::wrapping_abs,
    u8 => std::convert::identity, u16 => std::convert::identity, u32 => std::convert::identity, u64 => std::convert::identity);

/// The larger of `a` and `b`; a NaN in either wins (NumPy's `maximum`).
pub fn max_nan<T: Scalar>(a: T, b: T) -> T {
    if a.is_nan() || b > a || b.is_nan() {
        if a.is_nan() { a } else { b }
    } else {
        a
    }
}

/// The smaller of `a` and `b`; a NaN in either wins (NumPy's `minimum`).
pub fn min_nan<T: Scalar>(a: T, b: T) -> T {
    if a.is_nan() || b < a || b.is_nan() {
        if a.is_nan() { a } else { b }
    } else {
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_widen_exactly_and_narrow_once() {
        let h = f16::from_f32(1.5);
        assert_eq!(h.widen(), 1.5f32);
        // 1 + 2^-12 is not an f16; narrowing rounds to nearest even (1.0).
        assert_eq!(f16::narrow(1.0 + 2f32.powi(-12)), f16::ONE);
        assert_eq!(bf16::narrow(3.0).to_f32(), 3.0);
    }

    #[test]
    fn nan_wins_in_max_and_min() {
        assert!(max_nan(1.0f32, f32::NAN).is_nan());
        assert!(max_nan(f32::NAN, 1.0f32).is_nan());
        assert!(min_nan(f32::NAN, -1.0f32).is_nan());
        assert_eq!(max_nan(1.0f32, 2.0), 2.0);
        assert_eq!(min_nan(3i32, -2), -2);
        assert_eq!(
            AccScalar::abs(i8::MIN),
            i8::MIN,
            "integer abs wraps instead of panicking"
        );
    }
}
