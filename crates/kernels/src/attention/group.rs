//! The arithmetic of attention rows, shared by the contiguous ([`super::gqa`]) and paged
//! ([`super::paged`]) kernels: a group of query heads that share a KV head, over their keys in
//! position order. The scalar reference, and the f32 rows of [`super::avx2`] and
//! [`super::avx512`] where [`crate::cpu`] allows them, which give its bits.
//!
//! Per row: `x_j = scale * (q · k_j)`, then `softcap * tanh(x_j / softcap)` when softcap is
//! set, then a two-pass softmax (max, then `exp(x_j - max)` and their sum as
//! [`super::exp`] computes them, each divided by the sum), then `Σ_j p_j v_j`. A head with an
//! attention sink `s` takes `max(max, s)` as the max and adds `e^(s - max)` to the sum (after
//! the scores' own sum): a softmax over one more logit that has no value.
//!
//! The reduction contract (DESIGN.md §6): a row's result depends only on its query vector
//! and the cache, never on how many query rows share the call or on the thread count. Every
//! sum runs in f32 in a fixed order: a dot product over `head_size` in eight lanes (lane `l`
//! takes the `d` with `d % 8 == l`, ascending, by fused multiply-add), summed as
//! `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))` (what one 8-wide vector and its
//! horizontal sum do); the softmax denominator as `exp_shifted_sum` sums; the weighted sum of
//! V over absolute key position ascending, one position at a time, by fused multiply-add.
//! All of this runs per tile of [`KV_TILE`] absolute positions (tile `t` holds positions
//! `t * KV_TILE..(t + 1) * KV_TILE`): a row over keys of several tiles computes each tile's
//! softmax and weighted sum alone and folds them in position order ([`fold_tile`]), so the
//! tiles of one row may run on different threads; a row whose keys lie in one tile is that
//! tile's result.
//!
//! Math runs in f32 for f32, f16 and bf16 elements (halves widen exactly and round once per
//! output element). The cache may hold another element than the queries ([`super::kv`]):
//! it is read as its exact f32 value, and an int8 cache's scales multiply a key's dot product
//! after its sum and a value's weight `p_j` before the weighted sum.

use super::avx2;
#[cfg(target_arch = "x86_64")]
use super::avx512;
use std::mem::MaybeUninit;
use std::ops::Range;

use super::exp::{exp_shifted_sum, exp32_nonpositive, lane_tree};
use super::kv::{CacheElem, CacheKind, Cached};
use super::shape::ScoreMod;
use crate::ThreadPool;
use crate::acc::Accum;
#[cfg(target_arch = "x86_64")]
use crate::cpu;
use crate::num::as_f32;
use crate::par::parts_for;
use smallvec::SmallVec;

/// Query heads a part computes together: a KV head's `heads / kv_heads`, at most
/// [`MAX_GROUP`] (what the scratch is sized for).
pub(crate) fn group_len(heads: usize, kv_heads: usize) -> usize {
    (heads / kv_heads.max(1)).clamp(1, MAX_GROUP)
}

/// Query heads that share a KV head and are computed together (see [`attend_rows`]):
/// every group of the families oxgen runs (Qwen2.5-1.5B's 6, Qwen2.5-7B's 7, gpt-oss's 8), so
/// each part reads its KV head's keys and values once per row. A longer group is taken in runs
/// of this many heads, each reading them again.
pub(crate) const MAX_GROUP: usize = 8;

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

/// Query rows of one sequence that see the first keys of the same pieces: row `r`'s heads
/// `qs[r * g..(r + 1) * g]` (`g = qs.len() / keys.len()`, sharing one KV head, at most
/// [`MAX_GROUP`]) see the `keys[r]` keys from absolute position `first`. A prefill chunk's
/// consecutive rows so take each piece of keys and values together while it is in cache;
/// each row's arithmetic is what it gets alone (`keys: &[n]` with its own heads). A decode
/// step is one row.
pub(crate) struct RowKeys<'q, T> {
    pub qs: &'q [&'q [T]],
    pub keys: &'q [usize],
    pub first: usize,
    pub score: &'q ScoreMod<'q>,
    /// The sinks of a row's heads (`score.sinks` at those heads), when it has them.
    pub sinks: Option<&'q [f32]>,
}

