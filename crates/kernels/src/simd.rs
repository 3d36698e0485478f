//! What the f32 vector kernels share: [`F32Lanes`], a vector of f32 lanes (256-bit on AVX2,
//! 512-bit on AVX-512) with the few operations a lane-per-output-column kernel needs, so one
//! generic body serves both widths. Every method needs the CPU to run the vector's
//! instructions (the callers' contract); each is `#[inline(always)]` into a function that
//! enables them.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// A vector of f32 lanes.
#[cfg(target_arch = "x86_64")]
pub(crate) trait F32Lanes: Copy {
    /// Lanes per vector.
    const LANES: usize;
    unsafe fn zero() -> Self;
    unsafe fn splat(x: f32) -> Self;
    unsafe fn load(p: *const f32) -> Self;
    /// The first `n` (< `LANES`) values from `p`, the other lanes zero; nothing past them is
    /// read.
    unsafe fn load_first(p: *const f32, n: usize) -> Self;
    unsafe fn store(self, p: *mut f32);
    unsafe fn add(self, x: Self) -> Self;
    unsafe fn sub(self, x: Self) -> Self;
    unsafe fn mul(self, x: Self) -> Self;
    unsafe fn div(self, x: Self) -> Self;
    /// Per lane, `x` where either is NaN (the second operand, as `vminps` does).
    unsafe fn min(self, x: Self) -> Self;
    /// Per lane, `x` where either is NaN.
    unsafe fn max(self, x: Self) -> Self;
    /// `acc + x · w`, rounded after the product and after the sum (not fused).
    unsafe fn mul_add(acc: Self, x: Self, w: Self) -> Self;
    /// `acc + x · w` rounded once (fused; the CPU must have FMA).
    unsafe fn fma(acc: Self, x: Self, w: Self) -> Self;
}

/// `$vector` with intrinsics of prefix `$p` (`_mm256`, `_mm512`).
#[cfg(target_arch = "x86_64")]
macro_rules! f32_lanes {
    ($vector:ty, $lanes:expr, $zero:ident, $splat:ident, $load:ident, $load_first:ident, $store:ident, $add:ident, $sub:ident, $mul:ident, $div:ident, $min:ident, $max:ident, $fmadd:ident) => {
        impl F32Lanes for $vector {
            const LANES: usize = $lanes;
            #[inline(always)]
            unsafe fn zero() -> Self {
                unsafe { $zero() }
            }
            #[inline(always)]
            unsafe fn splat(x: f32) -> Self {
                unsafe { $splat(x) }
            }
            #[inline(always)]
            unsafe fn load(p: *const f32) -> Self {
                unsafe { $load(p) }
            }
            #[inline(always)]
            unsafe fn load_first(p: *const f32, n: usize) -> Self {
                unsafe { $load_first(p, n) }
            }
            #[inline(always)]
            unsafe fn store(self, p: *mut f32) {
                unsafe { $store(p, self) }
            }
            #[inline(always)]
            unsafe fn add(self, x: Self) -> Self {
                unsafe { $add(self, x) }
            }
            #[inline(always)]
            unsafe fn sub(self, x: Self) -> Self {
                unsafe { $sub(self, x) }
            }
            #[inline(always)]
            unsafe fn mul(self, x: Self) -> Self {
                unsafe { $mul(self, x) }
            }
            #[inline(always)]
            unsafe fn div(self, x: Self) -> Self {
                unsafe { $div(self, x) }
            }
            #[inline(always)]
            unsafe fn min(self, x: Self) -> Self {
                unsafe { $min(self, x) }
            }
            #[inline(always)]
            unsafe fn max(self, x: Self) -> Self {
                unsafe { $max(self, x) }
            }
            #[inline(always)]
            unsafe fn mul_add(acc: Self, x: Self, w: Self) -> Self {
                unsafe { $add(acc, $mul(x, w)) }
            }
            #[inline(always)]
            unsafe fn fma(acc: Self, x: Self, w: Self) -> Self {
                unsafe { $fmadd(x, w, acc) }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
f32_lanes!(
    __m256,
    8,
    _mm256_setzero_ps,
    _mm256_set1_ps,
    _mm256_loadu_ps,
    load_first_256,
    _mm256_storeu_ps,
    _mm256_add_ps,
    _mm256_sub_ps,
    _mm256_mul_ps,
    _mm256_div_ps,
    _mm256_min_ps,
    _mm256_max_ps,
    _mm256_fmadd_ps
);
#[cfg(target_arch = "x86_64")]
f32_lanes!(
    __m512,
    16,
    _mm512_setzero_ps,
    _mm512_set1_ps,
    _mm512_loadu_ps,
    load_first_512,
    _mm512_storeu_ps,
    _mm512_add_ps,
    _mm512_sub_ps,
    _mm512_mul_ps,
    _mm512_div_ps,
    _mm512_min_ps,
    _mm512_max_ps,
    _mm512_fmadd_ps
);

/// # Safety
/// AVX2 is available; `p` holds `n` values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn load_first_256(p: *const f32, n: usize) -> __m256 {
    // SAFETY: the caller's contract; a masked load reads only the lanes below `n`.
    unsafe {
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lanes);
        _mm256_maskload_ps(p, mask)
    }
}

/// # Safety
/// AVX-512 F is available; `p` holds `n` (< 16) values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn load_first_512(p: *const f32, n: usize) -> __m512 {
    // SAFETY: the caller's contract; a masked load reads only the lanes below `n`.
    unsafe { _mm512_maskz_loadu_ps(((1u32 << n) - 1) as __mmask16, p) }
}
