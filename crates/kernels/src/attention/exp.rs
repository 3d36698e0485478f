//! The softmax exponentials of an attention row, `e^(x - max)` and their sum, over an
//! exponential of oxgen's own: the f32 sibling of [`crate::sigmoid`]'s, with the same
//! reduction in f32 constants and a degree-7 Taylor polynomial (truncation below 1e-8
//! relative, so within a couple of f32 ulps of `expf`), taken as 0 below `-87.3` (where f32
//! results would turn subnormal), summed in eight lanes (element `i` into lane `i % 8`) and
//! then by the tree `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`, the scalar reference
//! and the AVX2 kernel alike, so both give the same bits.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use crate::cpu;

/// Below this `t`, `e^t` in f32 counts as 0.
const EXP32_FLOOR: f32 = -87.3;
pub(crate) const INV_LN2_32: f32 = std::f32::consts::LOG2_E;
/// ln 2 split so that `k * LN2_HI_32` is exact for the `k` that occur (|k| <= 126).
pub(crate) const LN2_HI_32: f32 = 0.693_359_4;
pub(crate) const LN2_LO_32: f32 = -2.121_944_4e-4;
/// `1 / n!` for n = 7 down to 2.
pub(crate) const TAYLOR32: [f32; 6] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    1.0 / 2.0,
];

/// `e^t` in f32 for `t <= 0` (see the module doc); NaN stays NaN.
pub(crate) fn exp32_nonpositive(t: f32) -> f32 {
    if t < EXP32_FLOOR {
        return 0.0;
    }
    let k = (t * INV_LN2_32).round_ties_even();
    let r = (t - k * LN2_HI_32) - k * LN2_LO_32;
    let mut p = TAYLOR32[0];
    for c in &TAYLOR32[1..] {
        p = p * r + c;
    }
    p = p * r + 1.0;
    p = p * r + 1.0;
    // k is in [-126, 0]: 2^k is a normal f32.
    p * f32::from_bits(((k as i32 + 127) as u32) << 23)
}

/// `xs[i] = e^(xs[i] - max)` for every `i` (each `xs[i] <= max`), returning their sum, in
/// the module doc's order: the softmax numerators and denominator of one attention row.
pub(crate) fn exp_shifted_sum(xs: &mut [f32], max: f32) -> f32 {
    let mut lanes = [0f32; 8];
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if cpu::level() >= cpu::Level::Avx512 {
        // SAFETY: AVX-512 is available (checked).
        return lane_tree(unsafe { exp_shifted_avx512(xs, max) });
    } else if cpu::level() >= cpu::Level::Avx2 {
        done = xs.len() / 8 * 8;
        // SAFETY: AVX2 is available (checked); `done` elements are whole vectors of `xs`.
        lanes = unsafe { exp_shifted_avx2(&mut xs[..done], max) };
    }
    for (i, x) in xs.iter_mut().enumerate().skip(done) {
        *x = exp32_nonpositive(*x - max);
        lanes[i % 8] += *x;
    }
    lane_tree(lanes)
}

/// The sum of eight lanes by the tree `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`
/// (what one 8-wide vector and its horizontal sum do): the order every eight-lane reduction
/// of the kernels' references ends in.
pub(crate) fn lane_tree(l: [f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// Eight elements at a time, each lane the reference's operations; returns the lane sums.
///
/// # Safety
/// AVX2 must be available; `xs.len()` a multiple of 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn exp_shifted_avx2(xs: &mut [f32], max: f32) -> [f32; 8] {
    let (maxv, floor, one) = (
        _mm256_set1_ps(max),
        _mm256_set1_ps(EXP32_FLOOR),
        _mm256_set1_ps(1.0),
    );
    let (inv_ln2, hi, lo) = (
        _mm256_set1_ps(INV_LN2_32),
        _mm256_set1_ps(LN2_HI_32),
        _mm256_set1_ps(LN2_LO_32),
    );
    let mut sum = _mm256_setzero_ps();
    for chunk in xs.chunks_exact_mut(8) {
        // SAFETY: `chunk` holds eight f32.
        let t = _mm256_sub_ps(unsafe { _mm256_loadu_ps(chunk.as_ptr()) }, maxv);
        let k = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(t, inv_ln2),
        );
        let r = _mm256_sub_ps(_mm256_sub_ps(t, _mm256_mul_ps(k, hi)), _mm256_mul_ps(k, lo));
        let mut p = _mm256_set1_ps(TAYLOR32[0]);
        for &c in &TAYLOR32[1..] {
            p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
        }
        p = _mm256_add_ps(_mm256_mul_ps(p, r), one);
        p = _mm256_add_ps(_mm256_mul_ps(p, r), one);
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(k),
            _mm256_set1_epi32(127),
        ));
        let e = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
        // t < floor → 0 (a NaN t compares false and keeps its NaN).
        let e = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(t, floor), e);
        // SAFETY: as for the load.
        unsafe { _mm256_storeu_ps(chunk.as_mut_ptr(), e) };
        sum = _mm256_add_ps(sum, e);
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds eight f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
    lanes
}

