//! AVX2 attention rows: the arithmetic of [`super::group`]'s reference, bit for bit, for f32
//! queries over caches of any [`CacheElem`] (each element widened to f32 on load, exactly, as
//! the reference reads it).
//!
//! The reference takes each dot product `q · k_j` in eight lanes (lane `l` the `d` with
//! `d % 8 == l`, ascending, by fused multiply-add) summed by a fixed tree, and each output
//! element `Σ_j p_j v_j[d]` over `j` ascending by fused multiply-add. Both map onto 8-wide
//! vectors directly:
//! - scores: one accumulator vector per key, `fma(q[c..c + 8], k_j[c..c + 8], acc)` for `c`
//!   ascending, then the horizontal sum in the reference's tree; eight keys at a time so
//!   their chains overlap;
//! - values: eight (or, with AVX-512, sixteen: [`super::avx512`]) output elements at once,
//!   one per lane, each adding `p_j * v_j[d]` for `j` ascending; with AVX-512 the heads that
//!   share a KV head take each value row together, so their chains overlap.
//!
//! Head sizes not a multiple of eight, softcapping and the softmax itself run the reference's
//! scalar code.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::kv::{CacheElem, CacheKind};
#[cfg(target_arch = "x86_64")]
use crate::cpu;

/// Whether [`dots`] and [`weighted_sum64`] can run here (AVX2, FMA and F16C, per
/// [`crate::cpu`]).
pub(super) fn supported(head_size: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let f = cpu::features();
        head_size.is_multiple_of(8) && f.avx2_fma() && f.f16c
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = head_size;
        false
    }
}

/// Eight cache elements from `p` as f32 (exact widening).
///
/// # Safety
/// AVX2 and F16C must be available (the caller's target features) and eight elements
/// readable at `p`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn load8<C: CacheElem>(p: *const C) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe {
        match C::KIND {
            CacheKind::F32 => _mm256_loadu_ps(p.cast()),
            CacheKind::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
            CacheKind::BF16 => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                _mm_loadu_si128(p.cast()),
            ))),
            CacheKind::I8 => _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast()))),
        }
    }
}

/// The reference's tree over the eight lanes: `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 +
/// l7))`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s)))
}

/// [`hsum`] of four vectors at once into `out[..4]`, each by the same additions in the same
/// order (`s_k = l_k + l_(k+4)`, then `(s0 + s2) + (s1 + s3)`), with the four keys' partial
/// sums side by side in the lanes instead of one key's reduced in place.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn hsum4(v: [__m256; 4], out: &mut [f32]) {
    let [a, b, c, d] = v;
    // [a.s | b.s] and [c.s | d.s]: s_k = l_k + l_(k+4) per 128-bit half.
    let ab = _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(a, b),
        _mm256_permute2f128_ps::<0x31>(a, b),
    );
    let cd = _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(c, d),
        _mm256_permute2f128_ps::<0x31>(c, d),
    );
    // Low half [a.s0 + a.s2, a.s1 + a.s3, c.s0 + c.s2, c.s1 + c.s3], high half b and d.
    let xy = _mm256_add_ps(
        _mm256_shuffle_ps::<0b01_00_01_00>(ab, cd),
        _mm256_shuffle_ps::<0b11_10_11_10>(ab, cd),
    );
    // Low half [a, c, ..], high half [b, d, ..].
    let r = _mm256_add_ps(
        _mm256_shuffle_ps::<0b10_00_10_00>(xy, xy),
        _mm256_shuffle_ps::<0b11_01_11_01>(xy, xy),
    );
    let abcd = _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0));
    assert!(out.len() >= 4, "four sums");
    // SAFETY: `out` holds at least four f32 (asserted above).
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), _mm256_castps256_ps128(abcd)) };
}

