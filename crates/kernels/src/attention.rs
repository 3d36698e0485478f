//! Causal grouped-query attention over a KV cache: the scalar reference behind
//! com.microsoft::GroupQueryAttention.
//!
//! Layouts: queries are rows of head vectors (`(batch, seq)` rows of `heads * head_size`,
//! possibly inside a wider packed-QKV row, see [`Rows`]); the caches are
//! `(batch, kv_heads, capacity, head_size)` (BNSH); query head `n` reads KV head
//! `n / (heads / kv_heads)`. Query row `s` of batch entry `b` sits at absolute position
//! `p = start[b] + s` and attends to the keys at positions `lo..end` with
//! `end = min(p + 1, kv_len[b])` (causal, and never past the entry's valid length, which is
//! what onnxruntime does for the right-padded rows of a batched first prompt) and
//! `lo = p + 1 - window` when a local window is set (the query and the `window - 1` keys before
//! it, as onnxruntime 1.32 applies `local_window_size`), else 0. A row with no keys (window 0)
//! gets zeros, as in onnxruntime.
//!
//! Per row: `x_j = scale * (q · k_j)`, then `softcap * tanh(x_j / softcap)` when softcap is
//! set, then a two-pass softmax (max, then `exp(x_j - max)` and their sum as
//! [`crate::activation::exp_shifted_sum`] computes them, each divided by the sum), then
//! `Σ_j p_j v_j`.
//!
//! The reduction contract (DESIGN.md §6): a row's result depends only on its query vector
//! and the cache, never on how many query rows share the call or on the thread count. Every
//! sum runs in f32 in a fixed order: a dot product over `head_size` in eight lanes (lane `l`
//! takes the `d` with `d % 8 == l`, ascending, by fused multiply-add), summed as
//! `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))` (what one 8-wide vector and its
//! horizontal sum do); the softmax denominator as `exp_shifted_sum` sums; the weighted sum of
//! V over absolute key position ascending, one position at a time, by fused multiply-add. A
//! blocked version must keep this walk in fixed absolute-position tiles. Threads split
//! (batch, head) pairs, never a row, in contiguous runs, so the query heads that share a KV
//! head mostly run together and take each tile of keys and values in turn while it is in
//! cache (each head's arithmetic unchanged). So prefill of S tokens equals S single-token
//! decode steps bit for bit (tested below).
//!
//! Math runs in f32 for f32, f16 and bf16 elements (halves widen exactly and round once per
//! output element).
//!
//! References: onnxruntime `docs/ContribOperators.md` (GroupQueryAttention) and its CPU
//! kernel `contrib_ops/cpu/bert/gqa_attention_base.h`; Ainslie et al., "GQA"
//! (arXiv:2305.13245).

use crate::ThreadPool;
use crate::acc::Accum;
use crate::activation::{exp_shifted_sum, lane_tree};
use crate::attention_avx2 as avx2;
use crate::layout::{LayoutError, check_len};
use crate::par::{par_chunks2, parts_for};
use crate::rotary::{Positions, Rope, rotate_one};
use smallvec::SmallVec;

/// Sizes of one attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GqaShape {
    pub batch: usize,
    /// Query rows per batch entry (S).
    pub seq: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_size: usize,
    /// Positions the caches hold per (batch, kv head).
    pub capacity: usize,
}

impl GqaShape {
    fn check(&self) -> Result<(), LayoutError> {
        if self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(LayoutError::Shape(format!(
                "num_heads {} is not a multiple of kv_num_heads {}",
                self.heads, self.kv_heads
            )));
        }
        let dims = [
            self.batch,
            self.seq,
            self.heads.max(self.kv_heads),
            self.head_size,
            self.capacity,
        ];
        dims.iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d.max(1)))
            .map(|_| ())
            .ok_or_else(|| LayoutError::Shape(format!("{self:?} overflows")))
    }

    fn cache_len(&self) -> usize {
        self.batch * self.kv_heads * self.capacity * self.head_size
    }
}

/// How scores are formed and masked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreMod {
    /// Multiplies `q · k`.
    pub scale: f32,
    /// `softcap * tanh(x / softcap)` on scaled scores when positive; 0 turns it off.
    pub softcap: f32,
    /// Keys a query sees, itself included: positions `p + 1 - window ..= p`.
    pub window: Option<usize>,
}

