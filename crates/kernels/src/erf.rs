//! The error function of f32 values, computed in f64 and rounded once, with the same
//! operations in the scalar reference and the AVX2 and AVX-512 kernels (four and eight f64
//! lanes), so every path gives the same bits (BERT's GELU calls it once per MLP value).
//!
//! For `|x| < 1/2`, the Taylor series `2/√π · x · Σ (-x²)ⁿ / (n! (2n + 1))` to n = 11 (the
//! next term is below 1e-15 of the sum). For `1/2 <= |x| < 4`, `erf = 1 - e^{-x²} g(|x|)` with
//! `g(x) = erfc(x) e^{x²}` a degree-18 polynomial in `t = (x - 2.25) / 1.75`, interpolated
//! at Chebyshev nodes in 40-digit arithmetic (relative error below 1.1e-11 on the range), and
//! `e^{-x²}` the sigmoid's exponential ([`crate::sigmoid`]). From `|x| = 4` on, the f32
//! result is ±1 (`erfc(4) < 2^-25`), which the formula at `|x| = 4` also rounds to, so `|x|`
//! is clamped there. The result is within about 1e-11 of erf, so the rounded f32 almost
//! always equals the correctly rounded one; NaN stays NaN.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use crate::cpu;
use crate::sigmoid::exp_nonpositive;

/// `(-1)ⁿ / (n! (2n + 1))` for n = 11 down to 0.
const SMALL: [f64; 12] = [
    -1.0 / (39_916_800.0 * 23.0),
    1.0 / (3_628_800.0 * 21.0),
    -1.0 / (362_880.0 * 19.0),
    1.0 / (40_320.0 * 17.0),
    -1.0 / (5_040.0 * 15.0),
    1.0 / (720.0 * 13.0),
    -1.0 / (120.0 * 11.0),
    1.0 / (24.0 * 9.0),
    -1.0 / (6.0 * 7.0),
    1.0 / (2.0 * 5.0),
    -1.0 / 3.0,
    1.0,
];
const TWO_OVER_SQRT_PI: f64 = std::f64::consts::FRAC_2_SQRT_PI;
/// Where the series hands over to the polynomial of `erfc · e^{x²}`.
const SPLIT: f64 = 0.5;
/// Past this `|x|`, erf rounds to ±1 in f32.
const CLAMP: f64 = 4.0;
const MID: f64 = 2.25;
const HALF_WIDTH: f64 = 1.75;
/// `g(t)`'s coefficients, highest degree first.
const G: [f64; 19] = [
    1.398_093_159_156_823_6e-6,
    -3.590_481_298_665_639e-6,
    2.434_267_608_365_304_5e-6,
    -5.508_868_244_388_452e-6,
    2.532_601_983_725_67e-5,
    -5.937_426_296_407_737e-5,
    1.219_863_692_004_483_2e-4,
    -2.703_022_137_028_702e-4,
    5.939_914_041_315_493e-4,
    -1.256_005_464_751_924e-3,
    2.581_903_705_053_380_2e-3,
    -5.162_960_400_820_916e-3,
    1.001_096_358_970_701_5e-2,
    -1.877_215_459_488_548_7e-2,
    3.394_221_726_904_511e-2,
    -5.896_416_704_072_171e-2,
    9.797_742_145_996_578e-2,
    -1.548_513_799_541_658_4e-1,
    2.310_872_587_303_918_8e-1,
];

/// The reference: `erf(x)` as the module doc defines it.
pub fn erf(x: f32) -> f32 {
    let x = x as f64;
    let a = x.abs().min(CLAMP);
    let r = if a < SPLIT {
        let x2 = a * a;
        let mut p = SMALL[0];
        for &c in &SMALL[1..] {
            p = p * x2 + c;
        }
        TWO_OVER_SQRT_PI * a * p
    } else {
        let t = (a - MID) / HALF_WIDTH;
        let mut g = G[0];
        for &c in &G[1..] {
            g = g * t + c;
        }
        1.0 - exp_nonpositive(-(a * a)) * g
    };
    // f64::min of a NaN returns the other operand: a NaN `x` is given back as it came.
    if x.is_nan() {
        x as f32
    } else {
        r.copysign(x) as f32
    }
}

