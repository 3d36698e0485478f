//! The AVX-512 value sums of attention rows, over caches of any [`CacheElem`]: the heads of a
//! group take each value row together, sixteen output elements per vector, each element with
//! the same operations in the same order as [`super::group`]'s reference.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::kv::{CacheElem, CacheKind};

/// Sixteen cache elements from `p` as f32 (exact widening).
///
/// # Safety
/// AVX-512 F must be available (the caller's target features) and sixteen elements readable
/// at `p`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn load16<C: CacheElem>(p: *const C) -> __m512 {
    // SAFETY: the caller's contract.
    unsafe {
        match C::KIND {
            CacheKind::F32 => _mm512_loadu_ps(p.cast()),
            CacheKind::F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())),
            CacheKind::BF16 => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                _mm256_loadu_si256(p.cast()),
            ))),
            CacheKind::I8 => _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast()))),
        }
    }
}

/// `weighted_sum64_group`'s AVX-512 kernel for `G` heads (see [`super::group`]).
///
/// # Safety
/// AVX-512 F must be available; the bounds of `weighted_sum64_group` hold for `g = G`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn group_avx512<const G: usize, C: CacheElem>(
    acc: &mut [f32],
    ps: &[f32],
    stride: usize,
    len: usize,
    v: &[C],
    j0: usize,
) {
    // SAFETY: `acc` holds 64 f32 per head (the caller's contract).
    let mut a: [[__m512; 4]; G] = std::array::from_fn(|h| {
        std::array::from_fn(|i| unsafe { _mm512_loadu_ps(acc.as_ptr().add(64 * h + 16 * i)) })
    });
    for j in 0..len {
        let row = v.as_ptr().wrapping_add((j0 + j) * 64);
        // SAFETY: row `j0 + j` lies inside `v` (the caller's contract).
        let x: [__m512; 4] = std::array::from_fn(|i| unsafe { load16(row.add(16 * i)) });
        for (h, a) in a.iter_mut().enumerate() {
            let pv = _mm512_set1_ps(ps[h * stride + j]);
            for (a, &x) in a.iter_mut().zip(&x) {
                *a = _mm512_fmadd_ps(pv, x, *a);
            }
        }
    }
    for (h, a) in a.iter().enumerate() {
        for (i, a) in a.iter().enumerate() {
            // SAFETY: as for the loads.
            unsafe { _mm512_storeu_ps(acc.as_mut_ptr().add(64 * h + 16 * i), *a) };
        }
    }
}
