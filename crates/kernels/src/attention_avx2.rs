//! AVX2 attention rows for f32 caches: the arithmetic of [`crate::attention`]'s reference,
//! bit for bit.
//!
//! The reference sums each dot product `q · k_j` over `d` ascending, one product at a time,
//! and each output element `Σ_j p_j v_j[d]` over `j` ascending. Both orders are kept:
//! - scores: eight keys at once, one per lane. Eight key rows are loaded in 8-wide column
//!   chunks and transposed in registers, so lane `l` accumulates `q[d] * k_{j+l}[d]` for `d`
//!   ascending, exactly the reference's chain for key `j + l`;
//! - values: eight output elements at once, one per lane, each adding `p_j * v_j[d]` for `j`
//!   ascending.
//!
//! Multiplies and adds stay separate (no FMA), as in the reference. Keys past the last full
//! group of eight, head sizes not a multiple of eight, softcapping and the softmax itself run
//! the reference's scalar code.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Whether [`scores8`] and [`weighted_sum`] can run here.
pub fn supported(head_size: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        head_size.is_multiple_of(8) && std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = head_size;
        false
    }
}

/// `out[l] = Σ_d q[d] * k[(j0 + l) * hs + d]` for `l` in `0..8`, `d` ascending.
///
/// # Safety
/// AVX2 must be available ([`supported`]), `q.len() == hs`, `hs % 8 == 0` and
/// `k.len() >= (j0 + 8) * hs`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub unsafe fn scores8(q: &[f32], k: &[f32], j0: usize, out: &mut [f32; 8]) {
    let hs = q.len();
    assert!(
        hs.is_multiple_of(8) && k.len() >= (j0 + 8) * hs,
        "scores8 arguments were checked by the caller"
    );
    let base = k.as_ptr().wrapping_add(j0 * hs);
    let mut acc = _mm256_setzero_ps();
    for c in (0..hs).step_by(8) {
        // SAFETY: rows j0..j0 + 8 and columns c..c + 8 lie inside `k` (asserted above).
        let rows: [__m256; 8] =
            std::array::from_fn(|r| unsafe { _mm256_loadu_ps(base.add(r * hs + c)) });
        let cols = transpose8(rows);
        for (i, col) in cols.iter().enumerate() {
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(q[c + i]), *col));
        }
    }
    // SAFETY: `out` holds 8 f32.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), acc) };
}

/// `acc[d] += p * v[d]` for every `d` (`hs % 8 == 0`), eight lanes at a time.
///
/// # Safety
/// AVX2 must be available and `acc.len() == v.len()`, a multiple of 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub unsafe fn weighted_add(acc: &mut [f32], p: f32, v: &[f32]) {
    assert!(
        acc.len() == v.len() && acc.len().is_multiple_of(8),
        "weighted_add arguments were checked by the caller"
    );
    let pv = _mm256_set1_ps(p);
    for d in (0..acc.len()).step_by(8) {
        // SAFETY: `d + 8 <= len` for both slices (asserted above).
        unsafe {
            let a = _mm256_loadu_ps(acc.as_ptr().add(d));
            let x = _mm256_loadu_ps(v.as_ptr().add(d));
            _mm256_storeu_ps(
                acc.as_mut_ptr().add(d),
                _mm256_add_ps(a, _mm256_mul_ps(pv, x)),
            );
        }
    }
}

/// `acc[d] += ps[j] * v[(j0 + j) * hs + d]` for every `j` ascending and every `d`, with
/// `hs == acc.len() == 64`: the eight accumulator vectors stay in registers across the keys
/// (each element sees the same additions in the same order as [`weighted_add`] per key).
///
/// # Safety
/// AVX2 must be available, `acc.len() == 64` and `v.len() >= (j0 + ps.len()) * 64`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub unsafe fn weighted_sum64(acc: &mut [f32], ps: &[f32], v: &[f32], j0: usize) {
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
            let x = unsafe { _mm256_loadu_ps(row.add(8 * i)) };
            *a = _mm256_add_ps(*a, _mm256_mul_ps(pv, x));
        }
    }
    for (i, a) in a.iter().enumerate() {
        // SAFETY: as for the loads.
        unsafe { _mm256_storeu_ps(acc.as_mut_ptr().add(8 * i), *a) };
    }
}

/// The 8×8 transpose: lane `r` of result `i` is lane `i` of input `r`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ]
}