/// Head vectors of new tokens inside wider rows: head `h` of token `t = b * seq + s` starts at
/// `offset + t * stride + h * head_size`. Covers plain `(batch, seq, heads * head_size)`
/// tensors (`offset` 0, `stride` = heads * head_size) and slices of packed QKV rows.
#[derive(Debug, Clone, Copy)]
pub struct Rows<'a, T> {
    pub data: &'a [T],
    pub stride: usize,
    pub offset: usize,
}

impl<T> Rows<'_, T> {
    /// Checks that `tokens` rows of `heads` heads lie inside `data`.
    pub(crate) fn check(
        &self,
        tokens: usize,
        heads: usize,
        head_size: usize,
        what: &str,
    ) -> Result<(), LayoutError> {
        if tokens == 0 || heads * head_size == 0 {
            return Ok(());
        }
        let end = (tokens - 1)
            .checked_mul(self.stride)
            .and_then(|v| v.checked_add(self.offset))
            .and_then(|v| v.checked_add(heads * head_size));
        match end {
            Some(end) if end <= self.data.len() => Ok(()),
            _ => Err(LayoutError::Shape(format!(
                "{what}: {tokens} rows of {heads} heads x {head_size} at offset {} stride {} do not fit in {} values",
                self.offset,
                self.stride,
                self.data.len()
            ))),
        }
    }

    pub(crate) fn head(&self, token: usize, h: usize, head_size: usize) -> &[T] {
        &self.data[self.offset + token * self.stride + h * head_size..][..head_size]
    }
}

fn check_starts(starts: &[usize], shape: &GqaShape, what: &'static str) -> Result<(), LayoutError> {
    check_len(what, starts.len(), shape.batch)?;
    match starts
        .iter()
        .position(|&p| p.checked_add(shape.seq).is_none_or(|e| e > shape.capacity))
    {
        Some(b) => Err(LayoutError::Shape(format!(
            "batch entry {b}: rows {}..{}+{} do not fit in a cache of {} positions",
            starts[b], starts[b], shape.seq, shape.capacity
        ))),
        None => Ok(()),
    }
}

/// Copies the first `lens[b]` positions of every (batch, kv head) of `past` (capacity
/// `past_capacity`) into `present` (capacity `shape.capacity`), the concatenation half of a
/// non-shared KV update.
pub fn copy_prefix<T: Copy>(
    past: &[T],
    past_capacity: usize,
    present: &mut [T],
    shape: &GqaShape,
    lens: &[usize],
) -> Result<(), LayoutError> {
    shape.check()?;
    let hs = shape.head_size;
    check_len(
        "past cache",
        past.len(),
        shape.batch * shape.kv_heads * past_capacity * hs,
    )?;
    check_len("present cache", present.len(), shape.cache_len())?;
    check_len("past lengths", lens.len(), shape.batch)?;
    if let Some(b) = lens
        .iter()
        .position(|&l| l > past_capacity.min(shape.capacity))
    {
        return Err(LayoutError::Shape(format!(
            "batch entry {b}: {} past positions do not fit in a past cache of {past_capacity} or a present cache of {}",
            lens[b], shape.capacity
        )));
    }
    for (b, &len) in lens.iter().enumerate() {
        for h in 0..shape.kv_heads {
            let head = b * shape.kv_heads + h;
            let n = len * hs;
            present[head * shape.capacity * hs..][..n]
                .copy_from_slice(&past[head * past_capacity * hs..][..n]);
        }
    }
    Ok(())
}

