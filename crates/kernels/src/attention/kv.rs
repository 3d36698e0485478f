//! What a KV cache stores per head vector: the element of a pool ([`CacheElem`]), how one head
//! vector is written into it ([`CacheElem::encode`]), and the views attention reads and
//! writes ([`Cached`], [`KvMem`]).
//!
//! - `f32`, `f16` and `bf16` store the values, each rounded once to the element (to nearest
//!   even); a cache of the model's own dtype stores its bits unchanged.
//! - `i8` stores `round(x / s)` (clamped to ±127) with one f32 scale `s = max|x| / 127` per
//!   head vector. The scale depends only on the head vector itself (one token, one KV head),
//!   never on a block of positions or on a channel across tokens: a token's bytes are then
//!   the same whether a prefill, a chunk, a decode step or a batch wrote them, and tokens
//!   that arrive later never change them. A head vector with a NaN or an infinity gets a NaN
//!   scale, so attention over it gives NaN as the float caches do.
//!
//! Attention reads an element as its exact f32 value; with scales, a key's dot product is
//! multiplied by the key's scale after its sum, and a value's softmax weight by the value's
//! scale before the weighted sum (`group.rs`).

use half::{bf16, f16};

use crate::Scalar;
use crate::acc::Accum;
use crate::error::KernelError;

/// The element kinds, for the vector widening of `avx2.rs` and the f32 case of `group.rs` (a
/// const of each [`CacheElem`], so a kernel's match on it folds away).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheKind {
    F32,
    F16,
    BF16,
    I8,
}

/// An element a KV pool stores (read back as its exact value, [`Scalar::to_f32`]).
pub trait CacheElem: Scalar {
    const KIND: CacheKind;
    /// Whether a head vector of these elements carries a scale.
    const SCALED: bool;
    /// Writes head vector `x` into `dst` (as long) and returns its scale (1 when unscaled).
    fn encode<T: Accum<Acc = f32>>(x: &[T], dst: &mut [Self]) -> f32;
}

macro_rules! float_elem {
    ($($t:ty => $kind:ident),*) => {$(
        impl CacheElem for $t {
            const KIND: CacheKind = CacheKind::$kind;
            const SCALED: bool = false;
            fn encode<T: Accum<Acc = f32>>(x: &[T], dst: &mut [Self]) -> f32 {
                for (d, v) in dst.iter_mut().zip(x) {
                    *d = <$t>::narrow(v.widen());
                }
                1.0
            }
        }
    )*};
}
float_elem!(f32 => F32, f16 => F16, bf16 => BF16);

/// The largest magnitude of an int8 cache element (symmetric: -128 is never stored).
const I8_MAX: f32 = 127.0;

impl CacheElem for i8 {
    const KIND: CacheKind = CacheKind::I8;
    const SCALED: bool = true;
    fn encode<T: Accum<Acc = f32>>(x: &[T], dst: &mut [Self]) -> f32 {
        let mut amax = 0f32;
        for v in x {
            let v = v.widen();
            if !v.is_finite() {
                dst.fill(0);
                return f32::NAN;
            }
            amax = amax.max(v.abs());
        }
        let scale = amax / I8_MAX;
        if scale == 0.0 {
            dst.fill(0);
            return 0.0;
        }
        for (d, v) in dst.iter_mut().zip(x) {
            *d = (v.widen() / scale).round().clamp(-I8_MAX, I8_MAX) as i8;
        }
        scale
    }
}

/// A run of cached head vectors (keys or values) as attention reads them: row `j` is
/// `values[j * head_size..][..head_size]`, with scale `scales[j]` when the element is scaled
/// (`scales` is empty otherwise).
#[derive(Debug)]
pub struct Cached<'a, C> {
    pub values: &'a [C],
    pub scales: &'a [f32],
}

impl<C> Clone for Cached<'_, C> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<C> Copy for Cached<'_, C> {}

impl<'a, C: CacheElem> Cached<'a, C> {
    /// Unscaled values.
    pub fn plain(values: &'a [C]) -> Self {
        Cached {
            values,
            scales: &[],
        }
    }

