//! The logistic sigmoid of f32 values and the gated SiLU over it: computed in f64 and rounded
//! once, over an exponential of oxgen's own rather than libm's: the same operations in the
//! scalar reference and in the AVX2 and AVX-512 kernels (four and eight f64 lanes), so all
//! give the same bits on every machine, where libm's `exp` differs between C libraries and
//! cannot be vectorized.
//!
//! `sigmoid(x) = 1 / (1 + e^-x)` for `x >= 0` and `e^x / (1 + e^x)` below, so the exponential
//! only ever sees `t = -|x| <= 0`. Below `t = -110` it is taken as 0: then `1 + e^t` rounds to
//! 1 and `e^t` is far below the smallest f32, so the f32 result (1 or 0) is what the exact
//! value rounds to. Above it, `t = k ln2 + r` with `k = round(t / ln2)` (ties to even) and
//! `|r| <= ln2 / 2` (Cody and Waite's two-part ln2, exact for these `k`), `e^r` is its Taylor
//! polynomial of degree 13 (truncation below 1e-17 relative) in Horner form without fused
//! multiply-adds, and `2^k` is built from its exponent bits. The result is within a few f64
//! ulps of `e^t`, so the rounded f32 sigmoid almost always equals the correctly rounded one.
//!
//! [`silu_mul`] is the gated SiLU of a decoder's MLP over this sigmoid. The softmax's f32
//! exponential, the same reduction in f32, is [`crate::attention`]'s (`attention/exp.rs`).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use crate::cpu;

/// Below this `t`, `e^t` counts as 0 (see the module doc).
const EXP_FLOOR: f64 = -110.0;
const INV_LN2: f64 = std::f64::consts::LOG2_E;
/// ln 2 split so that `k * LN2_HI` is exact for `|k| < 2^20`.
const LN2_HI: f64 = 6.931_471_803_691_238e-1;
const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
/// `1 / n!` for n = 13 down to 2.
const TAYLOR: [f64; 12] = [
    1.0 / 6_227_020_800.0,
    1.0 / 479_001_600.0,
    1.0 / 39_916_800.0,
    1.0 / 3_628_800.0,
    1.0 / 362_880.0,
    1.0 / 40_320.0,
    1.0 / 5_040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    1.0 / 2.0,
];

/// `e^t` for `EXP_FLOOR <= t <= 0` (NaN stays NaN).
pub(crate) fn exp_nonpositive(t: f64) -> f64 {
    let k = (t * INV_LN2).round_ties_even();
    let r = (t - k * LN2_HI) - k * LN2_LO;
    let mut p = TAYLOR[0];
    for c in &TAYLOR[1..] {
        p = p * r + c;
    }
    p = p * r + 1.0;
    p = p * r + 1.0;
    // k is in [-159, 0]: 2^k is a normal f64.
    p * f64::from_bits(((k as i64 + 1023) as u64) << 52)
}

/// The reference: `sigmoid(x)` as the module doc defines it.
pub fn sigmoid(x: f32) -> f32 {
    let x = x as f64;
    let t = -x.abs();
    let e = if t < EXP_FLOOR {
        0.0
    } else {
        exp_nonpositive(t)
    };
    let num = if x >= 0.0 { 1.0 } else { e };
    (num / (1.0 + e)) as f32
}

/// `out[i] = sigmoid(x[i])`: AVX-512 or AVX2 where [`crate::cpu`] allows, the same bits as
/// [`sigmoid`].
pub fn sigmoid_slice(x: &[f32], out: &mut [f32]) {
    let n = x.len().min(out.len());
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if cpu::level() >= cpu::Level::Avx512 {
        done = n / 8 * 8;
        // SAFETY: AVX-512 F is available (checked above); both slices hold `done` elements.
        unsafe { sigmoid_avx512(&x[..done], &mut out[..done]) };
    }
    #[cfg(target_arch = "x86_64")]
    if cpu::level() >= cpu::Level::Avx2 {
        let end = done + (n - done) / 4 * 4;
        // SAFETY: AVX2 is available (checked above); both ranges hold a multiple of four elements.
        unsafe { sigmoid_avx2(&x[done..end], &mut out[done..end]) };
        done = end;
    }
    for (o, &v) in out[done..n].iter_mut().zip(&x[done..n]) {
        *o = sigmoid(v);
    }
}

/// `out[i] = (g[i] * sigmoid(g[i])) * u[i]`: the gated SiLU of an MLP with exactly the
/// operations of the three ops it replaces (f32 sigmoid, then two f32 products).
pub fn silu_mul(g: &[f32], u: &[f32], out: &mut [f32]) {
    let n = g.len().min(u.len()).min(out.len());
    sigmoid_slice(&g[..n], &mut out[..n]);
    for ((o, &g), &u) in out[..n].iter_mut().zip(g).zip(u) {
        *o = (g * *o) * u;
    }
}