/// Query rows a tile of [`attend_rows`] takes at most.
pub(crate) const MAX_TILE: usize = 4;

/// Key positions a row's attention takes as one tile, at multiples of this from position 0
/// (DESIGN.md §6): a row computes each tile's softmax and weighted sum of values alone (a
/// [`Partial`]) and folds them in position order, so a decode row's tiles may be computed
/// on several threads and folded after, with the bits of the same row computed whole. A row
/// whose keys lie in one tile (every row of a context up to this long) is that tile's
/// result, unfolded. Each tile costs a row a call's setup and a fold: at 256 positions a
/// 2048-token prefill measured 13% slower than untiled, at 1024 within the noise; a decode
/// step at 8192 positions still has 8 tiles per KV head to share among the threads.
pub(crate) const KV_TILE: usize = 1024;

/// The [`KV_TILE`] tiles of the absolute key positions `keys`, in order: each tile's part.
pub(crate) fn kv_tiles(keys: Range<usize>) -> impl Iterator<Item = Range<usize>> + Clone {
    let first = keys.start / KV_TILE;
    (first..keys.end.div_ceil(KV_TILE))
        .map(move |t| keys.start.max(t * KV_TILE)..keys.end.min((t + 1) * KV_TILE))
}

/// The f32 scratch [`attend_rows`] needs for `queries` query rows of `head_size`: their
/// scores over one tile, and two weighted sums of values each (a tile's, and the folded
/// ones).
pub(crate) fn row_scratch_len(queries: usize, head_size: usize) -> usize {
    queries * (KV_TILE + 2 * head_size)
}

/// One query's softmax over the keys of a tile (or of the tiles folded so far): the shift of
/// its exponentials (the scores' max, or the sink's logit when larger, on the row's first
/// tile) and their sum (with the sink's term on the first tile). Its weighted sum of values
/// (each value times its exponential over `sum`) lies beside it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Partial {
    pub shift: f32,
    pub sum: f32,
}

/// Folds the next tile's `partial` and weighted sum `b` into a row's `state` and weighted
/// sum `a` (the first tile is taken as it is): both rescaled to the larger shift, each sum of
/// values weighted by its share of the new denominator, `a = wa * a + wb * b` element by
/// element, rounded after each operation (no fused multiply-add: any vector width or none
/// gives the same bits).
pub(crate) fn fold_tile(state: &mut Option<Partial>, a: &mut [f32], partial: Partial, b: &[f32]) {
    let Some(s) = state else {
        a.copy_from_slice(b);
        *state = Some(partial);
        return;
    };
    let shift = s.shift.max(partial.shift);
    let sa = s.sum * exp32_nonpositive(s.shift - shift);
    let sb = partial.sum * exp32_nonpositive(partial.shift - shift);
    let sum = sa + sb;
    let (wa, wb) = (sa / sum, sb / sum);
    for (x, &y) in a.iter_mut().zip(b) {
        *x = wa * *x + wb * y;
    }
    *s = Partial { shift, sum };
}

