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

//! The error function of f32 values in f32 arithmetic with fused multiply-adds: the same
//! operations in the scalar reference and in the AVX2 and AVX-512 kernels (eight and sixteen
//! lanes), so every path gives the same bits (BERT's GELU calls it once per MLP value).
//!
//! For `|x| < 1.25`, `erf(x) = x + x q(x²)` with `q` a degree-8 polynomial of `erf(x)/x - 1`
//! (the leading `x` is exact, so `q`'s rounding errors count about a tenth as much). For
//! `1.25 <= |x| < 4`, `erf(x) = 1 - e^{r(|x| - 2.5)}` with `r` a degree-6 polynomial of
//! `ln erfc` and the exponential below (`e^r <= erfc(1.25) < 0.08`, so its error counts less
//! than a twelfth). From `|x| = 4` on the f32 result is ±1 (`erfc(4) < 2^-25`), which the
//! formula at 4 also rounds to, so `|x|` is clamped there. Both polynomials are near-minimax
//! fits in f64 rounded to f32 (`tools/erf_fit.py` remakes them); each result is within two
//! ulps of the correctly rounded erf and 97% of them are it (tested against [`erf_f64`]).
//! NaN stays NaN.
//! (The erf of onnxruntime's CPU kernels is also an f32 polynomial pair of about this
//! accuracy; the f64 evaluation this replaced cost 3.6 ns a value on AVX-512.)

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::attention::{INV_LN2_32, LN2_HI_32, LN2_LO_32, TAYLOR32};
#[cfg(target_arch = "x86_64")]
use crate::cpu;
pub use crate::num::Scale;
#[cfg(target_arch = "x86_64")]
use crate::simd::F32Lanes;

/// Where the polynomial of `erf(x)/x` hands over to the one of `ln erfc`.
const SPLIT: f32 = 1.25;
/// Past this `|x|`, erf rounds to ±1 in f32.
const CLAMP: f32 = 4.0;
/// The `ln erfc` polynomial's variable is `|x| - MID`.
const MID: f32 = 2.5;
/// `q(u)`, relative error 3.8e-11 of erf(x)/x before rounding, highest degree first.
const SMALL: [f32; 9] = [
    8.261358e-07,
    -1.2792216e-05,
    0.0001173578,
    -0.0008519622,
    0.0052224384,
    -0.026865702,
    0.11283784,
    -0.37612638,
    0.12837917,
];
/// `r(t)`, error 2.8e-10 of erf before rounding, highest degree first.
const LARGE: [f32; 7] = [
    0.00015432565,
    -0.00028652317,
    0.0022570249,
    -0.010849408,
    -0.94391054,
    -5.352687,
    -7.8068156,
];
/// The reference: `erf(x)` as the module doc defines it.
pub fn erf(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs().min(CLAMP);
    let r = if a < SPLIT {
        let u = a * a;
        let mut q = SMALL[0];
        for &c in &SMALL[1..] {
            q = q.mul_add(u, c);
        }
        q.mul_add(a, a)
    } else {
        let t = a - MID;
        let mut r = LARGE[0];
        for &c in &LARGE[1..] {
            r = r.mul_add(t, c);
        }
        1.0 - exp_reduced(r)
    };
    r.copysign(x)
}

