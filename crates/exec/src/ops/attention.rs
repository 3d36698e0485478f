//! com.microsoft::GroupQueryAttention over `oxgen_kernels::{attention, rotary}` (its rotary
//! on Q and K; RotaryEmbedding alone is `rotary.rs`). f32, f16 and bf16 (math in f32).
//!
//! GroupQueryAttention (onnxruntime `docs/ContribOperators.md`; CPU kernel
//! `contrib_ops/cpu/bert/group_query_attention.cc`, `gqa_attention_base.h` and
//! `group_query_attention_helper.h`):
//! - `T_b = seqlens_k[b] + 1` keys are valid after the step for batch entry `b`. A call with
//!   `S == total_sequence_length` is a first prompt: every entry starts at position 0 (entries
//!   with `T_b < S` are right-padded; their padding rows see only the `T_b` valid keys). Any
//!   other call continues after `T_b - S` cached positions (`S > 1` needs batch 1, as in
//!   onnxruntime).
//! - KV caches are `(batch, kv_heads, length, head)`. When past_key already holds at least
//!   `total_sequence_length` positions it is the shared past/present buffer: the new K/V rows
//!   are written in place at positions `T_b - S..T_b` of the tensor the executor hands over
//!   (copied only when another node still reads it) and that tensor becomes present_key;
//!   positions past `T_b` keep whatever the buffer held. Otherwise present is
//!   `concat(past[..T_b - S], new)` of length `total_sequence_length`, zero-filled past each
//!   entry's `T_b` (what onnxruntime returns when the buffers are distinct).
//! - With do_rotary, Q and the new K are rotated at positions `start_b + s` (0-based for a
//!   first prompt) before K is cached.

use half::{bf16, f16};
use oxgen_graph::Op;
use oxgen_graph::ops::{GroupQueryAttention, HEAD_SINK_INPUT, LONG_ROPE_INPUTS};
use oxgen_kernels::acc::Accum;
use oxgen_kernels::attention::kv::CacheElem;
use oxgen_kernels::attention::paged as kp;
use oxgen_kernels::attention::{self as ka, GqaShape, Rows, ScoreMod};
use oxgen_kernels::rotary::Rope;
use oxgen_runtime::KvDtype;
use oxgen_tensor::{DType, Element, Tensor};

use super::{OpCtx, input, opt_input, owned_input, read_i64s};
use smallvec::{SmallVec, smallvec};

use super::{Outputs, Small};
use crate::OpError;

pub(super) fn run(
    op: &Op,
    inputs: &[Option<&Tensor>],
    donated: &mut [Option<Tensor>],
    n_outputs: usize,
    ctx: &mut OpCtx,
) -> Result<Outputs, OpError> {
    let dtype = input(inputs, 0)?.dtype();
    match (op, dtype) {
        (Op::GroupQueryAttention(g), DType::F32) => gqa::<f32>(g, inputs, donated, n_outputs, ctx),
        (Op::GroupQueryAttention(g), DType::F16) => gqa::<f16>(g, inputs, donated, n_outputs, ctx),
        (Op::GroupQueryAttention(g), DType::BF16) => {
            gqa::<bf16>(g, inputs, donated, n_outputs, ctx)
        }
        (Op::GroupQueryAttention(_), other) => Err(OpError::DType {
            dtype: other,
            detail: ": expected float32, float16 or bfloat16".into(),
        }),
        _ => unreachable!("ops::run routes only GroupQueryAttention here"),
    }
}

/// Input `i` whether lent or donated, for reading its shape before taking it.
fn peek<'a>(
    inputs: &[Option<&'a Tensor>],
    donated: &'a [Option<Tensor>],
    i: usize,
) -> Option<&'a Tensor> {
    opt_input(inputs, i).or_else(|| donated.get(i).and_then(Option::as_ref))
}

pub(super) fn same_dtype(x: &Tensor, t: &Tensor, what: &str) -> Result<(), OpError> {
    if t.dtype() == x.dtype() {
        Ok(())
    } else {
        Err(OpError::DType {
            dtype: t.dtype(),
            detail: format!(" for {what}: expected {} like the query", x.dtype()),
        })
    }
}

pub(super) fn expect_dims(
    t: &Tensor,
    want: &[usize],
    what: &str,
    layout: &str,
) -> Result<(), OpError> {
    if t.dims() == want {
        Ok(())
    } else {
        Err(OpError::shape(format!(
            "{what} must have shape {want:?} {layout}, got {}",
            t.shape()
        )))
    }
}