/// Attention of query rows ([`RowKeys`]) over the keys whose pieces `pieces(range)` gives for
/// any range of them in position order as `(k, v, rows)`: rows `rows` of the cached keys `k`
/// and values `v` (a stretch of a contiguous cache, or a block of a paged one), tile by tile
/// ([`KV_TILE`]). Each head's arithmetic is the module doc's, whatever the pieces and however
/// many heads share the call; the heads take each piece in turn while it is in cache.
/// `scratch` holds [`row_scratch_len`]`(qs.len(), head_size)`; `outs[i]` receives `qs[i]`'s
/// row.
///
/// With `prefetch` (pieces scattered in memory, where the hardware prefetcher loses the
/// stream at each piece), each piece's successor is fetched while the piece computes: the
/// keys' pieces, then the values'.
pub(crate) fn attend_rows<'a, T: Accum<Acc = f32>, C: CacheElem, I>(
    rows: &RowKeys<'_, T>,
    pieces: impl Fn(Range<usize>) -> I,
    scratch: &mut [f32],
    outs: &mut [&mut [T]],
    simd: bool,
    prefetch: bool,
) where
    I: Iterator<Item = Piece<'a, C>> + Clone,
{
    let (qs, tile) = (rows.qs, rows.keys.len());
    let hs = qs.first().map_or(0, |q| q.len());
    assert!(
        (1..=MAX_TILE).contains(&tile)
            && qs.len().is_multiple_of(tile)
            && qs.len() / tile <= MAX_GROUP
            && outs.len() == qs.len()
            && scratch.len() >= row_scratch_len(qs.len(), hs),
        "at most {MAX_TILE} rows of at most {MAX_GROUP} heads, one output each, and scratch"
    );
    let (scores, rest) = scratch.split_at_mut(qs.len() * KV_TILE);
    let (acc, folded) = rest.split_at_mut(qs.len() * hs);
    let all = rows.first..rows.first + rows.stride();
    let single = kv_tiles(all.clone()).nth(1).is_none();
    let mut states = [None; MAX_TILE * MAX_GROUP];
    for keys in kv_tiles(all) {
        let seen: SmallVec<[usize; MAX_TILE]> = (rows.keys.iter())
            .map(|&n| (rows.first + n).min(keys.end).saturating_sub(keys.start))
            .collect();
        let tile_rows = RowKeys {
            keys: &seen,
            first: keys.start,
            sinks: rows.sinks.filter(|_| keys.start == rows.first),
            ..*rows
        };
        let partials = tile_rows.partials(pieces(keys), scores, acc, simd, prefetch);
        if single {
            break;
        }
        for (i, (state, partial)) in states.iter_mut().zip(partials).enumerate() {
            if i < qs.len() && seen[i / rows.heads()] > 0 {
                let b = &acc[i * hs..][..hs];
                fold_tile(state, &mut folded[i * hs..][..hs], partial, b);
            }
        }
    }
    let result = if single { &*acc } else { &*folded };
    for (i, out) in outs.iter_mut().enumerate() {
        if rows.keys[i / rows.heads()] == 0 {
            out.fill(T::ZERO);
            continue;
        }
        for (o, &a) in out.iter_mut().zip(&result[i * hs..][..hs]) {
            *o = T::narrow(a);
        }
    }
}

/// Rows `rows` of cached keys and values, in position order.
pub(crate) type Piece<'a, C> = (Cached<'a, C>, Cached<'a, C>, Range<usize>);

/// The longest head a vector row widens its queries for (on the stack).
const MAX_HEAD_SIZE: usize = super::paged::MAX_HEAD_SIZE;

/// Cache values a vector row widens to f32 at a time (16 KiB): a piece of a cache that is not
/// f32 is taken in runs of `WIDE / head_size` rows.
const WIDE: usize = 4096;

