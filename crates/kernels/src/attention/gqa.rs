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
//! Each row's arithmetic is [`super::group`]'s: a row's result depends only on its query
//! vector and the cache, never on how many query rows share the call or on the thread count.
//! Threads split (batch, head) pairs, never a row, in contiguous runs, so the query heads
//! that share a KV head mostly run together and take each tile of keys and values in turn
//! while it is in cache (each head's arithmetic unchanged). So prefill of S tokens equals S
//! single-token decode steps bit for bit (tested below).
//!
//! References: onnxruntime `docs/ContribOperators.md` (GroupQueryAttention) and its CPU
//! kernel `contrib_ops/cpu/bert/gqa_attention_base.h`; Ainslie et al., "GQA"
//! (arXiv:2305.13245).

use super::group::{
    MAX_GROUP, RowKeys, attend_rows, group_len, head_parts, kv_runs, row_scratch_len,
};
use super::kv::{CacheElem, Cached};
use super::shape::{GqaShape, Rows, ScoreMod};
use crate::ThreadPool;
use crate::acc::Accum;
use crate::error::{KernelError, check_len};
use crate::par::par_chunks2;
use smallvec::SmallVec;

/// Parts the (batch, head) pairs are split into on `pool`.
fn parts(shape: &GqaShape, pool: &ThreadPool) -> usize {
    let work = shape
        .seq
        .saturating_mul(shape.capacity)
        .saturating_mul(shape.head_size);
    head_parts(pool, shape.batch * shape.heads, work)
}

/// The f32 scratch [`attention`] needs on `pool`: per part, for each head computed together,
/// its scores over a tile of keys and two accumulators of a head's elements.
pub fn scratch_len(shape: &GqaShape, pool: &ThreadPool) -> usize {
    parts(shape, pool) * row_scratch_len(group_len(shape.heads, shape.kv_heads), shape.head_size)
}

/// What attention reads: the query rows, the key and value caches (laid out as
/// [`GqaShape::cache_len`] says), and per batch entry `start[b]`, the absolute position of its
/// first query row, and `kv_len[b]`, its number of valid cache positions (see the module doc).
#[derive(Clone, Copy)]
pub struct GqaInputs<'a, T> {
    pub q: Rows<'a, T>,
    pub k: &'a [T],
    pub v: &'a [T],
    pub start: &'a [usize],
    pub kv_len: &'a [usize],
}

/// Attention of every query row over the caches ([`GqaInputs`]); writes `out` laid out
/// `(batch, heads, seq, head_size)`.
pub fn attention<T: Accum<Acc = f32> + CacheElem>(
    shape: &GqaShape,
    score: &ScoreMod,
    inputs: GqaInputs<'_, T>,
    out: &mut [T],
    scratch: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    attention_with(shape, score, inputs, out, scratch, pool, true)
}

/// [`attention`] on the scalar reference alone (no AVX2): the oracle of the fast rows.
pub fn attention_reference<T: Accum<Acc = f32> + CacheElem>(
    shape: &GqaShape,
    score: &ScoreMod,
    inputs: GqaInputs<'_, T>,
    out: &mut [T],
    scratch: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    attention_with(shape, score, inputs, out, scratch, pool, false)
}

fn attention_with<T: Accum<Acc = f32> + CacheElem>(
    shape: &GqaShape,
    score: &ScoreMod,
    inputs: GqaInputs<'_, T>,
    out: &mut [T],
    scratch: &mut [f32],
    pool: &ThreadPool,
    simd: bool,
) -> Result<(), KernelError> {
    let GqaInputs {
        q,
        k,
        v,
        start,
        kv_len,
    } = inputs;
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
    score.check(heads)?;
    check_len("key cache", k.len(), shape.cache_len())?;
    check_len("value cache", v.len(), shape.cache_len())?;
    check_len("query starts", start.len(), batch)?;
    check_len("KV lengths", kv_len.len(), batch)?;
    if let Some(b) = kv_len.iter().position(|&l| l > capacity) {
        return Err(KernelError::Shape(format!(
            "batch entry {b}: {} valid positions exceed the cache capacity {capacity}",
            kv_len[b]
        )));
    }
    check_len("attention output", out.len(), batch * heads * seq * hs)?;
    if out.is_empty() {
        return Ok(());
    }
    let parts = parts(shape, pool);
    let per_part = row_scratch_len(group_len(shape.heads, shape.kv_heads), hs);
    if scratch.len() < parts * per_part {
        return Err(KernelError::Length {
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
                    let pieces = |keys: std::ops::Range<usize>| {
                        let end = keys.end;
                        keys.step_by(KEY_TILE).map(move |j| {
                            (
                                Cached::plain(kh),
                                Cached::plain(vh),
                                j..(j + KEY_TILE).min(end),
                            )
                        })
                    };
                    let sinks = score.sinks.map(|s| &s[n0..n0 + count]);
                    let row = RowKeys {
                        qs: &qs,
                        keys: &[end - lo],
                        first: lo,
                        score,
                        sinks,
                    };
                    attend_rows(&row, pieces, scratch, &mut outs, simd, false);
                }
            }
        },
    );
    Ok(())
}

/// Keys a contiguous cache hands [`attend_rows`] at a time: 64 rows of 64 f32 keys are
/// 16 KiB, so the group's later heads find them in the L1 cache.
const KEY_TILE: usize = 64;

/// Transposes `(batch, heads, seq, head_size)` into `(batch, seq, heads * head_size)`.
pub fn heads_to_rows<T: Copy>(
    bnsh: &[T],
    shape: &GqaShape,
    out: &mut [T],
) -> Result<(), KernelError> {
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
#[path = "gqa_tests.rs"]
mod tests;