/// The error function of an f64, exact to f64 rounding and slow: its Taylor series below 2
/// (alternating terms shrink past 1e-17 of the sum within 60 terms there) and the continued
/// fraction of erfc above, 1 past 6. ONNX `Erf` on f64 tensors, and the oracle [`erf`] is
/// tested against.
pub fn erf_f64(x: f64) -> f64 {
    const TERMS: u32 = 60;
    let ax = x.abs();
    let r = if ax < 2.0 {
        let x2 = ax * ax;
        let (mut sum, mut term) = (ax, ax);
        for n in 1..=TERMS {
            let n = n as f64;
            term *= -x2 / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * TWO_OVER_SQRT_PI
    } else if ax > 6.0 {
        1.0
    } else {
        // erfc(x) = exp(-x^2) / sqrt(pi) / (x + (1/2) / (x + 1 / (x + (3/2) / (x + ...))))
        let mut f = 0.0;
        for k in (1..TERMS).rev() {
            f = (k as f64 / 2.0) / (ax + f);
        }
        1.0 - (-ax * ax).exp() / std::f64::consts::PI.sqrt() / (ax + f)
    };
    r.copysign(x)
}

/// `out[i] = erf(x[i])`: AVX-512 or AVX2 where [`crate::cpu`] allows, the same bits as
/// [`erf`].
pub fn erf_slice(x: &[f32], out: &mut [f32]) {
    let n = x.len().min(out.len());
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if cpu::level() >= cpu::Level::Avx512 {
        done = n / 8 * 8;
        // SAFETY: AVX-512 F is available (checked above); both slices hold `done` elements.
        unsafe { erf_avx512(&x[..done], &mut out[..done]) };
    }
    #[cfg(target_arch = "x86_64")]
    if cpu::level() >= cpu::Level::Avx2 {
        let end = done + (n - done) / 4 * 4;
        // SAFETY: AVX2 is available (checked above); both ranges hold a multiple of four.
        unsafe { erf_avx2(&x[done..end], &mut out[done..end]) };
        done = end;
    }
    for (o, &v) in out[done..n].iter_mut().zip(&x[done..n]) {
        *o = erf(v);
    }
}

/// Four lanes at a time, each lane the reference's operations in the reference's order:
/// both branches are computed and the lane's own is kept.
///
/// # Safety
/// AVX2 must be available; `x.len() == out.len()`, a multiple of 4.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn erf_avx2(x: &[f32], out: &mut [f32]) {
    let sign = _mm256_set1_pd(-0.0);
    let (clamp, split) = (_mm256_set1_pd(CLAMP), _mm256_set1_pd(SPLIT));
    let (mid, width, one) = (
        _mm256_set1_pd(MID),
        _mm256_set1_pd(HALF_WIDTH),
        _mm256_set1_pd(1.0),
    );
    for (xs, os) in x.chunks_exact(4).zip(out.chunks_exact_mut(4)) {
        // SAFETY: `xs` holds four f32.
        let v = _mm256_cvtps_pd(unsafe { _mm_loadu_ps(xs.as_ptr()) });
        // min(|x|, 4) with a NaN kept in the first operand's place.
        let a = _mm256_min_pd(_mm256_andnot_pd(sign, v), clamp);
        let x2 = _mm256_mul_pd(a, a);
        let mut p = _mm256_set1_pd(SMALL[0]);
        for &c in &SMALL[1..] {
            p = _mm256_add_pd(_mm256_mul_pd(p, x2), _mm256_set1_pd(c));
        }
        let small = _mm256_mul_pd(_mm256_mul_pd(_mm256_set1_pd(TWO_OVER_SQRT_PI), a), p);
        let t = _mm256_div_pd(_mm256_sub_pd(a, mid), width);
        let mut g = _mm256_set1_pd(G[0]);
        for &c in &G[1..] {
            g = _mm256_add_pd(_mm256_mul_pd(g, t), _mm256_set1_pd(c));
        }
        // SAFETY: AVX2 is available (this function's contract).
        let e = unsafe { crate::sigmoid::exp_avx2(_mm256_sub_pd(_mm256_setzero_pd(), x2)) };
        let large = _mm256_sub_pd(one, _mm256_mul_pd(e, g));
        let r = _mm256_blendv_pd(large, small, _mm256_cmp_pd::<_CMP_LT_OQ>(a, split));
        // copysign(r, x); a NaN x is put back as it came.
        let signed = _mm256_or_pd(r, _mm256_and_pd(sign, v));
        let r = _mm256_blendv_pd(signed, v, _mm256_cmp_pd::<_CMP_UNORD_Q>(v, v));
        // SAFETY: `os` holds four f32.
        unsafe { _mm_storeu_ps(os.as_mut_ptr(), _mm256_cvtpd_ps(r)) };
    }
}