/// Writes the `shape.seq` new head vectors of every batch entry into `cache` at positions
/// `start[b]..start[b] + seq`, rotating them with `rope` (positions `start[b] + s`) when set.
/// `src` holds `shape.kv_heads` heads per row.
pub fn append_kv<T: Accum<Acc = f32>>(
    src: &Rows<T>,
    shape: &GqaShape,
    start: &[usize],
    rope: Option<&Rope<T>>,
    cache: &mut [T],
) -> Result<(), LayoutError> {
    shape.check()?;
    let GqaShape {
        batch,
        seq,
        kv_heads,
        head_size: hs,
        capacity,
        ..
    } = *shape;
    src.check(batch * seq, kv_heads, hs, "new keys/values")?;
    check_len("KV cache", cache.len(), shape.cache_len())?;
    check_starts(start, shape, "cache starts")?;
    for b in 0..batch {
        for s in 0..seq {
            for h in 0..kv_heads {
                let x = src.head(b * seq + s, h, hs);
                let dst = &mut cache[((b * kv_heads + h) * capacity + start[b] + s) * hs..][..hs];
                match rope {
                    Some(r) => {
                        rotate_one(x, Positions::Start(start).row(b, s, seq, r.rows())?, r, dst)?
                    }
                    None => dst.copy_from_slice(x),
                }
            }
        }
    }
    Ok(())
}

/// Rotates the query heads of `q` (positions `start[b] + s`) into `out`, laid out
/// `(batch, seq, heads * head_size)`.
pub fn rotate_query<T: Accum<Acc = f32>>(
    q: &Rows<T>,
    shape: &GqaShape,
    start: &[usize],
    rope: &Rope<T>,
    out: &mut [T],
) -> Result<(), LayoutError> {
    shape.check()?;
    let GqaShape {
        batch,
        seq,
        heads,
        head_size: hs,
        ..
    } = *shape;
    q.check(batch * seq, heads, hs, "query")?;
    check_len("rotated query", out.len(), batch * seq * heads * hs)?;
    check_len("query starts", start.len(), batch)?;
    for b in 0..batch {
        for s in 0..seq {
            let row = Positions::Start(start).row(b, s, seq, rope.rows())?;
            for h in 0..heads {
                let t = b * seq + s;
                rotate_one(
                    q.head(t, h, hs),
                    row,
                    rope,
                    &mut out[(t * heads + h) * hs..][..hs],
                )?;
            }
        }
    }
    Ok(())
}

/// Parts the (batch, head) pairs are split into on `pool`.
fn parts(shape: &GqaShape, pool: &ThreadPool) -> usize {
    let work = shape
        .seq
        .saturating_mul(shape.capacity)
        .saturating_mul(shape.head_size);
    head_parts(pool, shape.batch * shape.heads, work)
}

/// Query heads a part computes together: a KV head's `heads / kv_heads`, at most
/// [`MAX_GROUP`] (what the scratch is sized for).
pub(crate) fn group_len(heads: usize, kv_heads: usize) -> usize {
    (heads / kv_heads.max(1)).clamp(1, MAX_GROUP)
}

/// The f32 scratch [`attention`] needs on `pool`: per part, for each head computed together,
/// one score per cache position and one accumulator per head element.
pub fn scratch_len(shape: &GqaShape, pool: &ThreadPool) -> usize {
    parts(shape, pool) * group_len(shape.heads, shape.kv_heads) * (shape.capacity + shape.head_size)
}

/// Attention of every query row of `q` over the caches `k`, `v`; writes `out` laid out
/// `(batch, heads, seq, head_size)`. `start[b]` is the absolute position of entry `b`'s
/// first query row and `kv_len[b]` its number of valid cache positions (see the module doc).
#[allow(clippy::too_many_arguments)]
pub fn attention<T: Accum<Acc = f32>>(
    shape: &GqaShape,
    score: &ScoreMod,
    q: &Rows<T>,
    k: &[T],
    v: &[T],
    start: &[usize],
    kv_len: &[usize],
    out: &mut [T],
    scratch: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), LayoutError> {
    attention_with(
        shape, score, q, k, v, start, kv_len, out, scratch, pool, true,
    )
}

/// [`attention`] on the scalar reference alone (no AVX2): the oracle of the fast rows.
#[allow(clippy::too_many_arguments)]
pub fn attention_reference<T: Accum<Acc = f32>>(
    shape: &GqaShape,
    score: &ScoreMod,
    q: &Rows<T>,
    k: &[T],
    v: &[T],
    start: &[usize],
    kv_len: &[usize],
    out: &mut [T],
    scratch: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), LayoutError> {
    attention_with(
        shape, score, q, k, v, start, kv_len, out, scratch, pool, false,
    )
}