/// `e^r` for the `r` of the large branch (`-18 < r < -2.5`): `r = k ln2 + s` with
/// `k = round(r / ln2)` (ties to even) and the softmax exponential's split of ln 2 (exact for
/// these `k`: `-26 <= k <= -3`), `e^s` its degree-7 Taylor polynomial (`|s| <= ln2 / 2`) here
/// with fused multiply-adds, `2^k` from its exponent bits.
fn exp_reduced(r: f32) -> f32 {
    let k = (r * INV_LN2_32).round_ties_even();
    let s = k.mul_add(-LN2_LO_32, k.mul_add(-LN2_HI_32, r));
    let mut p = TAYLOR32[0];
    for &c in TAYLOR32[1..].iter().chain(&[1.0, 1.0]) {
        p = p.mul_add(s, c);
    }
    p * f32::from_bits(((k as i32 + 127) as u32) << 23)
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
        sum * std::f64::consts::FRAC_2_SQRT_PI
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

/// `out[i] = erf(x[i])`: AVX-512 or AVX2 with FMA where [`crate::cpu`] allows, the same
/// bits as [`erf`].
pub fn erf_slice(x: &[f32], out: &mut [f32]) {
    map(x, None, None, out);
}

/// How a graph spells the erf GELU of `v`, in its own operations and order:
/// `finish(v, erf(scale(v)))`, with `finish(v, e)` either `(v · half) · (e + add)` or
/// `(v · (e + add)) · half`. (torch's export is `v / √2`, `+ 1`, `· 0.5` in one of the two
/// orders; onnxruntime's Gelu is `(0.5 · v) · (1 + e)` of `v · (1/√2)`.)
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GeluForm {
    pub scale: Scale,
    pub half: f32,
    pub add: f32,
    /// `(v · half) · (e + add)` where true, else `(v · (e + add)) · half`.
    pub half_first: bool,
}

impl GeluForm {
    /// The reference: the GELU of `v` by this form, over [`erf`].
    pub fn gelu(&self, v: f32) -> f32 {
        let e = erf(self.scale.apply(v));
        match self.half_first {
            true => (v * self.half) * (e + self.add),
            false => (v * (e + self.add)) * self.half,
        }
    }
}

/// `out[i] = form.gelu(x[i] + bias[i])` (`x[i]` alone without a bias): the same bits as
/// [`GeluForm::gelu`], vectorized like [`erf_slice`]. `bias`, when given, is as long as `x`.
pub fn gelu_slice(x: &[f32], bias: Option<&[f32]>, form: GeluForm, out: &mut [f32]) {
    assert!(
        bias.is_none_or(|b| b.len() >= x.len()),
        "a bias for every element"
    );
    map(x, bias, Some(form), out);
}

/// `out[i]` = erf of `x[i]`, or `form`'s GELU of `x[i] + bias[i]`.
fn map(x: &[f32], bias: Option<&[f32]>, form: Option<GeluForm>, out: &mut [f32]) {
    let n = x.len().min(out.len());
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if cpu::level() >= cpu::Level::Avx512 {
        done = n / 16 * 16;
        let pass = Pass::new(&x[..done], bias, form);
        // SAFETY: AVX-512 F is available (checked above); `pass` and `out` hold `done`
        // elements.
        unsafe { map_avx512(pass, &mut out[..done]) };
    }
    #[cfg(target_arch = "x86_64")]
    if cpu::features().avx2_fma() {
        let end = done + (n - done) / 8 * 8;
        let pass = Pass::new(&x[done..end], bias.map(|b| &b[done..]), form);
        // SAFETY: AVX2 and FMA are available (checked above); both ranges hold a multiple of 8.
        unsafe { map_avx2(pass, &mut out[done..end]) };
        done = end;
    }
    for i in done..n {
        let v = bias.map_or(x[i], |b| x[i] + b[i]);
        out[i] = form.map_or_else(|| erf(v), |f| f.gelu(v));
    }
}

/// One vectorized pass: its input, the bias, the GELU form (none: the plain erf).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Pass<'a> {
    x: &'a [f32],
    bias: Option<&'a [f32]>,
    form: Option<GeluForm>,
}

#[cfg(target_arch = "x86_64")]
impl<'a> Pass<'a> {
    fn new(x: &'a [f32], bias: Option<&'a [f32]>, form: Option<GeluForm>) -> Self {
        Pass {
            x,
            bias: bias.map(|b| &b[..x.len()]),
            form,
        }
    }

    /// The part of the pass from element `at` on.
    fn from(self, at: usize) -> Self {
        Pass {
            x: &self.x[at..],
            bias: self.bias.map(|b| &b[at..]),
            form: self.form,
        }
    }
}

/// # Safety
/// AVX2 and FMA must be available; `out` as long as the pass, a multiple of 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn map_avx2(pass: Pass, out: &mut [f32]) {
    // SAFETY: the features `map_lanes` needs of `__m256` are enabled; the lengths as required.
    unsafe { map_lanes::<__m256>(pass, out) }
}

/// # Safety
/// AVX-512 F must be available; `out` as long as the pass, a multiple of 16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn map_avx512(pass: Pass, out: &mut [f32]) {
    // SAFETY: as for `map_avx2`, with `__m512`.
    unsafe { map_lanes::<__m512>(pass, out) }
}