/// `out[i] = q · k[(j0 + i) * hs..][..hs]` for every `i`, in the reference's order (before
/// any scale).
///
/// # Safety
/// AVX2, FMA and F16C must be available ([`supported`]), `q.len() == hs`, `hs % 8 == 0` and
/// `k.len() >= (j0 + out.len()) * hs`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dots<C: CacheElem>(q: &[f32], k: &[C], j0: usize, out: &mut [f32]) {
    let hs = q.len();
    assert!(
        hs.is_multiple_of(8) && k.len() >= (j0 + out.len()) * hs,
        "dots arguments were checked by the caller"
    );
    let row = |j: usize| k.as_ptr().wrapping_add((j0 + j) * hs);
    let mut j = 0;
    // Eight keys at a time (eight independent chains keep both FMA ports busy), then four.
    macro_rules! keys {
        ($n:literal) => {
            while j + $n <= out.len() {
                let mut acc = [_mm256_setzero_ps(); $n];
                for c in (0..hs).step_by(8) {
                    // SAFETY: `c + 8 <= hs`, and rows j0 + j..j0 + j + $n lie inside `k`
                    // (asserted).
                    unsafe {
                        let qv = _mm256_loadu_ps(q.as_ptr().add(c));
                        for (i, a) in acc.iter_mut().enumerate() {
                            *a = _mm256_fmadd_ps(qv, load8(row(j + i).add(c)), *a);
                        }
                    }
                }
                for (i, four) in acc.chunks_exact(4).enumerate() {
                    let four = [four[0], four[1], four[2], four[3]];
                    // SAFETY: AVX2 is available (the caller's contract); the four outputs exist.
                    unsafe { hsum4(four, &mut out[j + 4 * i..j + 4 * i + 4]) };
                }
                j += $n;
            }
        };
    }
    keys!(8);
    keys!(4);
    for (j, o) in out.iter_mut().enumerate().skip(j) {
        let mut acc = _mm256_setzero_ps();
        for c in (0..hs).step_by(8) {
            // SAFETY: as above.
            unsafe {
                let qv = _mm256_loadu_ps(q.as_ptr().add(c));
                acc = _mm256_fmadd_ps(qv, load8(row(j).add(c)), acc);
            }
        }
        *o = hsum(acc);
    }
}

/// `acc[d] = fma(p, v[d], acc[d])` for every `d` (`hs % 8 == 0`), eight lanes at a time.
///
/// # Safety
/// AVX2, FMA and F16C must be available and `acc.len() == v.len()`, a multiple of 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn weighted_add<C: CacheElem>(acc: &mut [f32], p: f32, v: &[C]) {
    assert!(
        acc.len() == v.len() && acc.len().is_multiple_of(8),
        "weighted_add arguments were checked by the caller"
    );
    let pv = _mm256_set1_ps(p);
    for d in (0..acc.len()).step_by(8) {
        // SAFETY: `d + 8 <= len` for both slices (asserted above).
        unsafe {
            let a = _mm256_loadu_ps(acc.as_ptr().add(d));
            let x = load8(v.as_ptr().add(d));
            _mm256_storeu_ps(acc.as_mut_ptr().add(d), _mm256_fmadd_ps(pv, x, a));
        }
    }
}

/// `acc[d] = fma(ps[j], v[(j0 + j) * hs + d], acc[d])` for every `j` ascending and every
/// `d`, with `hs == acc.len() == 64`: the eight accumulator vectors stay in registers across
/// the keys (each element sees the same operations in the same order as [`weighted_add`] per
/// key).
///
/// # Safety
/// AVX2, FMA and F16C must be available, `acc.len() == 64` and `v.len() >= (j0 + ps.len())
/// * 64`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn weighted_sum64<C: CacheElem>(acc: &mut [f32], ps: &[f32], v: &[C], j0: usize) {
    assert!(
        acc.len() == 64 && v.len() >= (j0 + ps.len()) * 64,
        "weighted_sum64 arguments were checked by the caller"
    );
    // SAFETY: `acc` holds 64 f32 (asserted above).
    let mut a: [__m256; 8] =
        std::array::from_fn(|i| unsafe { _mm256_loadu_ps(acc.as_ptr().add(8 * i)) });
    for (j, &p) in ps.iter().enumerate() {
        let pv = _mm256_set1_ps(p);
        let row = v.as_ptr().wrapping_add((j0 + j) * 64);
        for (i, a) in a.iter_mut().enumerate() {
            // SAFETY: row `j0 + j` lies inside `v` (asserted above).
            let x = unsafe { load8(row.add(8 * i)) };
            *a = _mm256_fmadd_ps(pv, x, *a);
        }
    }
    for (i, a) in a.iter().enumerate() {
        // SAFETY: as for the loads.
        unsafe { _mm256_storeu_ps(acc.as_mut_ptr().add(8 * i), *a) };
    }
}
