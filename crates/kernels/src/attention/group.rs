//! The arithmetic of attention rows, shared by the contiguous ([`super::gqa`]) and paged
//! ([`super::paged`]) kernels: a group of query heads that share a KV head, over their keys in
//! position order. The scalar reference, and the f32 rows of [`super::avx2`] and
//! [`super::avx512`] where [`crate::cpu`] allows them, which give its bits.
//!
//! Per row: `x_j = scale * (q · k_j)`, then `softcap * tanh(x_j / softcap)` when softcap is
//! set, then a two-pass softmax (max, then `exp(x_j - max)` and their sum as
//! [`super::exp`] computes them, each divided by the sum), then `Σ_j p_j v_j`.
//!
//! The reduction contract (DESIGN.md §6): a row's result depends only on its query vector
//! and the cache, never on how many query rows share the call or on the thread count. Every
//! sum runs in f32 in a fixed order: a dot product over `head_size` in eight lanes (lane `l`
//! takes the `d` with `d % 8 == l`, ascending, by fused multiply-add), summed as
//! `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))` (what one 8-wide vector and its
//! horizontal sum do); the softmax denominator as `exp_shifted_sum` sums; the weighted sum of
//! V over absolute key position ascending, one position at a time, by fused multiply-add. A
//! blocked version must keep this walk in fixed absolute-position tiles.
//!
//! Math runs in f32 for f32, f16 and bf16 elements (halves widen exactly and round once per
//! output element). The cache may hold another element than the queries ([`super::kv`]):
//! it is read as its exact f32 value, and an int8 cache's scales multiply a key's dot product
//! after its sum and a value's weight `p_j` before the weighted sum.

use super::avx2;
#[cfg(target_arch = "x86_64")]
use super::avx512;
use super::exp::{exp_shifted_sum, lane_tree};
use super::kv::{CacheElem, Cached};
use super::shape::ScoreMod;
use crate::ThreadPool;
use crate::acc::Accum;
#[cfg(target_arch = "x86_64")]
use crate::cpu;
use crate::par::parts_for;

/// Query heads a part computes together: a KV head's `heads / kv_heads`, at most
/// [`MAX_GROUP`] (what the scratch is sized for).
pub(crate) fn group_len(heads: usize, kv_heads: usize) -> usize {
    (heads / kv_heads.max(1)).clamp(1, MAX_GROUP)
}

/// Query heads that share a KV head and are computed together (see [`attend_group_pieces`]).
pub(crate) const MAX_GROUP: usize = 4;

/// Parts `heads` query heads are split into: one per thread when the work is worth it, each
/// a contiguous run of heads, so that heads sharing a KV head mostly share a part.
pub(crate) fn head_parts(pool: &ThreadPool, heads: usize, work: usize) -> usize {
    if parts_for(pool, heads, work) == 1 {
        1
    } else {
        pool.threads().min(heads)
    }
}

/// The heads `heads` of one part cut into runs that share a KV head (`group` query heads per
/// KV head), at most [`MAX_GROUP`] long: `(first head, count)`.
pub(crate) fn kv_runs(
    heads: std::ops::Range<usize>,
    group: usize,
) -> impl Iterator<Item = (usize, usize)> {
    let mut h = heads.start;
    std::iter::from_fn(move || {
        if h >= heads.end {
            return None;
        }
        let group_end = (h / group + 1) * group;
        let count = (group_end.min(heads.end) - h).min(MAX_GROUP);
        let run = (h, count);
        h += count;
        Some(run)
    })
}