/// Vectors an erf kernel computes side by side: each lane's operations are one long
/// dependent chain (two polynomials and an exponential), so independent vectors interleaved
/// keep the vector units busy where one vector at a time waits on each result.
const CHAINS: usize = 4;

/// The pass over whole vectors of `V`, [`CHAINS`] at a time and then one at a time.
///
/// # Safety
/// The CPU runs `V`'s instructions and FMA (the caller enables them); `out` is as long as the
/// pass, a multiple of `V::LANES`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn map_lanes<V: ErfLanes>(pass: Pass, out: &mut [f32]) {
    let n = out.len();
    let mut at = 0;
    while at + V::LANES * CHAINS <= n {
        // SAFETY: `CHAINS` vectors from `at` are inside both; the caller's contract for the rest.
        unsafe { map_vectors::<V, CHAINS>(pass.from(at), &mut out[at..]) };
        at += V::LANES * CHAINS;
    }
    while at < n {
        // SAFETY: as above, one vector.
        unsafe { map_vectors::<V, 1>(pass.from(at), &mut out[at..]) };
        at += V::LANES;
    }
}

/// `N` vectors of the pass, each lane the reference's operations in its order: both of erf's
/// branches computed and the lane's own kept.
///
/// # Safety
/// As [`map_lanes`]; the pass and `out` hold `N` vectors.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn map_vectors<V: ErfLanes, const N: usize>(pass: Pass, out: &mut [f32]) {
    let len = V::LANES * N;
    assert!(pass.x.len() >= len && out.len() >= len);
    assert!(pass.bias.is_none_or(|b| b.len() >= len));
    // SAFETY: the caller's contract: the CPU runs `V`'s instructions; the loads and stores
    // stay inside the `N` vectors asserted above.
    unsafe {
        let zero = V::zero();
        let (mut v, mut s) = ([zero; N], [zero; N]);
        for i in 0..N {
            v[i] = V::load(pass.x[V::LANES * i..].as_ptr());
            if let Some(b) = pass.bias {
                v[i] = v[i].add(V::load(b[V::LANES * i..].as_ptr()));
            }
            s[i] = match pass.form.map(|f| f.scale) {
                None => v[i],
                Some(Scale::Divide(d)) => v[i].div(V::splat(d)),
                Some(Scale::Multiply(m)) => v[i].mul(V::splat(m)),
            };
        }
        let e = erf_vectors::<V, N>(s);
        for i in 0..N {
            let y = match pass.form {
                None => e[i],
                Some(f) => {
                    let (half, add) = (V::splat(f.half), V::splat(f.add));
                    match f.half_first {
                        true => v[i].mul(half).mul(e[i].add(add)),
                        false => v[i].mul(e[i].add(add)).mul(half),
                    }
                }
            };
            y.store(out[V::LANES * i..].as_mut_ptr());
        }
    }
}

/// [`erf`] of each lane of `N` vectors.
///
/// # Safety
/// The CPU runs `V`'s instructions and FMA.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn erf_vectors<V: ErfLanes, const N: usize>(v: [V; N]) -> [V; N] {
    // SAFETY: the caller's contract.
    unsafe {
        let zero = V::zero();
        let (mut a, mut u) = ([zero; N], [zero; N]);
        for i in 0..N {
            a[i] = v[i].abs_min(V::splat(CLAMP));
            u[i] = a[i].mul(a[i]);
        }
        let mut q = [V::splat(SMALL[0]); N];
        for &c in &SMALL[1..] {
            for i in 0..N {
                q[i] = V::fma(V::splat(c), q[i], u[i]);
            }
        }
        let mut t = [zero; N];
        for i in 0..N {
            t[i] = a[i].sub(V::splat(MID));
        }
        let mut r = [V::splat(LARGE[0]); N];
        for &c in &LARGE[1..] {
            for i in 0..N {
                r[i] = V::fma(V::splat(c), r[i], t[i]);
            }
        }
        let mut k = [zero; N];
        for i in 0..N {
            k[i] = r[i].mul(V::splat(INV_LN2_32)).round();
            r[i] = V::fma(r[i], k[i], V::splat(-LN2_HI_32));
            r[i] = V::fma(r[i], k[i], V::splat(-LN2_LO_32));
        }
        let mut p = [V::splat(TAYLOR32[0]); N];
        for &c in TAYLOR32[1..].iter().chain(&[1.0, 1.0]) {
            for i in 0..N {
                p[i] = V::fma(V::splat(c), p[i], r[i]);
            }
        }
        let mut e = [zero; N];
        for i in 0..N {
            let small = V::fma(a[i], q[i], a[i]);
            let large = V::splat(1.0).sub(p[i].mul(V::pow2(k[i])));
            e[i] = V::select_lt(a[i], V::splat(SPLIT), small, large).signed_like(v[i]);
        }
        e
    }
}