#[allow(clippy::too_many_arguments)]
fn attention_with<T: Accum<Acc = f32>>(
    shape: &GqaShape,
    score: &ScoreMod,
    q: &Rows<T>,
    k: &[T],
    v: &[T],
    start: &[usize],
    kv_len: &[usize],
    out: &mut [T],
    scratch: &mut [f32],
    pool: &ThreadPool,
    simd: bool,
) -> Result<(), LayoutError> {
    shape.check()?;
    let GqaShape {
        batch,
        seq,
        heads,
        kv_heads,
        head_size: hs,
        capacity,
    } = *shape;
    q.check(batch * seq, heads, hs, "query")?;
    check_len("key cache", k.len(), shape.cache_len())?;
    check_len("value cache", v.len(), shape.cache_len())?;
    check_len("query starts", start.len(), batch)?;
    check_len("KV lengths", kv_len.len(), batch)?;
    if let Some(b) = kv_len.iter().position(|&l| l > capacity) {
        return Err(LayoutError::Shape(format!(
            "batch entry {b}: {} valid positions exceed the cache capacity {capacity}",
            kv_len[b]
        )));
    }
    check_len("attention output", out.len(), batch * heads * seq * hs)?;
    if out.is_empty() {
        return Ok(());
    }
    let parts = parts(shape, pool);
    let g_max = group_len(shape.heads, shape.kv_heads);
    let per_part = g_max * (capacity + hs);
    if scratch.len() < parts * per_part {
        return Err(LayoutError::Length {
            what: "attention scratch",
            expected: parts * per_part,
            actual: scratch.len(),
        });
    }
    let heads_per_part = (batch * heads).div_ceil(parts);
    let group = heads / kv_heads;
    par_chunks2(
        pool,
        out,
        heads_per_part * seq * hs,
        scratch,
        per_part,
        |part, out, scratch| {
            let (scores, acc) = scratch.split_at_mut(g_max * capacity);
            let first = part * heads_per_part;
            let units = first..first + out.len() / (seq * hs);
            // A run never crosses a batch entry: `group` divides `heads`.
            for (u0, count) in kv_runs(units, group) {
                let (b, n0) = (u0 / heads, u0 % heads);
                let kvh = b * kv_heads + n0 / group;
                let cache = kvh * capacity * hs..(kvh + 1) * capacity * hs;
                let (kh, vh) = (&k[cache.clone()], &v[cache]);
                let run_out = &mut out[(u0 - first) * seq * hs..][..count * seq * hs];
                for s in 0..seq {
                    let p = start[b].saturating_add(s);
                    let end = kv_len[b].min(p.saturating_add(1));
                    let lo = score
                        .window
                        .map_or(0, |w| p.saturating_add(1).saturating_sub(w))
                        .min(end);
                    let qs: SmallVec<[&[T]; MAX_GROUP]> = (n0..n0 + count)
                        .map(|n| q.head(b * seq + s, n, hs))
                        .collect();
                    let mut outs: SmallVec<[&mut [T]; MAX_GROUP]> = run_out
                        .chunks_mut(seq * hs)
                        .map(|head| &mut head[s * hs..][..hs])
                        .collect();
                    let tiles = (lo..end)
                        .step_by(KEY_TILE)
                        .map(|j| (kh, vh, j..(j + KEY_TILE).min(end)));
                    attend_group_pieces(&qs, tiles, score, scores, acc, &mut outs, simd, false);
                }
            }
        },
    );
    Ok(())
}

/// Query heads that share a KV head and are computed together (see [`attend_group_pieces`]).
pub(crate) const MAX_GROUP: usize = 4;