/// Query rows `qs` (heads sharing one KV head; at most [`MAX_GROUP`]) over the same keys,
/// given in position order as pieces `(k, v, rows)`: rows `rows` of the cached keys `k` and
/// values `v` (a tile of a contiguous cache, or a block of a paged one). Each head's
/// arithmetic is the module doc's, whatever the pieces and however many heads share the call;
/// the heads take each piece in turn while it is in cache. `scores` holds `qs.len()` rows of
/// one score per key, `acc` `qs.len()` rows of `head_size`; `outs[i]` receives head `i`'s row.
///
/// With `prefetch` (pieces scattered in memory, where the hardware prefetcher loses the
/// stream at each piece), each piece's successor is fetched while the piece computes: the
/// keys' pieces, then the values'.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_group_pieces<'a, T: Accum<Acc = f32>, C: CacheElem>(
    qs: &[&[T]],
    pieces: impl Iterator<Item = (Cached<'a, C>, Cached<'a, C>, std::ops::Range<usize>)> + Clone,
    score: &ScoreMod,
    scores: &mut [f32],
    acc: &mut [f32],
    outs: &mut [&mut [T]],
    simd: bool,
    prefetch: bool,
) {
    let (g, hs) = (qs.len(), qs.first().map_or(0, |q| q.len()));
    assert!(
        g <= MAX_GROUP && outs.len() == g,
        "a group of at most {MAX_GROUP} heads, one output each"
    );
    let n: usize = pieces.clone().map(|p| p.2.len()).sum();
    if n == 0 {
        for out in outs {
            out.fill(T::ZERO);
        }
        return;
    }
    let simd = simd && avx2::supported(hs);
    let mut max = [f32::NEG_INFINITY; MAX_GROUP];
    let mut at = 0;
    // What to fetch while each piece's keys, then values, compute.
    let rows = |x: Cached<'a, C>, keys: &std::ops::Range<usize>| x.rows(keys.clone(), hs).values;
    let mut ahead = pieces
        .clone()
        .skip(1)
        .map(|(k, _, keys)| rows(k, &keys))
        .chain(pieces.clone().map(|(_, v, keys)| rows(v, &keys)))
        .filter(|_| prefetch);
    for (k, _, keys) in pieces.clone() {
        let len = keys.len();
        fetch(ahead.next());
        for (h, q) in qs.iter().enumerate() {
            let xs = &mut scores[h * n + at..][..len];
            let mut fast = false;
            #[cfg(target_arch = "x86_64")]
            if let Some(q32) = as_f32(q).filter(|_| simd) {
                // SAFETY: `supported` checked AVX2, FMA and F16C and hs % 8; the keys lie in
                // `k`.
                unsafe { avx2::dots(q32, k.values, keys.start, xs) };
                fast = true;
            }
            for (x, j) in xs.iter_mut().zip(keys.clone()) {
                let mut dot = if fast {
                    *x
                } else {
                    dot8(q, &k.values[j * hs..][..hs])
                };
                if C::SCALED {
                    dot *= k.scale(j);
                }
                let mut s = dot * score.scale;
                if score.softcap > 0.0 {
                    s = score.softcap * (s / score.softcap).tanh();
                }
                *x = s;
                max[h] = max[h].max(s);
            }
        }
        at += len;
    }
    let mut sum = [0f32; MAX_GROUP];
    for (h, sum) in sum[..g].iter_mut().enumerate() {
        *sum = exp_shifted_sum(&mut scores[h * n..][..n], max[h]);
    }
    acc[..g * hs].fill(0.0);
    let mut at = 0;
    for (_, v, keys) in pieces {
        let len = keys.len();
        fetch(ahead.next());
        // Each weight: the softmax's `p_j`, times the value's scale.
        for (h, &sum) in sum[..g].iter().enumerate() {
            for (e, j) in scores[h * n + at..][..len].iter_mut().zip(keys.clone()) {
                *e /= sum;
                if C::SCALED {
                    *e *= v.scale(j);
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if simd && hs == 64 {
            // SAFETY: `supported` checked AVX2, FMA and F16C; `acc` holds g rows of 64,
            // `scores` g rows of n from `at`, and every value row of the keys 64 values.
            unsafe {
                weighted_sum64_group(acc, &scores[at..], n, len, g, v.values, keys.start);
            }
            at += len;
            continue;
        }
        for h in 0..g {
            let es = &scores[h * n + at..][..len];
            let acc = &mut acc[h * hs..][..hs];
            #[cfg(target_arch = "x86_64")]
            if simd {
                // SAFETY: `supported` checked AVX2, FMA and F16C; `acc` and every value row of
                // the keys hold hs values.
                unsafe {
                    for (&p, j) in es.iter().zip(keys.clone()) {
                        avx2::weighted_add(acc, p, &v.values[j * hs..][..hs]);
                    }
                }
                continue;
            }
            for (&p, j) in es.iter().zip(keys.clone()) {
                let vj = &v.values[j * hs..][..hs];
                for d in 0..hs {
                    acc[d] = p.mul_add(vj[d].to_f32(), acc[d]);
                }
            }
        }
        at += len;
    }
    for (h, out) in outs.iter_mut().enumerate() {
        for (o, &a) in out.iter_mut().zip(&acc[h * hs..][..hs]) {
            *o = T::narrow(a);
        }
    }
}

/// Asks the CPU to bring `values` into L1.
fn fetch<T>(values: Option<&[T]>) {
    if let Some(values) = values {
        crate::mem::prefetch_lines(values.as_ptr().cast(), std::mem::size_of_val(values));
    }
}

/// `q · k` in the module doc's order: eight lanes by fused multiply-add, then a fixed tree.
pub(crate) fn dot8<T: Accum<Acc = f32>, C: CacheElem>(q: &[T], k: &[C]) -> f32 {
    let mut lanes = [0f32; 8];
    for (d, (a, b)) in q.iter().zip(k).enumerate() {
        lanes[d % 8] = a.widen().mul_add(b.to_f32(), lanes[d % 8]);
    }
    lane_tree(lanes)
}

/// `values` as f32, when `T` is f32 (the AVX2 paths take f32 queries).
fn as_f32<T: 'static>(values: &[T]) -> Option<&[f32]> {
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()).then(|| {
        // SAFETY: `T` is `f32`, so the slice is already a `[f32]`.
        unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<f32>(), values.len()) }
    })
}