    /// Rows `rows` (of `head_size` values each) and their scales.
    pub(crate) fn rows(self, rows: std::ops::Range<usize>, head_size: usize) -> Self {
        Cached {
            values: &self.values[rows.start * head_size..rows.end * head_size],
            scales: if C::SCALED { &self.scales[rows] } else { &[] },
        }
    }

    /// The rows from `row` on.
    pub(crate) fn skip(self, row: usize, head_size: usize) -> Self {
        Cached {
            values: &self.values[row * head_size..],
            scales: if C::SCALED { &self.scales[row..] } else { &[] },
        }
    }

    /// Checks that the scales cover the values' head vectors of `head_size`.
    pub(crate) fn check(&self, head_size: usize) -> Result<(), KernelError> {
        check_scales::<C>(self.values.len(), self.scales.len(), head_size)
    }

    /// Row `j`'s scale (1 when unscaled).
    pub(crate) fn scale(&self, j: usize) -> f32 {
        if C::SCALED { self.scales[j] } else { 1.0 }
    }
}

/// The memory of a paged pool, or of a store that holds several pools between each other's
/// blocks: its elements and, for a scaled element, one scale per head vector, the head
/// vector at element `i` (a multiple of the head size) owning `scales[i / head_size]`.
/// Unscaled pools pass no scales.
pub struct KvMem<'a, C> {
    pub values: &'a mut [C],
    pub scales: &'a mut [f32],
}

impl<C: CacheElem> KvMem<'_, C> {
    /// Checks that the scales cover the values' head vectors of `head_size`.
    pub(crate) fn check(&self, head_size: usize) -> Result<(), KernelError> {
        check_scales::<C>(self.values.len(), self.scales.len(), head_size)
    }
}

fn check_scales<C: CacheElem>(
    values: usize,
    scales: usize,
    head_size: usize,
) -> Result<(), KernelError> {
    let want = if C::SCALED {
        values.div_ceil(head_size.max(1))
    } else {
        0
    };
    if scales < want {
        return Err(KernelError::Length {
            what: "KV scales",
            expected: want,
            actual: scales,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int8_keeps_each_value_within_half_a_step() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 64) as f32 - 31.5) * 0.173)
            .collect();
        let mut q = [0i8; 64];
        let s = i8::encode(&x, &mut q);
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(s, amax / 127.0);
        for (v, q) in x.iter().zip(q) {
            assert!(
                (q as f32 * s - v).abs() <= s * 0.5 + 1e-6,
                "{v} -> {q} x {s}"
            );
        }
        assert!(
            q.iter().any(|&v| v.abs() == 127),
            "the largest value uses the full range"
        );
    }

    #[test]
    fn int8_scale_depends_only_on_the_vector_itself() {
        let a: Vec<f32> = (0..32).map(|i| (i as f32).sin()).collect();
        let (mut qa, mut qb) = ([0i8; 32], [0i8; 32]);
        let sa = i8::encode(&a, &mut qa);
        // The same vector encoded again (as another step or batch would) gives the same bytes.
        let sb = i8::encode(&a.clone(), &mut qb);
        assert_eq!((sa.to_bits(), qa), (sb.to_bits(), qb));
    }

    #[test]
    fn int8_zero_and_non_finite_vectors() {
        let mut q = [5i8; 8];
        assert_eq!(i8::encode(&[0f32; 8], &mut q), 0.0);
        assert_eq!(q, [0; 8]);
        let mut x = [1f32; 8];
        x[3] = f32::INFINITY;
        assert!(i8::encode(&x, &mut q).is_nan());
        x[3] = f32::NAN;
        assert!(i8::encode(&x, &mut q).is_nan());
    }

    #[test]
    fn floats_round_once_to_the_element() {
        let x = [1.0f32 + f32::EPSILON, -3.25, 65504.0, 1e-8];
        let mut h = [f16::ZERO; 4];
        assert_eq!(f16::encode(&x, &mut h), 1.0);
        assert_eq!(h.map(|v| v.to_f32()), x.map(|v| f16::from_f32(v).to_f32()));
        let mut same = [0f32; 4];
        f32::encode(&x, &mut same);
        assert_eq!(same.map(f32::to_bits), x.map(f32::to_bits));
    }
}