/// [`exp_nonpositive`] in four lanes, the same operations per lane.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn exp_avx2(t: __m256d) -> __m256d {
    let one = _mm256_set1_pd(1.0);
    let k = _mm256_round_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_pd(
        t,
        _mm256_set1_pd(INV_LN2),
    ));
    let r = _mm256_sub_pd(
        _mm256_sub_pd(t, _mm256_mul_pd(k, _mm256_set1_pd(LN2_HI))),
        _mm256_mul_pd(k, _mm256_set1_pd(LN2_LO)),
    );
    let mut p = _mm256_set1_pd(TAYLOR[0]);
    for &c in &TAYLOR[1..] {
        p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(c));
    }
    p = _mm256_add_pd(_mm256_mul_pd(p, r), one);
    p = _mm256_add_pd(_mm256_mul_pd(p, r), one);
    // 2^52 + 1023: adding it to an integral k in [-1023, 0] puts k + 1023 in the low bits.
    let bias = _mm256_set1_pd(4_503_599_627_371_519.0);
    let scale = _mm256_slli_epi64::<52>(_mm256_castpd_si256(_mm256_add_pd(k, bias)));
    _mm256_mul_pd(p, _mm256_castsi256_pd(scale))
}

/// [`exp_nonpositive`] in eight lanes, the same operations per lane.
///
/// # Safety
/// AVX-512 F must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn exp_avx512(t: __m512d) -> __m512d {
    let one = _mm512_set1_pd(1.0);
    let k = _mm512_roundscale_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_pd(t, _mm512_set1_pd(INV_LN2)),
    );
    let r = _mm512_sub_pd(
        _mm512_sub_pd(t, _mm512_mul_pd(k, _mm512_set1_pd(LN2_HI))),
        _mm512_mul_pd(k, _mm512_set1_pd(LN2_LO)),
    );
    let mut p = _mm512_set1_pd(TAYLOR[0]);
    for &c in &TAYLOR[1..] {
        p = _mm512_add_pd(_mm512_mul_pd(p, r), _mm512_set1_pd(c));
    }
    p = _mm512_add_pd(_mm512_mul_pd(p, r), one);
    p = _mm512_add_pd(_mm512_mul_pd(p, r), one);
    let bias = _mm512_set1_pd(4_503_599_627_371_519.0);
    let scale = _mm512_slli_epi64::<52>(_mm512_castpd_si512(_mm512_add_pd(k, bias)));
    _mm512_mul_pd(p, _mm512_castsi512_pd(scale))
}

/// Four lanes at a time, each lane the reference's operations in the reference's order.
///
/// # Safety
/// AVX2 must be available; `x.len() == out.len()`, a multiple of 4.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sigmoid_avx2(x: &[f32], out: &mut [f32]) {
    let sign_off = _mm256_set1_pd(f64::from_bits(!(1u64 << 63)));
    let (one, floor) = (_mm256_set1_pd(1.0), _mm256_set1_pd(EXP_FLOOR));
    for (xs, os) in x.chunks_exact(4).zip(out.chunks_exact_mut(4)) {
        // SAFETY: `xs` holds four f32.
        let v = _mm256_cvtps_pd(unsafe { _mm_loadu_ps(xs.as_ptr()) });
        let t = _mm256_sub_pd(_mm256_setzero_pd(), _mm256_and_pd(v, sign_off));
        // SAFETY: AVX2 is available (this function's contract).
        let e = unsafe { exp_avx2(t) };
        // t < floor → 0 (a NaN t compares false and keeps its NaN).
        let e = _mm256_andnot_pd(_mm256_cmp_pd::<_CMP_LT_OQ>(t, floor), e);
        // One division: the numerator is 1 for x >= 0, e^t below.
        let num = _mm256_blendv_pd(e, one, _mm256_cmp_pd::<_CMP_GE_OQ>(v, _mm256_setzero_pd()));
        let s = _mm256_div_pd(num, _mm256_add_pd(one, e));
        // SAFETY: `os` holds four f32.
        unsafe { _mm_storeu_ps(os.as_mut_ptr(), _mm256_cvtpd_ps(s)) };
    }
}