/// Everything a GroupQueryAttention call needs that depends only on shapes and seqlens.
struct GqaPlan {
    shape: GqaShape,
    /// Row width of the query input (wider than `heads * head_size` for packed QKV).
    q_width: usize,
    packed: bool,
    /// Positions past_key holds (0 without past).
    past_len: usize,
    /// Update past_key/past_value in place (shared buffer) instead of concatenating.
    in_place: bool,
    /// Absolute position of each entry's first query row.
    start: Small<usize>,
    /// Valid cache positions of each entry after the step (`seqlens_k + 1`).
    kv_len: Small<usize>,
    /// `rotary_dim / 2` when rotating.
    rope_half: Option<usize>,
}

/// The head size of a query row of `q_width` values (packed QKV rows hold every head).
fn head_size_of(g: &GroupQueryAttention, q_width: usize, packed: bool) -> Result<usize, OpError> {
    let (heads, kv_heads) = (g.num_heads, g.kv_num_heads);
    let per_row = if packed {
        kv_heads.checked_mul(2).and_then(|k| k.checked_add(heads))
    } else {
        Some(heads)
    }
    .ok_or_else(|| {
        OpError::value(format!(
            "num_heads {heads} + 2 * kv_num_heads {kv_heads} overflows"
        ))
    })?;
    let head_size = q_width / per_row;
    if head_size == 0 || head_size * per_row != q_width {
        return Err(OpError::shape(format!(
            "query hidden size {q_width} is not a positive multiple of {per_row} ({})",
            if packed {
                "num_heads + 2 * kv_num_heads, packed QKV"
            } else {
                "num_heads"
            }
        )));
    }
    Ok(head_size)
}

/// The cos/sin inputs: 7 and 8, or LongRoPE's long pair.
fn rope_inputs(long: bool) -> [usize; 2] {
    if long { LONG_ROPE_INPUTS } else { [7, 8] }
}

/// With do_rotary: the cos/sin caches' `(rows, rotary_dim / 2)` (and, with LongRoPE, the
/// long caches' rows), checked against the query.
fn rope_dims(
    g: &GroupQueryAttention,
    inputs: &[Option<&Tensor>],
    q: &Tensor,
    head_size: usize,
) -> Result<Option<RopeDims>, OpError> {
    if !g.do_rotary {
        return Ok(None);
    }
    let mut rows = [0; 2];
    let mut half = 0;
    for long in [false, true] {
        if long && g.long_rope_after.is_none() {
            break;
        }
        let [c, s] = rope_inputs(long);
        let (cos, sin) = (input(inputs, c)?, input(inputs, s)?);
        let &[n, h] = cos.dims() else {
            return Err(OpError::shape(format!(
                "cos_cache must be 2-D (positions, rotary_dim / 2), got {}",
                cos.shape()
            )));
        };
        same_dtype(q, cos, "cos_cache")?;
        same_dtype(q, sin, "sin_cache")?;
        expect_dims(sin, cos.dims(), "sin_cache", "(the shape of cos_cache)")?;
        if h == 0 || 2 * h > head_size || long && h != half {
            return Err(OpError::shape(format!(
                "cos_cache has {h} columns: rotary_dim = 2 * {h} must lie in 1..=head_size ({head_size}) and be the same for both LongRoPE caches"
            )));
        }
        rows[long as usize] = n;
        half = h;
    }
    Ok(Some(RopeDims { rows, half }))
}

/// The rotary caches' sizes: rows of the cos/sin pair and of LongRoPE's long pair.
struct RopeDims {
    rows: [usize; 2],
    half: usize,
}

impl RopeDims {
    /// Rows of the caches a sequence holding `len` positions after the step rotates with.
    fn rows_for(&self, g: &GroupQueryAttention, len: usize) -> usize {
        self.rows[g.long_rope_after.is_some_and(|after| len > after) as usize]
    }
}

