//! AVX2 attention rows for f32 queries and caches: the arithmetic of [`super::group`]'s
//! reference, bit for bit. Caches of other elements are widened to f32 a run at a time first
//! ([`widen`], exact); an int8 cache's scales are applied by [`scores_heads`] and [`normalize`].
//!
//! The reference takes each dot product `q · k_j` in eight lanes (lane `l` the `d` with
//! `d % 8 == l`, ascending, by fused multiply-add) summed by a fixed tree, and each output
//! element `Σ_j p_j v_j[d]` over `j` ascending by fused multiply-add. Both map onto 8-wide
//! vectors directly:
//! - scores: one accumulator vector per query and key, `fma(q[c..c + 8], k_j[c..c + 8], acc)`
//!   for `c` ascending, then the horizontal sum in the reference's tree; eight keys at a time
//!   so their chains overlap, and the heads that share a KV head take each key row together;
//! - values: eight (or, with AVX-512, sixteen: [`super::avx512`]) output elements at once,
//!   one per lane, each adding `p_j * v_j[d]` for `j` ascending; with AVX-512 the heads that
//!   share a KV head take each value row together, so their chains overlap.
//!
//! - score scaling, the running maximum and the softmax weights' normalization: elementwise
//!   multiplies and divides (exact per element, so any width gives the reference's bits) and a
//!   maximum that skips NaN as `f32::max` does.
//!
//! Head sizes not a multiple of eight and softcapping run the reference's scalar code; the
//! exponentials are [`super::exp`]'s.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::kv::{CacheElem, CacheKind};
#[cfg(target_arch = "x86_64")]
use crate::cpu;

/// Whether the kernels of this file can run here (AVX2, FMA and F16C, per [`crate::cpu`]).
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

/// The reference's tree over the eight lanes: `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 +
/// l7))`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
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
#[inline]
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

/// Scores of the `Q` queries `qs` over the same keys: query `i`'s `out[i * stride + j] =
/// ((q_i · k_j) * key_scales[j]) * scale` (without `key_scales`, `(q_i · k_j) * scale`) with
/// `k_j = k[(j0 + j) * hs..][..hs]` for every `j < len`, the dot products in the reference's
/// order; its largest score and `max[i]` (NaN skipped, as `f32::max` does) is the result's
/// `[i]`. Each key's row is loaded once for all the queries, `K` keys at a time (`Q · K`
/// independent chains), so with several queries the products, not the loads, bound the pass.
///
/// With AVX-512 VL (32 vector registers) up to three queries fit beside eight keys' sums, on
/// AVX2 alone two beside four; [`scores_heads`] chooses.
///
/// # Safety
/// AVX2 and FMA must be available (and AVX-512 VL for `Q * K > 12`), every query `hs` long
/// (`hs % 8 == 0`), `k.len() >= (j0 + len) * hs`, `out.len() >= (Q - 1) * stride + len`, and
/// `key_scales`, when given, at least `len` long.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn scores_block<const Q: usize, const K: usize>(
    qs: [&[f32]; Q],
    k: &[f32],
    (j0, len): (usize, usize),
    (out, stride): (&mut [f32], usize),
    key_scales: Option<&[f32]>,
    scale: f32,
    max: [f32; Q],
) -> [f32; Q] {
    let hs = qs[0].len();
    assert!(
        Q > 0
            && K.is_multiple_of(4)
            && hs.is_multiple_of(8)
            && qs.iter().all(|q| q.len() == hs)
            && k.len() >= (j0 + len) * hs
            && out.len() >= (Q - 1) * stride + len
            && key_scales.is_none_or(|s| s.len() >= len),
        "scores_block arguments were checked by the caller"
    );
    let row = |j: usize| k.as_ptr().wrapping_add((j0 + j) * hs);
    let mut j = 0;
    while j + K <= len {
        let mut acc = [[_mm256_setzero_ps(); K]; Q];
        for c in (0..hs).step_by(8) {
            // SAFETY: `c + 8 <= hs` for every query (asserted).
            let qv: [__m256; Q] =
                std::array::from_fn(|i| unsafe { _mm256_loadu_ps(qs[i].as_ptr().add(c)) });
            for key in 0..K {
                // SAFETY: rows j0 + j..j0 + j + K lie inside `k` (asserted).
                let kv = unsafe { _mm256_loadu_ps(row(j + key).add(c)) };
                for (a, &qv) in acc.iter_mut().zip(&qv) {
                    a[key] = _mm256_fmadd_ps(qv, kv, a[key]);
                }
            }
        }
        for (i, a) in acc.iter().enumerate() {
            for (f, four) in a.chunks_exact(4).enumerate() {
                let at = i * stride + j + 4 * f;
                // SAFETY: AVX2 is available (the caller's contract); the four outputs exist.
                unsafe { hsum4([four[0], four[1], four[2], four[3]], &mut out[at..at + 4]) };
            }
        }
        j += K;
    }
    std::array::from_fn(|i| {
        let out = &mut out[i * stride..][..len];
        // SAFETY: as above; the last keys one query at a time.
        unsafe {
            dots(qs[i], k, j0 + j, &mut out[j..]);
            scale_max(out, key_scales, scale, max[i])
        }
    })
}