impl<T: Accum<Acc = f32>> RowKeys<'_, T> {
    /// Each query's [`Partial`] over the keys of `pieces` (at most [`KV_TILE`] a row), its
    /// weighted sum of values in `acc` (`qs.len()` rows of `head_size`); `scores` holds
    /// `qs.len()` rows of the most keys a row sees. A query that sees no keys gets nothing
    /// meaningful.
    pub(crate) fn partials<'a, C: CacheElem>(
        &self,
        pieces: impl Iterator<Item = Piece<'a, C>> + Clone,
        scores: &mut [f32],
        acc: &mut [f32],
        simd: bool,
        prefetch: bool,
    ) -> [Partial; MAX_TILE * MAX_GROUP] {
        let hs = self.qs[0].len();
        #[cfg(target_arch = "x86_64")]
        if simd && avx2::supported(hs) && hs <= MAX_HEAD_SIZE {
            // SAFETY: `supported` checked AVX2, FMA and F16C and hs % 8.
            return unsafe { self.vector(pieces, scores, acc, prefetch) };
        }
        let _ = simd;
        self.reference(pieces, scores, acc, prefetch)
    }

    /// Heads per row.
    fn heads(&self) -> usize {
        self.qs.len() / self.keys.len()
    }

    /// The most keys a row sees: the stride of `scores`.
    fn stride(&self) -> usize {
        self.keys.iter().copied().max().unwrap_or(0)
    }

    /// The keys query `i` sees of a piece of `len` keys starting `at` keys in.
    fn seen(&self, i: usize, at: usize, len: usize) -> usize {
        len.min(self.keys[i / self.heads()].saturating_sub(at))
    }

    /// The scalar reference: `acc[i]` is query `i`'s weighted sum of values.
    fn reference<'a, C: CacheElem>(
        &self,
        pieces: impl Iterator<Item = Piece<'a, C>> + Clone,
        scores: &mut [f32],
        acc: &mut [f32],
        prefetch: bool,
    ) -> [Partial; MAX_TILE * MAX_GROUP] {
        let (queries, n, hs) = (self.qs.len(), self.stride(), self.qs[0].len());
        let mut max = [f32::NEG_INFINITY; MAX_TILE * MAX_GROUP];
        let mut ahead = fetcher(pieces.clone(), hs, prefetch);
        let mut at = 0;
        for (k, _, keys) in pieces.clone() {
            ahead.next();
            for (i, q) in self.qs.iter().enumerate() {
                let keys = keys.start..keys.start + self.seen(i, at, keys.len());
                let xs = &mut scores[i * n + at..][..keys.len()];
                for (x, j) in xs.iter_mut().zip(keys.clone()) {
                    let dot = dot8(q, &k.values[j * hs..][..hs]);
                    let dot = if C::SCALED { dot * k.scale(j) } else { dot };
                    *x = dot * self.score.scale;
                }
                if self.score.softcap > 0.0 {
                    softcap_scores(xs, self.score.softcap, &mut max[i]);
                } else {
                    max[i] = xs.iter().fold(max[i], |m, &x| m.max(x));
                }
            }
            at += keys.len();
        }
        let partials = self.exp_sums(scores, &max);
        acc[..queries * hs].fill(0.0);
        let mut at = 0;
        for (_, v, keys) in pieces {
            ahead.next();
            for i in 0..queries {
                let keys = keys.start..keys.start + self.seen(i, at, keys.len());
                let es = &mut scores[i * n + at..][..keys.len()];
                for (e, j) in es.iter_mut().zip(keys.clone()) {
                    *e /= partials[i].sum;
                    if C::SCALED {
                        *e *= v.scale(j);
                    }
                }
                let acc = &mut acc[i * hs..][..hs];
                for (&p, j) in es.iter().zip(keys.clone()) {
                    let vj = &v.values[j * hs..][..hs];
                    for d in 0..hs {
                        acc[d] = p.mul_add(vj[d].to_f32(), acc[d]);
                    }
                }
            }
            at += keys.len();
        }
        partials
    }

    /// [`RowKeys::reference`] on AVX2 (and AVX-512 for the value sums): the same bits. Queries
    /// and cache pieces that are not f32 are widened first (exactly), so every product runs
    /// on f32 vectors, and a piece is widened once for all the heads of the group.
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available, the head size a multiple of 8 and at most
    /// [`MAX_HEAD_SIZE`].
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn vector<'a, C: CacheElem>(
        &self,
        pieces: impl Iterator<Item = Piece<'a, C>> + Clone,
        scores: &mut [f32],
        acc: &mut [f32],
        prefetch: bool,
    ) -> [Partial; MAX_TILE * MAX_GROUP] {
        let (queries, g, n, hs) = (self.qs.len(), self.heads(), self.stride(), self.qs[0].len());
        // Uninitialized until written: nothing to clear on the f32 path, which needs neither.
        let mut q_wide = [MaybeUninit::<f32>::uninit(); MAX_TILE * MAX_GROUP * MAX_HEAD_SIZE];
        let q32: SmallVec<[&[f32]; MAX_TILE * MAX_GROUP]> =
            (self.qs.iter().zip(q_wide.chunks_exact_mut(hs)))
                .map(|(q, wide)| {
                    as_f32(q).unwrap_or_else(|| {
                        for (w, x) in wide.iter_mut().zip(q.iter()) {
                            w.write(x.widen());
                        }
                        // SAFETY: every element was written above.
                        unsafe { std::slice::from_raw_parts(wide.as_ptr().cast(), hs) }
                    })
                })
                .collect();
        let mut buffers = Runs {
            hs,
            values: [MaybeUninit::uninit(); WIDE],
            scales: [MaybeUninit::uninit(); WIDE / 8],
            ahead: fetcher(pieces.clone(), hs, prefetch),
        };
        let mut max = [f32::NEG_INFINITY; MAX_TILE * MAX_GROUP];
        let mut at = 0;
        let keys = pieces.clone().map(|(k, _, keys)| (k, keys));
        let score_run = |k32: &[f32], j0: usize, scales: Option<&[f32]>, len: usize| {
            let softcap = self.score.softcap;
            // A row's heads see the same keys: they take each key row together.
            for r in 0..self.keys.len() {
                let (heads, seen) = (r * g..(r + 1) * g, self.seen(r * g, at, len));
                if seen == 0 {
                    continue;
                }
                let mut top = [0f32; MAX_GROUP];
                top[..g].copy_from_slice(&max[heads.clone()]);
                // SAFETY: the caller's contract; the keys' rows lie in `k32` from `j0`, the
                // scales cover them, and `scores` holds the heads' rows of `n` from `at`.
                unsafe {
                    avx2::scores_heads(
                        &q32[heads.clone()],
                        k32,
                        (j0, seen),
                        (&mut scores[heads.start * n + at..], n),
                        scales.map(|s| &s[..seen]),
                        self.score.scale,
                        &mut top[..g],
                    )
                };
                for (i, top) in heads.zip(top) {
                    if softcap > 0.0 {
                        softcap_scores(&mut scores[i * n + at..][..seen], softcap, &mut max[i]);
                    } else {
                        max[i] = top;
                    }
                }
            }
            at += len;
        };
        // SAFETY: the caller's contract (AVX2, F16C, hs % 8 and at most MAX_HEAD_SIZE).
        unsafe { buffers.each(keys, score_run) };
        let partials = self.exp_sums(scores, &max);
        acc[..queries * hs].fill(0.0);
        let mut at = 0;
        let values = pieces.map(|(_, v, keys)| (v, keys));
        let sum_run = |v32: &[f32], j0: usize, scales: Option<&[f32]>, len: usize| {
            for (i, partial) in partials[..queries].iter().enumerate() {
                let seen = self.seen(i, at, len);
                let es = &mut scores[i * n + at..][..seen];
                // SAFETY: the caller's contract; the scales cover the keys.
                unsafe { avx2::normalize(es, partial.sum, scales.map(|s| &s[..seen])) };
            }
            for r in 0..self.keys.len() {
                let (first, seen) = (r * g, self.seen(r * g, at, len));
                if seen == 0 {
                    continue;
                }
                if hs.is_multiple_of(64) {
                    // Head by head of 64 columns: each value row's slice is loaded once for
                    // the group's heads, their sums kept in registers across the keys.
                    for c in (0..hs).step_by(64) {
                        // SAFETY: the caller's contract; `acc` holds the row's g heads of hs
                        // from `first`, `scores` their g rows of n, and the keys' value rows
                        // lie in `v32` from `j0`.
                        unsafe {
                            weighted_sum64_group(
                                &mut acc[first * hs + c..],
                                g,
                                (&scores[first * n + at..], n, seen),
                                (&v32[c..], hs, j0),
                            )
                        };
                    }
                    continue;
                }
                for i in first..first + g {
                    let acc = &mut acc[i * hs..][..hs];
                    for (j, &p) in scores[i * n + at..][..seen].iter().enumerate() {
                        // SAFETY: the caller's contract; both rows hold hs values.
                        unsafe { avx2::weighted_add(acc, p, &v32[(j0 + j) * hs..][..hs]) };
                    }
                }
            }
            at += len;
        };
        // SAFETY: as for the keys.
        unsafe { buffers.each(values, sum_run) };
        partials
    }

    /// Each query's softmax numerators in place, and their shift and sum.
    fn exp_sums(
        &self,
        scores: &mut [f32],
        max: &[f32; MAX_TILE * MAX_GROUP],
    ) -> [Partial; MAX_TILE * MAX_GROUP] {
        let n = self.stride();
        let mut partials = [Partial {
            shift: f32::NEG_INFINITY,
            sum: 0.0,
        }; MAX_TILE * MAX_GROUP];
        for (i, partial) in partials[..self.qs.len()].iter_mut().enumerate() {
            let seen = self.keys[i / self.heads()];
            let sink = self.sinks.map(|s| s[i % self.heads()]);
            // A sink joins the max and the denominator, after the scores' own sum.
            let shift = sink.map_or(max[i], |s| max[i].max(s));
            let mut sum = exp_shifted_sum(&mut scores[i * n..][..seen], shift);
            if let Some(s) = sink {
                sum += exp32_nonpositive(s - shift);
            }
            *partial = Partial { shift, sum };
        }
        partials
    }
}