/// The rotary tables when rotating (`half` = rotary_dim / 2, from the checks).
fn rope_tables<'a, T: Element>(
    g: &GroupQueryAttention,
    inputs: &[Option<&'a Tensor>],
    half: Option<usize>,
) -> Result<Option<Rope<'a, T>>, OpError> {
    let Some(half) = half else {
        return Ok(None);
    };
    let (cos, sin) = (
        input(inputs, 7)?.as_slice::<T>()?,
        input(inputs, 8)?.as_slice::<T>()?,
    );
    let mut rope = Rope::new(cos, sin, half, g.rotary_interleaved).map_err(OpError::from)?;
    if let Some(after) = g.long_rope_after {
        let [c, s] = LONG_ROPE_INPUTS;
        let (cos, sin) = (
            input(inputs, c)?.as_slice::<T>()?,
            input(inputs, s)?.as_slice::<T>()?,
        );
        rope = rope.with_long(after, cos, sin).map_err(OpError::from)?;
    }
    Ok(Some(rope))
}

/// The new keys (`i` = 1) or values (`i` = 2) as rows: their own input, or their slice of
/// the packed QKV rows `q` (`heads` query and `kv_heads` KV heads of `hs`).
fn new_rows<'a, T: Element>(
    inputs: &[Option<&'a Tensor>],
    q: &'a [T],
    packed: bool,
    q_width: usize,
    (heads, kv_heads, hs): (usize, usize, usize),
    i: usize,
) -> Result<Rows<'a, T>, OpError> {
    Ok(if packed {
        Rows {
            data: q,
            stride: q_width,
            offset: (heads + (i - 1) * kv_heads) * hs,
        }
    } else {
        Rows {
            data: input(inputs, i)?.as_slice::<T>()?,
            stride: kv_heads * hs,
            offset: 0,
        }
    })
}

/// The query rows attention reads: the rotated copy when there is one, else the input's.
fn query_rows<'a, T: Element>(
    rotated: Option<&'a Tensor>,
    q: &'a [T],
    q_width: usize,
    heads: usize,
    hs: usize,
) -> Result<Rows<'a, T>, OpError> {
    Ok(match rotated {
        Some(t) => Rows {
            data: t.as_slice::<T>()?,
            stride: heads * hs,
            offset: 0,
        },
        None => Rows {
            data: q,
            stride: q_width,
            offset: 0,
        },
    })
}

fn score_mod<'a>(g: &GroupQueryAttention, hs: usize, sinks: Option<&'a [f32]>) -> ScoreMod<'a> {
    ScoreMod {
        scale: g.scale.unwrap_or(1.0 / (hs as f32).sqrt()),
        softcap: g.softcap,
        window: g.local_window_size,
        sinks,
    }
}

/// Attention sinks in f32, one per query head (on the stack: gpt-oss has 64 heads): the
/// `head_sink` input, or zeros when only `smooth_softmax` asks for them; `None` without.
fn sinks<T: Accum<Acc = f32> + Element>(
    g: &GroupQueryAttention,
    inputs: &[Option<&Tensor>],
) -> Result<Option<SmallVec<[f32; 128]>>, OpError> {
    if !g.sinks {
        return Ok(None);
    }
    let Some(t) = opt_input(inputs, HEAD_SINK_INPUT) else {
        return Ok(Some(smallvec![0.0; g.num_heads]));
    };
    same_dtype(input(inputs, 0)?, t, "head_sink")?;
    expect_dims(t, &[g.num_heads], "head_sink", "(num_heads)")?;
    Ok(Some(t.as_slice::<T>()?.iter().map(|x| x.widen()).collect()))
}