/// [`scores_block`] for every query of `qs` (heads that see the same keys), as many at a
/// time as the registers hold: query `i`'s scores go to `out[i * stride..][..len]` and its
/// maximum, from `max[i]`, back into `max[i]`.
///
/// # Safety
/// As [`scores_block`]'s, for `Q = qs.len()`, and `max.len() == qs.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn scores_heads(
    qs: &[&[f32]],
    k: &[f32],
    (j0, len): (usize, usize),
    (out, stride): (&mut [f32], usize),
    key_scales: Option<&[f32]>,
    scale: f32,
    max: &mut [f32],
) {
    assert!(max.len() == qs.len(), "a maximum per query");
    let wide = cpu::level() >= cpu::Level::Avx512;
    let mut i = 0;
    while i < qs.len() {
        let out = &mut out[i * stride..];
        let (q, m) = (&qs[i..], &mut max[i..]);
        // SAFETY: the caller's contract; AVX-512 VL when `wide` (from the feature table).
        let taken = unsafe {
            match (q.len(), wide) {
                (0 | 1, _) => {
                    let r = scores_block::<1, 8>(
                        [q[0]],
                        k,
                        (j0, len),
                        (out, stride),
                        key_scales,
                        scale,
                        [m[0]],
                    );
                    m[0] = r[0];
                    1
                }
                (2, _) | (3.., false) => {
                    let r = scores_block::<2, 4>(
                        [q[0], q[1]],
                        k,
                        (j0, len),
                        (out, stride),
                        key_scales,
                        scale,
                        [m[0], m[1]],
                    );
                    m[..2].copy_from_slice(&r);
                    2
                }
                (3.., true) => {
                    let r = scores_block_vl(
                        [q[0], q[1], q[2]],
                        k,
                        (j0, len),
                        (out, stride),
                        key_scales,
                        scale,
                        [m[0], m[1], m[2]],
                    );
                    m[..3].copy_from_slice(&r);
                    3
                }
            }
        };
        i += taken;
    }
}

/// [`scores_block`] for three queries and eight keys, compiled for AVX-512 VL's 32 registers
/// (24 sums, three queries and a key in flight).
///
/// # Safety
/// As [`scores_block`]'s, with AVX-512 F and VL available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
unsafe fn scores_block_vl(
    qs: [&[f32]; 3],
    k: &[f32],
    keys: (usize, usize),
    out: (&mut [f32], usize),
    key_scales: Option<&[f32]>,
    scale: f32,
    max: [f32; 3],
) -> [f32; 3] {
    // SAFETY: the caller's contract.
    unsafe { scores_block::<3, 8>(qs, k, keys, out, key_scales, scale, max) }
}

/// `out[i] = q · k_i` (unscaled) for every `i`, `k_i = k[(j0 + i) * hs..][..hs]`, in the
/// reference's order: eight keys at a time (eight independent chains keep both FMA ports
/// busy), then four, then one.
///
/// # Safety
/// AVX2 and FMA must be available, `q.len() == hs`, `hs % 8 == 0` and
/// `k.len() >= (j0 + out.len()) * hs`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn dots(q: &[f32], k: &[f32], j0: usize, out: &mut [f32]) {
    let hs = q.len();
    assert!(
        hs.is_multiple_of(8) && k.len() >= (j0 + out.len()) * hs,
        "dots arguments were checked by the caller"
    );
    let row = |j: usize| k.as_ptr().wrapping_add((j0 + j) * hs);
    let mut j = 0;
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
                            *a = _mm256_fmadd_ps(qv, _mm256_loadu_ps(row(j + i).add(c)), *a);
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
                acc = _mm256_fmadd_ps(qv, _mm256_loadu_ps(row(j).add(c)), acc);
            }
        }
        *o = hsum(acc);
    }
}

/// `acc[d] = fma(p, v[d], acc[d])` for every `d` (`hs % 8 == 0`), eight lanes at a time.
///
/// # Safety
/// AVX2 and FMA must be available and `acc.len() == v.len()`, a multiple of 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn weighted_add(acc: &mut [f32], p: f32, v: &[f32]) {
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
            _mm256_storeu_ps(acc.as_mut_ptr().add(d), _mm256_fmadd_ps(pv, x, a));
        }
    }
}