/// [`exp_shifted_avx2`] over all of `xs` sixteen elements at a time, the same operations in
/// each lane: a vector's two halves are added to the eight lane sums one after the other
/// (elements `i` and `i + 8` into lane `i % 8`, in order); the last elements run under a mask,
/// the lanes past the end adding +0 (exact: a lane's sum of exponentials is never -0).
///
/// # Safety
/// AVX-512 F must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn exp_shifted_avx512(xs: &mut [f32], max: f32) -> [f32; 8] {
    let (maxv, floor, one) = (
        _mm512_set1_ps(max),
        _mm512_set1_ps(EXP32_FLOOR),
        _mm512_set1_ps(1.0),
    );
    let (inv_ln2, hi, lo) = (
        _mm512_set1_ps(INV_LN2_32),
        _mm512_set1_ps(LN2_HI_32),
        _mm512_set1_ps(LN2_LO_32),
    );
    let exp = |x: __m512| {
        let t = _mm512_sub_ps(x, maxv);
        let k = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(t, inv_ln2),
        );
        let r = _mm512_sub_ps(_mm512_sub_ps(t, _mm512_mul_ps(k, hi)), _mm512_mul_ps(k, lo));
        let mut p = _mm512_set1_ps(TAYLOR32[0]);
        for &c in &TAYLOR32[1..] {
            p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(c));
        }
        p = _mm512_add_ps(_mm512_mul_ps(p, r), one);
        p = _mm512_add_ps(_mm512_mul_ps(p, r), one);
        let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_cvtps_epi32(k),
            _mm512_set1_epi32(127),
        ));
        let e = _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
        // t < floor → 0 (a NaN t compares false and keeps its NaN).
        _mm512_maskz_mov_ps(!_mm512_cmp_ps_mask::<_CMP_LT_OQ>(t, floor), e)
    };
    let halves = |e: __m512| {
        let upper = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(e));
        (_mm512_castps512_ps256(e), _mm256_castpd_ps(upper))
    };
    let mut sum = _mm256_setzero_ps();
    let mut chunks = xs.chunks_exact_mut(16);
    for chunk in &mut chunks {
        // SAFETY: `chunk` holds sixteen f32.
        let e = exp(unsafe { _mm512_loadu_ps(chunk.as_ptr()) });
        // SAFETY: as for the load.
        unsafe { _mm512_storeu_ps(chunk.as_mut_ptr(), e) };
        let (first, second) = halves(e);
        sum = _mm256_add_ps(_mm256_add_ps(sum, first), second);
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let mask: __mmask16 = (1 << rest.len()) - 1;
        // SAFETY: the masked lanes are `rest`'s f32; the others are neither read nor
        // written (and, loaded as 0, give e^(0 - max) there, zeroed below).
        let e = exp(unsafe { _mm512_maskz_loadu_ps(mask, rest.as_ptr()) });
        let e = _mm512_maskz_mov_ps(mask, e);
        unsafe { _mm512_mask_storeu_ps(rest.as_mut_ptr(), mask, e) };
        let (first, second) = halves(e);
        sum = _mm256_add_ps(_mm256_add_ps(sum, first), second);
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds eight f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
    lanes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn softmax_exponentials_equal_the_reference_and_stay_near_libm() {
        let mut rng = Rng::new(3);
        for len in 0..300 {
            let xs = rng.floats(len, -100.0, 20.0);
            let max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut fast = xs.clone();
            let sum = exp_shifted_sum(&mut fast, max);
            let mut lanes = [0f32; 8];
            for (i, (&x, &f)) in xs.iter().zip(&fast).enumerate() {
                let want = exp32_nonpositive(x - max);
                assert_eq!(want.to_bits(), f.to_bits(), "e^({x} - {max})");
                let libm = (x - max).exp();
                assert!(
                    (want - libm).abs() <= 4.0 * f32::EPSILON * libm.max(f32::MIN_POSITIVE)
                        || x - max < EXP32_FLOOR
                );
                lanes[i % 8] += want;
            }
            let l = lanes;
            let want = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
            assert_eq!(want.to_bits(), sum.to_bits());
        }
        assert_eq!(exp32_nonpositive(0.0), 1.0);
        assert_eq!(exp32_nonpositive(f32::NEG_INFINITY), 0.0);
        assert!(exp32_nonpositive(f32::NAN).is_nan());
    }
}