/// [`erf_avx2`] in eight lanes, [`CHAINS`] vectors at a time: each lane's operations are
/// one long dependent chain (two polynomials and an exponential), so independent vectors
/// interleaved keep the vector units busy where one vector at a time waits on each result.
///
/// # Safety
/// AVX-512 F must be available; `x.len() == out.len()`, a multiple of 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn erf_avx512(x: &[f32], out: &mut [f32]) {
    let mut xs = x.chunks_exact(8 * CHAINS);
    let mut os = out.chunks_exact_mut(8 * CHAINS);
    for (xs, os) in (&mut xs).zip(&mut os) {
        // SAFETY: the chunks hold `CHAINS` vectors of eight f32; AVX-512 F as above.
        unsafe { erf8::<CHAINS>(xs, os) };
    }
    let (xs, os) = (xs.remainder(), os.into_remainder());
    for (xs, os) in xs.chunks_exact(8).zip(os.chunks_exact_mut(8)) {
        // SAFETY: as above, one vector.
        unsafe { erf8::<1>(xs, os) };
    }
}

/// Vectors an erf kernel computes side by side.
const CHAINS: usize = 4;

/// `N` vectors of eight lanes of [`erf_avx512`], each lane [`erf`]'s operations in its
/// order: both branches computed and the lane's own kept.
///
/// # Safety
/// AVX-512 F must be available; `x` and `out` hold `8 * N` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn erf8<const N: usize>(x: &[f32], out: &mut [f32]) {
    assert!(x.len() >= 8 * N && out.len() >= 8 * N);
    let sign = _mm512_set1_epi64(i64::MIN);
    let (clamp, split) = (_mm512_set1_pd(CLAMP), _mm512_set1_pd(SPLIT));
    let (mid, width, one) = (
        _mm512_set1_pd(MID),
        _mm512_set1_pd(HALF_WIDTH),
        _mm512_set1_pd(1.0),
    );
    let zero = _mm512_setzero_pd();
    let (mut v, mut a, mut x2) = ([zero; N], [zero; N], [zero; N]);
    for i in 0..N {
        // SAFETY: `x` holds `N` vectors (asserted above).
        v[i] = _mm512_cvtps_pd(unsafe { _mm256_loadu_ps(x[8 * i..].as_ptr()) });
        let abs = _mm512_andnot_si512(sign, _mm512_castpd_si512(v[i]));
        a[i] = _mm512_min_pd(_mm512_castsi512_pd(abs), clamp);
        x2[i] = _mm512_mul_pd(a[i], a[i]);
    }
    let mut p = [_mm512_set1_pd(SMALL[0]); N];
    for &c in &SMALL[1..] {
        for i in 0..N {
            p[i] = _mm512_add_pd(_mm512_mul_pd(p[i], x2[i]), _mm512_set1_pd(c));
        }
    }
    let mut t = [zero; N];
    for i in 0..N {
        t[i] = _mm512_div_pd(_mm512_sub_pd(a[i], mid), width);
    }
    let mut g = [_mm512_set1_pd(G[0]); N];
    for &c in &G[1..] {
        for i in 0..N {
            g[i] = _mm512_add_pd(_mm512_mul_pd(g[i], t[i]), _mm512_set1_pd(c));
        }
    }
    let mut e = [zero; N];
    for i in 0..N {
        // SAFETY: AVX-512 F is available (this function's contract).
        e[i] = unsafe { crate::sigmoid::exp_avx512(_mm512_sub_pd(zero, x2[i])) };
    }
    for i in 0..N {
        let small = _mm512_mul_pd(_mm512_mul_pd(_mm512_set1_pd(TWO_OVER_SQRT_PI), a[i]), p[i]);
        let e = e[i];
        let large = _mm512_sub_pd(one, _mm512_mul_pd(e, g[i]));
        let r = _mm512_mask_blend_pd(_mm512_cmp_pd_mask::<_CMP_LT_OQ>(a[i], split), large, small);
        let signed = _mm512_castsi512_pd(_mm512_or_si512(
            _mm512_castpd_si512(r),
            _mm512_and_si512(sign, _mm512_castpd_si512(v[i])),
        ));
        let r = _mm512_mask_blend_pd(_mm512_cmp_pd_mask::<_CMP_UNORD_Q>(v[i], v[i]), signed, v[i]);
        // SAFETY: `out` holds `N` vectors (asserted above).
        unsafe { _mm256_storeu_ps(out[8 * i..].as_mut_ptr(), _mm512_cvtpd_ps(r)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.5, 0.999_593_047_982_555),
            (-3.0, -0.999_977_909_503_001_4),
        ] {
            assert!(
                (erf_f64(x) - want).abs() < 1e-15,
                "erf({x}) = {} != {want}",
                erf_f64(x)
            );
        }
    }

    fn samples() -> Vec<f32> {
        let mut xs: Vec<f32> = (-6000..=6000).map(|i| i as f32 / 1000.0).collect();
        xs.extend([
            0.5,
            -0.5,
            0.499_999_97,
            4.0,
            -4.0,
            1e-30,
            -1e-30,
            1e-3,
            80.0,
            -80.0,
        ]);
        xs.extend([f32::INFINITY, f32::NEG_INFINITY, f32::MIN_POSITIVE, -0.0]);
        xs
    }

    #[test]
    fn reference_is_within_an_ulp_of_the_exact_erf() {
        let mut rounded_same = 0;
        let xs = samples();
        for &x in &xs {
            let (got, want) = (erf(x), erf_f64(x as f64) as f32);
            let ulps = (got.to_bits() as i64 - want.to_bits() as i64).abs();
            assert!(ulps <= 1, "erf({x}) = {got}, exact {want}");
            rounded_same += usize::from(ulps == 0);
        }
        // Off by one only where the exact value lies within ~1e-11 of a rounding boundary.
        assert!(
            rounded_same * 1000 >= xs.len() * 999,
            "{rounded_same} of {}",
            xs.len()
        );
        assert!(erf(f32::NAN).is_nan());
        assert_eq!(erf(-0.0).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn the_kernels_equal_the_reference_bit_for_bit() {
        let mut x = samples();
        x.push(f32::NAN);
        let check = |got: &[f32], what: &str| {
            for (&v, &g) in x.iter().zip(got) {
                let want = erf(v);
                assert!(
                    want.to_bits() == g.to_bits() || (want.is_nan() && g.is_nan()),
                    "{what}: erf({v:e}): {want:e} vs {g:e}"
                );
            }
        };
        let mut got = vec![0f32; x.len()];
        erf_slice(&x, &mut got);
        check(&got, "erf_slice");
        // Each vector kernel over (nearly) all samples, not just the part the dispatch gives it.
        #[cfg(target_arch = "x86_64")]
        {
            let whole = x.len() / 8 * 8;
            if cpu::level() >= cpu::Level::Avx2 {
                // SAFETY: AVX2 is available (checked above); `whole` is a multiple of 8.
                unsafe { erf_avx2(&x[..whole], &mut got[..whole]) };
                check(&got[..whole], "avx2");
            }
            if cpu::level() >= cpu::Level::Avx512 {
                got.fill(0.0);
                // SAFETY: AVX-512 F is available (checked above); `whole` is a multiple of 8.
                unsafe { erf_avx512(&x[..whole], &mut got[..whole]) };
                check(&got[..whole], "avx512");
            }
        }
    }
}
