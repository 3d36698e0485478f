//! The AVX-512 value sums of attention rows for f32 caches: the heads of a group take each
//! value row together, sixteen output elements per vector, each element with the same
//! operations in the same order as [`super::group`]'s reference.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// `weighted_sum64_group`'s AVX-512 kernel for `G` heads (see [`super::group`]): 64 columns
/// of heads of `hs` values, head `h`'s at `acc[h * hs..]`, value row `j`'s at `v[j * hs..]`.
///
/// # Safety
/// AVX-512 F must be available; the bounds of `weighted_sum64_group` hold for `g = G`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn group_avx512<const G: usize>(
    acc: &mut [f32],
    hs: usize,
    ps: &[f32],
    stride: usize,
    len: usize,
    v: &[f32],
    j0: usize,
) {
    // SAFETY: `acc` holds 64 f32 at each head's start (the caller's contract).
    let mut a: [[__m512; 4]; G] = std::array::from_fn(|h| {
        std::array::from_fn(|i| unsafe { _mm512_loadu_ps(acc.as_ptr().add(hs * h + 16 * i)) })
    });
    for j in 0..len {
        let row = v.as_ptr().wrapping_add((j0 + j) * hs);
        // SAFETY: row `j0 + j` lies inside `v` (the caller's contract).
        let x: [__m512; 4] = std::array::from_fn(|i| unsafe { _mm512_loadu_ps(row.add(16 * i)) });
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
            unsafe { _mm512_storeu_ps(acc.as_mut_ptr().add(hs * h + 16 * i), *a) };
        }
    }
}