/// Keys a contiguous cache hands [`attend_group_pieces`] at a time: 64 rows of 64 f32 keys are
/// 16 KiB, so the group's later heads find them in the L1 cache.
const KEY_TILE: usize = 64;

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
/// given in position order as pieces `(k, v, rows)`: rows `rows` of the head-size rows of `k`
/// and `v` (a tile of a contiguous cache, or a block of a paged one). Each head's arithmetic
/// is the module doc's, whatever the pieces and however many heads share the call; the heads
/// take each piece in turn while it is in cache. `scores` holds `qs.len()` rows of one score
/// per key, `acc` `qs.len()` rows of `head_size`; `outs[i]` receives head `i`'s row.
///
/// With `prefetch` (pieces scattered in memory, where the hardware prefetcher loses the
/// stream at each piece), each piece's successor is fetched while the piece computes: the
/// keys' pieces, then the values'.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_group_pieces<'a, T: Accum<Acc = f32> + 'a>(
    qs: &[&[T]],
    pieces: impl Iterator<Item = (&'a [T], &'a [T], std::ops::Range<usize>)> + Clone,
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
    let rows = |x: &'a [T], keys: &std::ops::Range<usize>| &x[keys.start * hs..keys.end * hs];
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
            if let Some((q32, k32)) = as_f32(q).zip(as_f32(k)).filter(|_| simd) {
                // SAFETY: `supported` checked AVX2 and FMA and hs % 8; the keys lie in `k`.
                unsafe { avx2::dots(q32, k32, keys.start, xs) };
                fast = true;
            }
            for (x, j) in xs.iter_mut().zip(keys.clone()) {
                let dot = if fast {
                    *x
                } else {
                    dot8(q, &k[j * hs..][..hs])
                };
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
        let v32 = as_f32(v).filter(|_| simd);
        for (h, &sum) in sum[..g].iter().enumerate() {
            for e in &mut scores[h * n + at..][..len] {
                *e /= sum;
            }
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(v32) = v32.filter(|_| hs == 64) {
            // SAFETY: `supported` checked AVX2 and FMA; `acc` holds g rows of 64, `scores` g
            // rows of n from `at`, and every value row of the keys 64 values.
            unsafe {
                avx2::weighted_sum64_group(acc, &scores[at..], n, len, g, v32, keys.start);
            }
            at += len;
            continue;
        }
        for h in 0..g {
            let es = &scores[h * n + at..][..len];
            let acc = &mut acc[h * hs..][..hs];
            #[cfg(target_arch = "x86_64")]
            if let Some(v32) = v32 {
                // SAFETY: `supported` checked AVX2 and FMA; `acc` and every value row of the
                // keys hold hs values.
                unsafe {
                    for (&p, j) in es.iter().zip(keys.clone()) {
                        avx2::weighted_add(acc, p, &v32[j * hs..][..hs]);
                    }
                }
                continue;
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = v32;
            for (&p, j) in es.iter().zip(keys.clone()) {
                let vj = &v[j * hs..][..hs];
                for d in 0..hs {
                    acc[d] = p.mul_add(vj[d].widen(), acc[d]);
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
pub(crate) fn dot8<T: Accum<Acc = f32>>(q: &[T], k: &[T]) -> f32 {
    let mut lanes = [0f32; 8];
    for (d, (a, b)) in q.iter().zip(k).enumerate() {
        lanes[d % 8] = a.widen().mul_add(b.widen(), lanes[d % 8]);
    }
    lane_tree(lanes)
}

/// `values` as f32, when `T` is f32 (the AVX2 paths are f32-only).
fn as_f32<T: 'static>(values: &[T]) -> Option<&[f32]> {
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()).then(|| {
        // SAFETY: `T` is `f32`, so the slice is already a `[f32]`.
        unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<f32>(), values.len()) }
    })
}

/// Transposes `(batch, heads, seq, head_size)` into `(batch, seq, heads * head_size)`.
pub fn heads_to_rows<T: Copy>(
    bnsh: &[T],
    shape: &GqaShape,
    out: &mut [T],
) -> Result<(), LayoutError> {
    let GqaShape {
        batch,
        seq,
        heads,
        head_size: hs,
        ..
    } = *shape;
    let n = batch * heads * seq * hs;
    check_len("attention heads", bnsh.len(), n)?;
    check_len("attention output", out.len(), n)?;
    for b in 0..batch {
        for h in 0..heads {
            for s in 0..seq {
                let src = ((b * heads + h) * seq + s) * hs;
                let dst = ((b * seq + s) * heads + h) * hs;
                out[dst..dst + hs].copy_from_slice(&bnsh[src..src + hs]);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