fn plan(
    g: &GroupQueryAttention,
    inputs: &[Option<&Tensor>],
    donated: &[Option<Tensor>],
) -> Result<GqaPlan, OpError> {
    let q = input(inputs, 0)?;
    let &[batch, seq, q_width] = q.dims() else {
        return Err(OpError::shape(format!(
            "query must be 3-D (batch, sequence, hidden), got shape {}",
            q.shape()
        )));
    };
    let (heads, kv_heads) = (g.num_heads, g.kv_num_heads);
    let (key, value) = (opt_input(inputs, 1), opt_input(inputs, 2));
    let packed = key.is_none();
    let head_size = head_size_of(g, q_width, packed)?;
    match (key, value) {
        (None, None) => {}
        (Some(k), Some(v)) => {
            for (t, what) in [(k, "key"), (v, "value")] {
                same_dtype(q, t, what)?;
                expect_dims(
                    t,
                    &[batch, seq, kv_heads * head_size],
                    what,
                    "(batch, sequence, kv_num_heads * head_size)",
                )?;
            }
        }
        _ => {
            return Err(OpError::value(
                "key and value must be both present or both absent",
            ));
        }
    }
    let past_len = match (peek(inputs, donated, 3), peek(inputs, donated, 4)) {
        (Some(pk), Some(pv)) => {
            let len = pk.dims().get(2).copied().unwrap_or(0);
            for (t, what) in [(pk, "past_key"), (pv, "past_value")] {
                same_dtype(q, t, what)?;
                expect_dims(
                    t,
                    &[batch, kv_heads, len, head_size],
                    what,
                    "(batch, kv_num_heads, length, head_size)",
                )?;
            }
            Some(len)
        }
        (None, None) => None,
        _ => {
            return Err(OpError::value(
                "past_key and past_value must be both present or both absent",
            ));
        }
    };
    let seqlens = read_i64s(input(inputs, 5)?, "seqlens_k")?;
    if seqlens.len() != batch {
        return Err(OpError::shape(format!(
            "seqlens_k holds {} values, expected batch size {batch}",
            seqlens.len()
        )));
    }
    let total = match read_i64s(input(inputs, 6)?, "total_sequence_length")?[..] {
        [t] if t >= 1 => usize::try_from(t)
            .map_err(|_| OpError::value(format!("total_sequence_length {t} is too large")))?,
        [t] => {
            return Err(OpError::value(format!(
                "total_sequence_length must be at least 1, got {t}"
            )));
        }
        _ => {
            return Err(OpError::shape(
                "total_sequence_length must hold exactly one value",
            ));
        }
    };
    if seq == 0 {
        return Err(OpError::shape("query has sequence length 0"));
    }
    let first_prompt = seq == total;
    if !first_prompt && seq > 1 && batch != 1 {
        return Err(OpError::value(format!(
            "a {seq}-token step after cached positions (total_sequence_length {total} != sequence length {seq}) needs batch size 1, got {batch}"
        )));
    }
    let mut start = Small::with_capacity(batch);
    let mut kv_len = Small::with_capacity(batch);
    for (b, &sl) in seqlens.iter().enumerate() {
        let valid = sl
            .checked_add(1)
            .and_then(|t| usize::try_from(t).ok())
            .filter(|t| (1..=total).contains(t));
        let Some(valid) = valid else {
            return Err(OpError::value(format!(
                "seqlens_k[{b}] = {sl} is out of range: it must lie in 0..total_sequence_length ({total})"
            )));
        };
        let first = if first_prompt {
            0
        } else {
            valid.checked_sub(seq).ok_or_else(|| {
                OpError::value(format!(
                    "seqlens_k[{b}] = {sl} gives {valid} positions, fewer than the {seq} new tokens"
                ))
            })?
        };
        start.push(first);
        kv_len.push(valid);
    }
    let past = past_len.unwrap_or(0);
    let in_place = past_len.is_some() && past >= total;
    if let Some(b) = start.iter().position(|&p| p > past).filter(|_| !in_place) {
        return Err(OpError::value(format!(
            "batch entry {b} continues after {} cached positions, but {}",
            start[b],
            if past_len.is_some() {
                format!("past_key holds only {past}")
            } else {
                "past_key is absent".to_string()
            }
        )));
    }
    let rope_half = match rope_dims(g, inputs, q, head_size)? {
        Some(dims) => {
            // Checked before any cache is touched: a shared buffer is updated in place.
            let end = |b: usize| start[b].saturating_add(seq);
            if let Some(b) = (0..batch).find(|&b| end(b) > dims.rows_for(g, end(b))) {
                return Err(OpError::value(format!(
                    "batch entry {b} needs rotary positions up to {}, but cos_cache has {} rows",
                    end(b) - 1,
                    dims.rows_for(g, end(b))
                )));
            }
            Some(dims.half)
        }
        None => None,
    };
    let shape = GqaShape {
        batch,
        seq,
        heads,
        kv_heads,
        head_size,
        capacity: total.max(past),
    };
    Ok(GqaPlan {
        shape,
        q_width,
        packed,
        past_len: past,
        in_place,
        start,
        kv_len,
        rope_half,
    })
}