/// [`avx2::weighted_sum64`] for the `g` heads of a group (`1 <= g <= 4`): head `h`'s weights are
/// `ps[h * stride..][..len]` and its accumulator `acc[h * 64..][..64]`. Where the CPU has
/// AVX-512, every value row is loaded once for all the heads and each head's sums are four
/// 512-bit accumulators (4·g independent chains); else head by head in AVX2. Each element
/// sees the same operations in the same order as for its head alone.
///
/// # Safety
/// AVX2, FMA and F16C must be available, `acc.len() >= 64 * g`, `ps.len() >= (g - 1) *
/// stride + len` and `v.len() >= (j0 + len) * 64`.
#[cfg(target_arch = "x86_64")]
unsafe fn weighted_sum64_group<C: CacheElem>(
    acc: &mut [f32],
    ps: &[f32],
    stride: usize,
    len: usize,
    g: usize,
    v: &[C],
    j0: usize,
) {
    assert!(
        (1..=4).contains(&g)
            && acc.len() >= 64 * g
            && ps.len() >= (g - 1) * stride + len
            && v.len() >= (j0 + len) * 64,
        "weighted_sum64_group arguments were checked by the caller"
    );
    // SAFETY: the bounds are asserted above; AVX-512 F is checked for the wide kernel (the
    // feature table is read once), AVX2 and FMA are the caller's contract.
    unsafe {
        if cpu::isa() >= cpu::Isa::Avx512 {
            match g {
                1 => avx512::group_avx512::<1, C>(acc, ps, stride, len, v, j0),
                2 => avx512::group_avx512::<2, C>(acc, ps, stride, len, v, j0),
                3 => avx512::group_avx512::<3, C>(acc, ps, stride, len, v, j0),
                _ => avx512::group_avx512::<4, C>(acc, ps, stride, len, v, j0),
            }
        } else {
            for (h, acc) in acc.chunks_exact_mut(64).take(g).enumerate() {
                avx2::weighted_sum64(acc, &ps[h * stride..][..len], v, j0);
            }
        }
    }
}