/// `acc[d] = fma(ps[j], v[(j0 + j) * hs + d], acc[d])` for every `j` ascending and every `d`
/// below 64: 64 columns of a head of `hs` values (the caller offsets `acc` and `v` to the
/// columns' start); the eight accumulator vectors stay in registers across the keys (each
/// element sees the same operations in the same order as [`weighted_add`] per key).
///
/// # Safety
/// AVX2 and FMA must be available, `acc.len() >= 64`, `hs >= 64` and
/// `v.len() >= (j0 + ps.len() - 1) * hs + 64` when `ps` is not empty.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn weighted_sum64(acc: &mut [f32], ps: &[f32], v: &[f32], hs: usize, j0: usize) {
    assert!(
        acc.len() >= 64 && hs >= 64 && (ps.is_empty() || v.len() >= (j0 + ps.len() - 1) * hs + 64),
        "weighted_sum64 arguments were checked by the caller"
    );
    // SAFETY: `acc` holds 64 f32 (asserted above).
    let mut a: [__m256; 8] =
        std::array::from_fn(|i| unsafe { _mm256_loadu_ps(acc.as_ptr().add(8 * i)) });
    for (j, &p) in ps.iter().enumerate() {
        let pv = _mm256_set1_ps(p);
        let row = v.as_ptr().wrapping_add((j0 + j) * hs);
        for (i, a) in a.iter_mut().enumerate() {
            // SAFETY: the row's 64 columns lie inside `v` (asserted above).
            let x = unsafe { _mm256_loadu_ps(row.add(8 * i)) };
            *a = _mm256_fmadd_ps(pv, x, *a);
        }
    }
    for (i, a) in a.iter().enumerate() {
        // SAFETY: as for the loads.
        unsafe { _mm256_storeu_ps(acc.as_mut_ptr().add(8 * i), *a) };
    }
}

/// `dst[i] = src[i]` as f32 (exact) for every `i`.
///
/// # Safety
/// AVX2 and F16C must be available ([`supported`]) and `dst.len() == src.len()`, a multiple
/// of 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn widen<C: CacheElem>(src: &[C], dst: &mut [std::mem::MaybeUninit<f32>]) {
    assert!(
        src.len() == dst.len() && src.len().is_multiple_of(8),
        "widen arguments were checked by the caller"
    );
    for i in (0..src.len()).step_by(8) {
        // SAFETY: `i + 8 <= len` for both slices (asserted above); AVX2 and F16C are the
        // caller's contract.
        unsafe {
            let p = src.as_ptr().add(i);
            let x = match C::KIND {
                CacheKind::F32 => _mm256_loadu_ps(p.cast()),
                CacheKind::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
                CacheKind::BF16 => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(
                    _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast())),
                )),
                CacheKind::I8 => {
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast())))
                }
            };
            _mm256_storeu_ps(dst.as_mut_ptr().add(i).cast(), x);
        }
    }
}

/// `xs[i] = (xs[i] * key_scales[i]) * scale` (without `key_scales`, `xs[i] * scale`) for
/// every `i`, returning the largest result and `max` (NaN skipped, as `f32::max` does).
///
/// # Safety
/// AVX2 must be available; `key_scales`, when given, at least as long as `xs`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn scale_max(xs: &mut [f32], key_scales: Option<&[f32]>, scale: f32, max: f32) -> f32 {
    assert!(
        key_scales.is_none_or(|s| s.len() >= xs.len()),
        "scale_max arguments were checked by the caller"
    );
    let whole = xs.len() / 8 * 8;
    let sv = _mm256_set1_ps(scale);
    // `max_ps(x, m)` returns `m` when `x` is NaN: NaN never enters the maximum.
    let mut mv = _mm256_set1_ps(max);
    for i in (0..whole).step_by(8) {
        // SAFETY: `i + 8 <= xs.len()` (and the scales' length, asserted above).
        unsafe {
            let p = xs.as_mut_ptr().add(i);
            let mut x = _mm256_loadu_ps(p);
            if let Some(s) = key_scales {
                x = _mm256_mul_ps(x, _mm256_loadu_ps(s.as_ptr().add(i)));
            }
            x = _mm256_mul_ps(x, sv);
            mv = _mm256_max_ps(x, mv);
            _mm256_storeu_ps(p, x);
        }
    }
    // No lane holds NaN, so the lanes' maximum is the same in any order.
    let m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps::<1>(mv));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let mut max = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<0b01>(m2, m2)));
    for (i, x) in xs.iter_mut().enumerate().skip(whole) {
        let dot = key_scales.map_or(*x, |s| *x * s[i]);
        *x = dot * scale;
        max = max.max(*x);
    }
    max
}

/// `es[i] = (es[i] / sum) * value_scales[i]` (without `value_scales`, `es[i] / sum`) for
/// every `i`: the softmax weights.
///
/// # Safety
/// AVX2 must be available; `value_scales`, when given, at least as long as `es`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn normalize(es: &mut [f32], sum: f32, value_scales: Option<&[f32]>) {
    assert!(
        value_scales.is_none_or(|s| s.len() >= es.len()),
        "normalize arguments were checked by the caller"
    );
    let whole = es.len() / 8 * 8;
    let sv = _mm256_set1_ps(sum);
    for i in (0..whole).step_by(8) {
        // SAFETY: `i + 8 <= es.len()` (and the scales' length, asserted above).
        unsafe {
            let p = es.as_mut_ptr().add(i);
            let mut e = _mm256_div_ps(_mm256_loadu_ps(p), sv);
            if let Some(s) = value_scales {
                e = _mm256_mul_ps(e, _mm256_loadu_ps(s.as_ptr().add(i)));
            }
            _mm256_storeu_ps(p, e);
        }
    }
    for (i, e) in es.iter_mut().enumerate().skip(whole) {
        *e /= sum;
        if let Some(s) = value_scales {
            *e *= s[i];
        }
    }
}