fn gqa<T: Accum<Acc = f32> + Element + CacheElem>(
    g: &GroupQueryAttention,
    inputs: &[Option<&Tensor>],
    donated: &mut [Option<Tensor>],
    n_outputs: usize,
    ctx: &mut OpCtx,
) -> Result<Outputs, OpError> {
    if let Some(layer) = ctx.lowered.kv_layer()
        && let Some(step) = ctx.kv.take()
    {
        let paged = crate::kv::PagedLayer {
            store: step.store,
            layer,
            segments: step.segments,
            tables: step.tables,
        };
        return gqa_paged::<T>(g, inputs, donated, n_outputs, ctx, paged);
    }
    if g.window_cache {
        return Err(OpError::value(
            "a window-sized KV cache (sliding_window_cache = 1) runs only as a language model on \
             the paged KV cache, which keeps every position and reads the window",
        ));
    }
    let p = plan(g, inputs, donated)?;
    let GqaShape {
        batch,
        seq,
        heads,
        kv_heads,
        head_size: hs,
        capacity,
    } = p.shape;
    let dtype = input(inputs, 0)?.dtype();
    let (mut pk, mut pv) = if p.in_place {
        (
            owned_input(inputs, donated, 3)?,
            owned_input(inputs, donated, 4)?,
        )
    } else {
        let dims = [batch, kv_heads, capacity, hs];
        let (mut pk, mut pv) = (
            ctx.arena.alloc_zeroed(dtype, dims)?,
            ctx.arena.alloc_zeroed(dtype, dims)?,
        );
        for (i, present) in [(3, &mut pk), (4, &mut pv)] {
            if let Some(past) = peek(inputs, donated, i) {
                ka::copy_prefix(
                    past.as_slice::<T>()?,
                    p.past_len,
                    present.as_mut_slice::<T>()?,
                    &p.shape,
                    &p.start,
                )
                .map_err(OpError::from)?;
            }
        }
        (pk, pv)
    };
    let q = input(inputs, 0)?.as_slice::<T>()?;
    let rope = rope_tables::<T>(g, inputs, p.rope_half)?;
    let new_kv = |i: usize| new_rows(inputs, q, p.packed, p.q_width, (heads, kv_heads, hs), i);
    let (k_new, v_new) = (new_kv(1)?, new_kv(2)?);
    ka::append_kv(
        &k_new,
        &p.shape,
        &p.start,
        rope.as_ref(),
        pk.as_mut_slice::<T>()?,
    )
    .map_err(OpError::from)?;
    ka::append_kv(&v_new, &p.shape, &p.start, None, pv.as_mut_slice::<T>()?)
        .map_err(OpError::from)?;

    let mut rotated = None;
    if let Some(rope) = &rope {
        let mut t = ctx.alloc(dtype, [batch, seq, heads * hs])?;
        let rows = Rows {
            data: q,
            stride: p.q_width,
            offset: 0,
        };
        ka::rotate_query(&rows, &p.shape, &p.start, rope, t.as_mut_slice::<T>()?)
            .map_err(OpError::from)?;
        rotated = Some(t);
    }
    let q_rows = query_rows(rotated.as_ref(), q, p.q_width, heads, hs)?;
    let sinks = sinks::<T>(g, inputs)?;
    let score = score_mod(g, hs, sinks.as_deref());
    let mut by_head = ctx.alloc(dtype, [batch, heads, seq, hs])?;
    let mut scratch = ctx.alloc(DType::F32, [ka::scratch_len(&p.shape, ctx.pool)])?;
    ka::attention(
        &p.shape,
        &score,
        ka::GqaInputs {
            q: q_rows,
            k: pk.as_slice::<T>()?,
            v: pv.as_slice::<T>()?,
            start: &p.start,
            kv_len: &p.kv_len,
        },
        by_head.as_mut_slice::<T>()?,
        scratch.as_mut_slice::<f32>()?,
        ctx.pool,
    )
    .map_err(OpError::from)?;
    let mut out = ctx.alloc(dtype, [batch, seq, heads * hs])?;
    ka::heads_to_rows(by_head.as_slice::<T>()?, &p.shape, out.as_mut_slice::<T>()?)
        .map_err(OpError::from)?;
    for t in [Some(by_head), Some(scratch), rotated]
        .into_iter()
        .flatten()
    {
        ctx.arena.release(t);
    }
    let mut outputs: Outputs = smallvec![out, pk, pv];
    for t in outputs.drain(n_outputs.clamp(1, 3)..) {
        ctx.arena.release(t);
    }
    Ok(outputs)
}