/// The scales of rows `keys` of `x`, when its element has them.
fn key_scales<'a, C: CacheElem>(x: &Cached<'a, C>, keys: &Range<usize>) -> Option<&'a [f32]> {
    C::SCALED.then(|| &x.scales[keys.clone()])
}

/// `softcap * tanh(x / softcap)` for every score, in place; `max` takes the largest result
/// (NaN skipped, as `f32::max` does).
fn softcap_scores(xs: &mut [f32], softcap: f32, max: &mut f32) {
    for x in xs.iter_mut() {
        *x = softcap * (*x / softcap).tanh();
        *max = max.max(*x);
    }
}

/// The vector rows' buffers: cache values widened to f32 and their scales gathered, for
/// [`Runs::each`], and what to prefetch.
#[cfg(target_arch = "x86_64")]
struct Runs<I> {
    hs: usize,
    values: [MaybeUninit<f32>; WIDE],
    scales: [MaybeUninit<f32>; WIDE / 8],
    ahead: Fetcher<I>,
}

#[cfg(target_arch = "x86_64")]
impl<'a, C: CacheElem + 'a, I: Iterator<Item = &'a [C]>> Runs<I> {
    /// Calls `f(rows, j0, scales, len)` over `pieces` (cached rows and which of them) in
    /// order, on `len` rows at a time of f32 values from row `j0` of `rows`, and their scales
    /// (`None` unscaled). An f32 cache goes piece by piece, in place; another is widened into
    /// runs of as many pieces as [`WIDE`] holds (a paged cache's blocks lie apart: gathered,
    /// a run takes a few calls instead of one per block), its scales gathered beside them.
    /// The [`Fetcher`] is told as each piece is taken.
    ///
    /// # Safety
    /// AVX2 and F16C must be available, `hs` a multiple of 8 and at most [`MAX_HEAD_SIZE`].
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn each(
        &mut self,
        pieces: impl Iterator<Item = (Cached<'a, C>, Range<usize>)>,
        mut f: impl FnMut(&[f32], usize, Option<&[f32]>, usize),
    ) {
        let hs = self.hs;
        if C::KIND == CacheKind::F32 {
            for (x, rows) in pieces {
                self.ahead.next();
                let values = as_f32(x.values).expect("an f32 cache");
                f(values, rows.start, key_scales(&x, &rows), rows.len());
            }
            return;
        }
        let cap = WIDE / hs;
        let mut filled = 0;
        for (x, rows) in pieces {
            self.ahead.next();
            let mut from = rows.start;
            while from < rows.end {
                let take = (rows.end - from).min(cap - filled);
                let src = &x.values[from * hs..(from + take) * hs];
                // SAFETY: the caller's contract; `take` rows fit after `filled`.
                unsafe { avx2::widen(src, &mut self.values[filled * hs..][..src.len()]) };
                if C::SCALED {
                    for (d, &s) in self.scales[filled..]
                        .iter_mut()
                        .zip(&x.scales[from..from + take])
                    {
                        d.write(s);
                    }
                }
                filled += take;
                from += take;
                if filled == cap {
                    self.flush(filled, &mut f);
                    filled = 0;
                }
            }
        }
        if filled > 0 {
            self.flush(filled, &mut f);
        }
    }

    /// `f` over the first `rows` rows widened.
    fn flush(&self, rows: usize, f: &mut impl FnMut(&[f32], usize, Option<&[f32]>, usize)) {
        // SAFETY: `each` wrote the first `rows` rows of values (and of scales when scaled).
        let values =
            unsafe { std::slice::from_raw_parts(self.values.as_ptr().cast(), rows * self.hs) };
        let scales = C::SCALED.then(|| unsafe {
            // SAFETY: as above.
            std::slice::from_raw_parts(self.scales.as_ptr().cast(), rows)
        });
        f(values, 0, scales, rows);
    }
}