/// The operations [`map_vectors`] needs beyond [`F32Lanes`]. Each needs the CPU to run the
/// vector's instructions (the callers' contract).
#[cfg(target_arch = "x86_64")]
trait ErfLanes: F32Lanes {
    /// `min(|self|, hi)`.
    unsafe fn abs_min(self, hi: Self) -> Self;
    /// Rounded to the nearest integer, ties to even.
    unsafe fn round(self) -> Self;
    /// `2^k` of integral `k` in the normal range.
    unsafe fn pow2(k: Self) -> Self;
    /// Per lane, `if_less` where `a < b`, else `other`.
    unsafe fn select_lt(a: Self, b: Self, if_less: Self, other: Self) -> Self;
    /// `self` with `x`'s sign, or `x` itself where `x` is NaN.
    unsafe fn signed_like(self, x: Self) -> Self;
}

#[cfg(target_arch = "x86_64")]
impl ErfLanes for __m256 {
    #[inline(always)]
    unsafe fn abs_min(self, hi: Self) -> Self {
        // SAFETY: AVX2 (the trait's contract).
        unsafe { _mm256_min_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0), self), hi) }
    }
    #[inline(always)]
    unsafe fn round(self) -> Self {
        // SAFETY: as above.
        unsafe { _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(self) }
    }
    #[inline(always)]
    unsafe fn pow2(k: Self) -> Self {
        // SAFETY: as above.
        unsafe {
            let biased = _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127));
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(biased))
        }
    }
    #[inline(always)]
    unsafe fn select_lt(a: Self, b: Self, if_less: Self, other: Self) -> Self {
        // SAFETY: as above.
        unsafe { _mm256_blendv_ps(other, if_less, _mm256_cmp_ps::<_CMP_LT_OQ>(a, b)) }
    }
    #[inline(always)]
    unsafe fn signed_like(self, x: Self) -> Self {
        // SAFETY: as above.
        unsafe {
            let signed = _mm256_or_ps(self, _mm256_and_ps(_mm256_set1_ps(-0.0), x));
            _mm256_blendv_ps(signed, x, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl ErfLanes for __m512 {
    #[inline(always)]
    unsafe fn abs_min(self, hi: Self) -> Self {
        // SAFETY: AVX-512 F (the trait's contract).
        unsafe { _mm512_min_ps(_mm512_abs_ps(self), hi) }
    }
    #[inline(always)]
    unsafe fn round(self) -> Self {
        // SAFETY: as above.
        unsafe { _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(self) }
    }
    #[inline(always)]
    unsafe fn pow2(k: Self) -> Self {
        // SAFETY: as above.
        unsafe {
            let biased = _mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127));
            _mm512_castsi512_ps(_mm512_slli_epi32::<23>(biased))
        }
    }
    #[inline(always)]
    unsafe fn select_lt(a: Self, b: Self, if_less: Self, other: Self) -> Self {
        // SAFETY: as above.
        unsafe { _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b), other, if_less) }
    }
    #[inline(always)]
    unsafe fn signed_like(self, x: Self) -> Self {
        // SAFETY: as above.
        unsafe {
            let sign = _mm512_set1_epi32(i32::MIN);
            let signed = _mm512_or_si512(
                _mm512_castps_si512(self),
                _mm512_and_si512(sign, _mm512_castps_si512(x)),
            );
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
            _mm512_mask_blend_ps(nan, _mm512_castsi512_ps(signed), x)
        }
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
    fn reference_is_within_two_ulps_of_the_exact_erf() {
        let ulps = |x: f32| {
            let (got, want) = (erf(x), erf_f64(x as f64) as f32);
            (got.to_bits() as i64 - want.to_bits() as i64).unsigned_abs()
        };
        for &x in &samples() {
            assert!(
                ulps(x) <= 2,
                "erf({x}) = {}, exact {}",
                erf(x),
                erf_f64(x as f64)
            );
        }
        // Every 61st f32 from 2^-30 to 4, both branches and the split between them, where
        // the rounding errors of the polynomials and the exponential add up the most.
        let (lo, hi) = (2f32.powi(-30).to_bits(), 4f32.to_bits());
        let (mut worst, mut exact, mut count) = (0, 0, 0);
        for bits in (lo..=hi).step_by(61) {
            let d = ulps(f32::from_bits(bits));
            worst = worst.max(d);
            (exact, count) = (exact + usize::from(d == 0), count + 1);
        }
        assert!(worst <= 2, "{worst} ulps");
        assert!(
            exact * 10 >= count * 7,
            "{exact} of {count} correctly rounded"
        );
        assert!(erf(f32::NAN).is_nan());
        assert_eq!(erf(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(erf(CLAMP), 1.0);
        assert_eq!(erf(f32::NEG_INFINITY), -1.0);
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
            let whole = x.len() / 16 * 16;
            if cpu::features().avx2_fma() {
                // SAFETY: AVX2 and FMA are available (checked above); `whole` is a multiple
                // of 8.
                unsafe { map_avx2(Pass::new(&x[..whole], None, None), &mut got[..whole]) };
                check(&got[..whole], "avx2");
            }
            if cpu::level() >= cpu::Level::Avx512 {
                got.fill(0.0);
                // SAFETY: AVX-512 F is available (checked above); `whole` is a multiple of 16.
                unsafe { map_avx512(Pass::new(&x[..whole], None, None), &mut got[..whole]) };
                check(&got[..whole], "avx512");
            }
        }
    }

    #[test]
    fn gelu_forms_equal_their_reference_on_every_path() {
        let x: Vec<f32> = (0..203).map(|i| (i as f32 - 101.0) * 0.047).collect();
        let bias: Vec<f32> = (0..203).map(|i| (i % 7) as f32 * 0.31 - 1.0).collect();
        let forms = [
            GeluForm {
                scale: Scale::Divide(std::f32::consts::SQRT_2),
                half: 0.5,
                add: 1.0,
                half_first: false,
            },
            GeluForm {
                scale: Scale::Multiply(std::f32::consts::FRAC_1_SQRT_2),
                half: 0.5,
                add: 1.0,
                half_first: true,
            },
        ];
        let mut got = vec![0f32; x.len()];
        for form in forms {
            for bias in [None, Some(&bias[..])] {
                let want: Vec<f32> = (0..x.len())
                    .map(|i| form.gelu(bias.map_or(x[i], |b| x[i] + b[i])))
                    .collect();
                // `got` holds the results from element `skip` on.
                let check = |got: &[f32], skip: usize, what: &str| {
                    for (i, (w, g)) in want[skip..].iter().zip(got).enumerate() {
                        assert_eq!(
                            w.to_bits(),
                            g.to_bits(),
                            "{what} {form:?} at {i}: {w} vs {g}"
                        );
                    }
                };
                // Offsets put every element on the vector paths and on the scalar tail.
                for skip in [0, 5] {
                    gelu_slice(&x[skip..], bias.map(|b| &b[skip..]), form, &mut got[skip..]);
                    check(&got[skip..], skip, "gelu_slice");
                }
                #[cfg(target_arch = "x86_64")]
                {
                    let whole = x.len() / 16 * 16;
                    let pass = Pass::new(&x[..whole], bias, Some(form));
                    if cpu::features().avx2_fma() {
                        // SAFETY: AVX2 and FMA are available (checked above); `whole` is a
                        // multiple of 8.
                        unsafe { map_avx2(pass, &mut got[..whole]) };
                        check(&got[..whole], 0, "avx2");
                    }
                    if cpu::level() >= cpu::Level::Avx512 {
                        // SAFETY: AVX-512 F is available (checked above); `whole` is a
                        // multiple of 16.
                        unsafe { map_avx512(pass, &mut got[..whole]) };
                        check(&got[..whole], 0, "avx512");
                    }
                }
            }
        }
        // The values are GELU's: near v for large v, near 0 for very negative v.
        let g = forms[0].gelu(3.0);
        assert!((g - 2.995_950_4).abs() < 1e-6, "{g}");
        assert!(forms[1].gelu(-6.0).abs() < 1e-7);
    }
}