/// [`sigmoid_avx2`] in eight lanes: the same operations per lane, mask registers for the
/// comparisons.
///
/// # Safety
/// AVX-512 F must be available; `x.len() == out.len()`, a multiple of 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sigmoid_avx512(x: &[f32], out: &mut [f32]) {
    let sign_off = _mm512_set1_epi64(!(1i64 << 63));
    let (one, floor, zero) = (
        _mm512_set1_pd(1.0),
        _mm512_set1_pd(EXP_FLOOR),
        _mm512_setzero_pd(),
    );
    for (xs, os) in x.chunks_exact(8).zip(out.chunks_exact_mut(8)) {
        // SAFETY: `xs` holds eight f32.
        let v = _mm512_cvtps_pd(unsafe { _mm256_loadu_ps(xs.as_ptr()) });
        let abs = _mm512_castsi512_pd(_mm512_and_si512(_mm512_castpd_si512(v), sign_off));
        let t = _mm512_sub_pd(zero, abs);
        // SAFETY: AVX-512 F is available (this function's contract).
        let e = unsafe { exp_avx512(t) };
        // t < floor → 0 (a NaN t compares false and keeps its NaN).
        let e = _mm512_maskz_mov_pd(!_mm512_cmp_pd_mask::<_CMP_LT_OQ>(t, floor), e);
        let num = _mm512_mask_blend_pd(_mm512_cmp_pd_mask::<_CMP_GE_OQ>(v, zero), e, one);
        let s = _mm512_div_pd(num, _mm512_add_pd(one, e));
        // SAFETY: `os` holds eight f32.
        unsafe { _mm256_storeu_ps(os.as_mut_ptr(), _mm512_cvtpd_ps(s)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// The sigmoid in f64 through libm, rounded once.
    fn libm(x: f32) -> f32 {
        let x = x as f64;
        (if x >= 0.0 {
            1.0 / (1.0 + (-x).exp())
        } else {
            x.exp() / (1.0 + x.exp())
        }) as f32
    }

    fn samples() -> Vec<f32> {
        let mut v: Vec<f32> = (-40_000..=40_000).map(|i| i as f32 * 3e-3).collect();
        let mut rng = Rng::new(9);
        for _ in 0..100_000 {
            v.push(f32::from_bits((rng.next_u64() >> 32) as u32));
        }
        v.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            f32::MAX,
            f32::MIN,
            -103.9,
            -104.0,
            -110.0,
            110.0,
            1e-30,
        ]);
        v
    }

    #[test]
    fn the_kernels_equal_the_reference_bit_for_bit() {
        let x = samples();
        let check = |got: &[f32], what: &str| {
            for (&v, &g) in x.iter().zip(got) {
                let want = sigmoid(v);
                assert!(
                    want.to_bits() == g.to_bits() || (want.is_nan() && g.is_nan()),
                    "{what}: sigmoid({v:e}): {want:e} vs {g:e}"
                );
            }
        };
        let mut got = vec![0f32; x.len()];
        sigmoid_slice(&x, &mut got);
        check(&got, "sigmoid_slice");
        // Each vector kernel over (nearly) all samples, not just the part the dispatch gives it.
        #[cfg(target_arch = "x86_64")]
        {
            let whole = x.len() / 8 * 8;
            if cpu::level() >= cpu::Level::Avx2 {
                // SAFETY: AVX2 is available (checked above); `whole` is a multiple of 8.
                unsafe { sigmoid_avx2(&x[..whole], &mut got[..whole]) };
                check(&got[..whole], "avx2");
            }
            if cpu::level() >= cpu::Level::Avx512 {
                got.fill(0.0);
                // SAFETY: AVX-512 F is available (checked above); `whole` is a multiple of 8.
                unsafe { sigmoid_avx512(&x[..whole], &mut got[..whole]) };
                check(&got[..whole], "avx512");
            }
        }
    }

    #[test]
    fn the_reference_rounds_like_libm() {
        // Within one f32 ulp everywhere, and equal on all but a tiny share of inputs.
        let x = samples();
        let mut differ = 0;
        for &v in &x {
            let (a, b) = (sigmoid(v), libm(v));
            if a.is_nan() || b.is_nan() {
                assert!(a.is_nan() && b.is_nan(), "{v:e}");
                continue;
            }
            let ulps = (a.to_bits() as i64 - b.to_bits() as i64).abs();
            assert!(ulps <= 1, "sigmoid({v:e}): {a:e} vs libm {b:e}");
            differ += (ulps != 0) as usize;
        }
        assert!(differ * 100_000 < x.len(), "{differ} of {} differ", x.len());
        assert_eq!(
            (
                sigmoid(0.0),
                sigmoid(f32::INFINITY),
                sigmoid(f32::NEG_INFINITY)
            ),
            (0.5, 1.0, 0.0)
        );
    }
}