/// One ragged step over a paged KV cache: the query rows are every sequence's new tokens
/// (`(1, tokens, hidden)`), the new keys and values go into the pool at each segment's
/// positions, and each row attends over its own sequence's blocks. `seqlens_k` and
/// `total_sequence_length` are not read (the segments say it all); the past inputs pass
/// through as the present outputs.
fn gqa_paged<T: Accum<Acc = f32> + Element + CacheElem>(
    g: &GroupQueryAttention,
    inputs: &[Option<&Tensor>],
    donated: &mut [Option<Tensor>],
    n_outputs: usize,
    ctx: &mut OpCtx,
    paged: crate::kv::PagedLayer,
) -> Result<Outputs, OpError> {
    let x = input(inputs, 0)?;
    let &[1, tokens, q_width] = x.dims() else {
        return Err(OpError::shape(format!(
            "a paged step needs the query as (1, tokens, hidden), got shape {}",
            x.shape()
        )));
    };
    let (heads, kv_heads) = (g.num_heads, g.kv_num_heads);
    let packed = opt_input(inputs, 1).is_none();
    let hs = head_size_of(g, q_width, packed)?;
    let layout = *paged.store.layout();
    if layout.kv_heads != kv_heads || layout.head_size != hs {
        return Err(OpError::shape(format!(
            "the KV cache holds {} heads of {}, this node {kv_heads} of {hs}",
            layout.kv_heads, layout.head_size
        )));
    }
    if !packed {
        for (i, what) in [(1, "key"), (2, "value")] {
            let t = input(inputs, i)?;
            same_dtype(x, t, what)?;
            expect_dims(
                t,
                &[1, tokens, kv_heads * hs],
                what,
                "(1, tokens, kv_num_heads * head_size)",
            )?;
        }
    }
    let dtype = x.dtype();
    let q = x.as_slice::<T>()?;
    let half = rope_dims(g, inputs, x, hs)?.map(|d| d.half);
    let rope = rope_tables::<T>(g, inputs, half)?;
    let new_kv = |i: usize| new_rows(inputs, q, packed, q_width, (heads, kv_heads, hs), i);
    let (segments, tables) = (paged.segments, paged.tables);
    let new = kp::NewKv {
        keys: new_kv(1)?,
        values: new_kv(2)?,
        rope: rope.as_ref(),
    };
    let rows = Rows {
        data: q,
        stride: q_width,
        offset: 0,
    };
    let rotated_len = if rope.is_some() { tokens } else { 0 };
    let mut rotated = ctx.alloc(dtype, [1, rotated_len, heads * hs])?;
    let sinks = sinks::<T>(g, inputs)?;
    let score = score_mod(g, hs, sinks.as_deref());
    let mut out = ctx.alloc(dtype, [1, tokens, heads * hs])?;
    let scratch_len = kp::paged_scratch_len(&layout, heads, segments, ctx.pool);
    let mut scratch = ctx.alloc(DType::F32, [scratch_len])?;
    // The same step whatever the cache stores (`KvDtype`): the kernels widen each element.
    macro_rules! step_on {
        ($c:ty) => {{
            let (mem, k_at, v_at) = paged.store.layer_views::<$c>(paged.layer)?;
            kp::paged_step(
                kp::PagedBatch {
                    heads,
                    layout: &layout,
                    segments,
                    tables,
                },
                &score,
                &rows,
                &new,
                (mem, k_at, v_at),
                rotated.as_mut_slice::<T>()?,
                (
                    out.as_mut_slice::<T>()?,
                    scratch.as_mut_slice::<f32>()?,
                    ctx.pool,
                ),
            )
        }};
    }
    match paged.store.kv_dtype() {
        KvDtype::F32 => step_on!(f32),
        KvDtype::F16 => step_on!(f16),
        KvDtype::BF16 => step_on!(bf16),
        KvDtype::Int8 => step_on!(i8),
    }
    .map_err(OpError::from)?;
    ctx.arena.release(scratch);
    ctx.arena.release(rotated);
    let mut outputs: Outputs = smallvec![out];
    if n_outputs > 1 {
        outputs.push(owned_input(inputs, donated, 3)?);
        outputs.push(owned_input(inputs, donated, 4)?);
    }
    Ok(outputs)
}