/// Bytes of cache a [`Fetcher`] keeps requested ahead of the piece computing: enough for
/// DRAM's latency at one core's share of the bandwidth (about 100 ns at 20-40 GB/s), where
/// one piece (a block of 16 positions of one KV head: 1 KiB of int8 at head size 64) is not.
const FETCH_AHEAD_BYTES: usize = 8192;

/// Prefetches the pieces a row will take: the keys' pieces, then the values', about
/// [`FETCH_AHEAD_BYTES`] ahead of the one computing (nothing without `prefetch`).
struct Fetcher<I> {
    order: I,
    /// Pieces to request before the first one computes; 0 once they are.
    lead: usize,
}

impl<'a, C: 'a, I: Iterator<Item = &'a [C]>> Fetcher<I> {
    /// Call as each piece starts: requests what is now [`FETCH_AHEAD_BYTES`] ahead.
    fn next(&mut self) {
        for _ in 0..std::mem::take(&mut self.lead).max(1) {
            if let Some(values) = self.order.next() {
                crate::mem::prefetch_lines(values.as_ptr().cast(), std::mem::size_of_val(values));
            }
        }
    }
}

/// A [`Fetcher`] over `pieces` (keys then values, from the second key piece on).
fn fetcher<'a, C: CacheElem>(
    pieces: impl Iterator<Item = Piece<'a, C>> + Clone,
    hs: usize,
    prefetch: bool,
) -> Fetcher<impl Iterator<Item = &'a [C]>> {
    let rows = move |x: Cached<'a, C>, keys: Range<usize>| x.rows(keys, hs).values;
    let piece_bytes = pieces
        .clone()
        .next()
        .map_or(1, |(_, _, keys)| keys.len() * hs * std::mem::size_of::<C>());
    let order = pieces
        .clone()
        .skip(1)
        .map(move |(k, _, keys)| rows(k, keys))
        .chain(pieces.map(move |(_, v, keys)| rows(v, keys)))
        .filter(move |_| prefetch);
    Fetcher {
        order,
        lead: FETCH_AHEAD_BYTES.div_ceil(piece_bytes.max(1)),
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

/// [`avx2::weighted_sum64`] for the `g` heads of a group (`1 <= g <= MAX_GROUP`), on 64
/// columns of heads of `hs` values (the caller offsets `acc` and `v` to the columns' start):
/// head `h`'s weights are `ps[h * stride..][..len]` and its accumulator `acc[h * hs..][..64]`.
/// Where the CPU has AVX-512, every value row is loaded once for up to four heads (the
/// registers' worth: each head's sums are four 512-bit accumulators, 4·g independent chains;
/// a longer group takes the rows, still in cache, again for its next four); else head by
/// head in AVX2. Each element sees the same operations in the same order as for its head
/// alone.
///
/// # Safety
/// AVX2 and FMA must be available, `hs >= 64`, `acc.len() >= (g - 1) * hs + 64`,
/// `ps.len() >= (g - 1) * stride + len` and `v.len() >= (j0 + len - 1) * hs + 64`.
#[cfg(target_arch = "x86_64")]
unsafe fn weighted_sum64_group(
    acc: &mut [f32],
    g: usize,
    (ps, stride, len): (&[f32], usize, usize),
    (v, hs, j0): (&[f32], usize, usize),
) {
    assert!(
        (1..=MAX_GROUP).contains(&g)
            && hs >= 64
            && len > 0
            && acc.len() >= (g - 1) * hs + 64
            && ps.len() >= (g - 1) * stride + len
            && v.len() >= (j0 + len - 1) * hs + 64,
        "weighted_sum64_group arguments were checked by the caller"
    );
    // SAFETY: the bounds are asserted above; AVX-512 F is checked for the wide kernel (the
    // feature table is read once), AVX2 and FMA are the caller's contract.
    unsafe {
        if cpu::level() >= cpu::Level::Avx512 {
            for h0 in (0..g).step_by(4) {
                let (acc, ps) = (&mut acc[h0 * hs..], &ps[h0 * stride..]);
                match g - h0 {
                    1 => avx512::group_avx512::<1>(acc, hs, ps, stride, len, v, j0),
                    2 => avx512::group_avx512::<2>(acc, hs, ps, stride, len, v, j0),
                    3 => avx512::group_avx512::<3>(acc, hs, ps, stride, len, v, j0),
                    _ => avx512::group_avx512::<4>(acc, hs, ps, stride, len, v, j0),
                }
            }
        } else {
            for h in 0..g {
                let acc = &mut acc[h * hs..];
                avx2::weighted_sum64(acc, &ps[h * stride..][..len], v, hs, j0);
            }
        }
    }
}
