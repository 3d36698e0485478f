//! onnxruntime's fused BERT encoder ops, as its transformer optimizer writes them:
//! com.microsoft::EmbedLayerNormalization (a token's word, position and segment rows summed,
//! then the layer norm), BiasGelu / FastGelu (GELU of `x + bias`) and Attention (the fused
//! self-attention, without a decoder's past); and `oxgen::ErfGelu`, the erf GELU exporters
//! spell out, fused by `oxgen_graph::passes::gelu` with the graph's own arithmetic.
//! Reference: onnxruntime `docs/ContribOperators.md` and `contrib_ops/cpu/bert/`
//! (`embed_layer_norm.cc`, `bias_gelu.cc`, `fast_gelu.cc`, `attention.cc`,
//! `attention_helper.h`).

use oxgen_graph::Op;
use oxgen_graph::ops::{Attention, EmbedNorm, EncoderAttention, ErfGelu, ScoreScale};
use oxgen_kernels::erf::{GeluForm, Scale};
use oxgen_kernels::matmul::{self as km, Bias};
use oxgen_kernels::norm as kn;
use oxgen_kernels::softmax as ks;
use oxgen_kernels::{Scalar, erf, par};
use oxgen_tensor::{DType, Tensor};
use smallvec::smallvec;

use super::elementwise::{FLOAT_MAP_CHUNK, gelu};
use super::{OpCtx, Outputs, input, opt_input};
use crate::OpError;

pub(super) fn run(
    op: &Op,
    inputs: &[Option<&Tensor>],
    n_outputs: usize,
    ctx: &mut OpCtx,
) -> Result<Outputs, OpError> {
    match op {
        Op::EmbedNorm(e) => embed_norm(e, inputs, n_outputs, ctx),
        Op::BiasGelu { tanh } => bias_gelu(*tanh, inputs, ctx).map(|t| smallvec![t]),
        Op::ErfGelu(g) => erf_gelu(g, inputs, ctx).map(|t| smallvec![t]),
        Op::Attention(a) => attention(a, inputs, ctx).map(|t| smallvec![t]),
        Op::EncoderAttention(a) => encoder_attention(a, inputs, ctx).map(|t| smallvec![t]),
        _ => unreachable!("ops::run routes only the fused encoder ops here"),
    }
}

/// GELU of `x + bias`, `bias` (one value per element of the last axis) added in the
/// element type. The f32 erf form runs the vectorized GELU kernel; the others
/// (the tanh form, other float types) evaluate in f64. Each element's value does not depend
/// on how the elements are split.
fn bias_gelu(tanh: bool, inputs: &[Option<&Tensor>], ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    let x = input(inputs, 0)?;
    let bias = opt_input(inputs, 1);
    check_bias(x, bias)?;
    if x.dtype() == DType::F32 && !tanh {
        // onnxruntime's `0.5 * v * (1 + erf(v * M_SQRT1_2))`.
        let form = GeluForm {
            scale: Scale::Multiply(std::f32::consts::FRAC_1_SQRT_2),
            half: 0.5,
            add: 1.0,
            half_first: true,
        };
        return gelu_rows(x, bias, form, ctx);
    }
    let n = x.dims().last().copied().unwrap_or(1).max(1);
    let mut out = ctx.alloc(x.dtype(), x.shape().clone())?;
    dispatch_float!(x.dtype(), T => {
        let (src, bias) = (x.as_slice::<T>()?, bias.map(|b| b.as_slice::<T>()).transpose()?);
        par::par_chunks(ctx.pool, out.as_mut_slice::<T>()?, FLOAT_MAP_CHUNK, |start, part| {
            for (j, o) in part.iter_mut().enumerate() {
                let at = start + j;
                let v = bias.map_or(src[at], |b| src[at].add(b[at % n]));
                *o = T::from_f64(gelu(v.to_f64(), tanh));
            }
        });
        Ok::<(), OpError>(())
    })?;
    Ok(out)
}

/// `oxgen::ErfGelu`: the erf GELU an exporter spelled out, of `x + bias` where there is a
/// bias, each element with the graph's operations in the graph's order.
fn erf_gelu(g: &ErfGelu, inputs: &[Option<&Tensor>], ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    let x = input(inputs, 0)?;
    let bias = opt_input(inputs, 1);
    check_bias(x, bias)?;
    if x.dtype() != DType::F32 {
        return Err(OpError::DType {
            dtype: x.dtype(),
            detail: " for ErfGelu's input: expected float32".into(),
        });
    }
    let ErfGelu {
        divisor,
        add,
        half,
        half_first,
    } = *g;
    let form = GeluForm {
        scale: Scale::Divide(divisor),
        half,
        add,
        half_first,
    };
    gelu_rows(x, bias, form, ctx)
}

/// A bias, when given, is `x`'s dtype and one value per element of its last axis.
fn check_bias(x: &Tensor, bias: Option<&Tensor>) -> Result<(), OpError> {
    let Some(b) = bias else {
        return Ok(());
    };
    let n = x.dims().last().copied().unwrap_or(1).max(1);
    if b.dtype() != x.dtype() {
        return Err(OpError::DType {
            dtype: b.dtype(),
            detail: format!(" for the bias: expected {} like the input", x.dtype()),
        });
    }
    if b.dims() != [n] {
        return Err(OpError::shape(format!(
            "the bias has shape {:?}; expected [{n}], the input's last axis (input shape {:?})",
            b.dims(),
            x.dims()
        )));
    }
    Ok(())
}

/// `form`'s GELU of `x + bias` (the bias repeated along the last axis) for float32 `x`,
/// split over the pool (a bias splits each part at row ends, so each piece has its slice).
fn gelu_rows(
    x: &Tensor,
    bias: Option<&Tensor>,
    form: GeluForm,
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let n = x.dims().last().copied().unwrap_or(1).max(1);
    let mut out = ctx.alloc(DType::F32, x.shape().clone())?;
    let (src, bias) = (
        x.as_slice::<f32>()?,
        bias.map(|b| b.as_slice::<f32>()).transpose()?,
    );
    let dst = out.as_mut_slice::<f32>()?;
    par::par_chunks(ctx.pool, dst, FLOAT_MAP_CHUNK, |start, mut part| {
        let mut at = start;
        while !part.is_empty() {
            let col = at % n;
            let len = bias.map_or(part.len(), |_| part.len().min(n - col));
            let (piece, rest) = std::mem::take(&mut part).split_at_mut(len);
            let bias = bias.map(|b| &b[col..col + len]);
            erf::gelu_slice(&src[at..at + len], bias, form, piece);
            (part, at) = (rest, at + len);
        }
    });
    Ok(out)
}

/// An int32 input of `want` elements (ids, masks), named for errors.
fn ids<'a>(t: &'a Tensor, what: &str, want: usize) -> Result<&'a [i32], OpError> {
    if t.dtype() != DType::I32 {
        return Err(OpError::DType {
            dtype: t.dtype(),
            detail: format!(" for {what}: EmbedLayerNormalization takes int32"),
        });
    }
    let v = t.as_slice::<i32>()?;
    if v.len() != want {
        return Err(OpError::shape(format!(
            "{what} has shape {:?}: expected {want} elements, one per token",
            t.dims()
        )));
    }
    Ok(v)
}

/// A table's row `id` (`hidden` wide), or an error naming the table and the token.
fn table_row<'a>(
    table: &'a [f32],
    hidden: usize,
    id: i64,
    (what, token): (&str, usize),
) -> Result<&'a [f32], OpError> {
    let rows = table.len() / hidden.max(1);
    usize::try_from(id)
        .ok()
        .filter(|&i| i < rows)
        .map(|i| &table[i * hidden..][..hidden])
        .ok_or_else(|| {
            OpError::value(format!(
                "token {token}: index {id} is outside the {what} table's {rows} rows"
            ))
        })
}

/// com.microsoft::EmbedLayerNormalization (float32, as onnxruntime's CPU kernel): each
/// token's word, position and segment rows summed in that order, then the layer norm.
fn embed_norm(
    e: &EmbedNorm,
    inputs: &[Option<&Tensor>],
    n_outputs: usize,
    ctx: &mut OpCtx,
) -> Result<Outputs, OpError> {
    let input_ids = input(inputs, 0)?;
    let [batch, seq] = input_ids.dims() else {
        return Err(OpError::shape(format!(
            "input_ids has shape {:?}; expected (batch, sequence)",
            input_ids.dims()
        )));
    };
    let (batch, seq) = (*batch, *seq);
    let tokens = batch * seq;
    let word = input(inputs, 2)?;
    let [_, hidden] = word.dims() else {
        return Err(OpError::shape(format!(
            "word_embedding has shape {:?}; expected (vocabulary, hidden)",
            word.dims()
        )));
    };
    let hidden = *hidden;
    let table = |i: usize, what: &str| -> Result<&[f32], OpError> {
        let t = input(inputs, i)?;
        if t.dtype() != DType::F32 {
            return Err(OpError::DType {
                dtype: t.dtype(),
                detail: format!(" for {what}: EmbedLayerNormalization runs on float32"),
            });
        }
        if t.dims().last() != Some(&hidden) {
            return Err(OpError::shape(format!(
                "{what} has shape {:?}; its last axis must be the hidden size {hidden}",
                t.dims()
            )));
        }
        Ok(t.as_slice::<f32>()?)
    };
    let (words, positions) = (table(2, "word_embedding")?, table(3, "position_embedding")?);
    let (gamma, beta) = (table(5, "gamma")?, table(6, "beta")?);
    let segments = match (opt_input(inputs, 1), opt_input(inputs, 4)) {
        (Some(s), Some(_)) => Some((
            ids(s, "segment_ids", tokens)?,
            table(4, "segment_embedding")?,
        )),
        _ => None,
    };
    let position_ids = match opt_input(inputs, 8) {
        Some(p) if p.numel() == seq && batch > 1 => Some((ids(p, "position_ids", seq)?, seq)),
        Some(p) => Some((ids(p, "position_ids", tokens)?, tokens)),
        None => None,
    };
    let ids_ = ids(input_ids, "input_ids", tokens)?;
    let mut sum = ctx.alloc(DType::F32, [batch, seq, hidden])?;
    for (t, row) in sum
        .as_mut_slice::<f32>()?
        .chunks_mut(hidden.max(1))
        .enumerate()
    {
        let w = table_row(words, hidden, ids_[t].into(), ("word_embedding", t))?;
        let at = position_ids.map_or((t % seq.max(1)) as i64, |(p, len)| p[t % len].into());
        let p = table_row(positions, hidden, at, ("position_embedding", t))?;
        for ((o, &w), &p) in row.iter_mut().zip(w).zip(p) {
            *o = w + p;
        }
        if let Some((segment_ids, segment)) = segments {
            let s = table_row(
                segment,
                hidden,
                segment_ids[t].into(),
                ("segment_embedding", t),
            )?;
            for (o, &s) in row.iter_mut().zip(s) {
                *o += s;
            }
        }
    }
    let mut out = ctx.alloc(DType::F32, [batch, seq, hidden])?;
    let rows = kn::NormRows {
        x: sum.as_slice::<f32>()?,
        rows: tokens,
        n: hidden,
        epsilon: e.epsilon,
    };
    let affine = kn::Affine {
        scale: gamma,
        bias: Some(beta),
    };
    kn::layer_norm(rows, affine, out.as_mut_slice::<f32>()?, None, ctx.pool)
        .map_err(OpError::from)?;
    let mut outputs: Outputs = smallvec![out];
    if n_outputs > 1 {
        let mut mask_index = ctx.alloc(DType::I32, [batch])?;
        let counts = mask_index.as_mut_slice::<i32>()?;
        match opt_input(inputs, 7) {
            Some(m) => {
                let mask = ids(m, "mask", tokens)?;
                for (c, row) in counts.iter_mut().zip(mask.chunks(seq.max(1))) {
                    *c = row.iter().filter(|&&v| v == 1).count() as i32;
                }
            }
            None => counts.fill(0),
        }
        outputs.push(mask_index);
    }
    if n_outputs > 2 {
        outputs.push(sum);
    } else {
        ctx.arena.release(sum);
    }
    Ok(outputs)
}

/// A float32 input, or an error naming it.
fn f32s<'a>(t: &'a Tensor, what: &str) -> Result<&'a [f32], OpError> {
    if t.dtype() != DType::F32 {
        return Err(OpError::DType {
            dtype: t.dtype(),
            detail: format!(" for {what}: the native Attention runs on float32"),
        });
    }
    Ok(t.as_slice::<f32>()?)
}

/// Which keys `mask_index` hides from which queries (`batch`, `seq` queries, as many keys).
enum Mask<'a> {
    None,
    /// Right padding: sequence `b` has `len[b]` keys.
    Lengths(&'a [i32]),
    /// Left padding: keys `start[b]..end[b]` (`ends` then `starts`, `batch` each).
    Spans(&'a [i32]),
    /// A raw 0/1 mask per sequence and key, shared by its queries.
    Keys(&'a [i32]),
    /// A raw 0/1 mask per sequence, query and key.
    Pairs(&'a [i32]),
}

impl Mask<'_> {
    fn read(t: Option<&Tensor>, batch: usize, seq: usize) -> Result<Mask<'_>, OpError> {
        let Some(t) = t else {
            return Ok(Mask::None);
        };
        if t.dtype() != DType::I32 {
            return Err(OpError::DType {
                dtype: t.dtype(),
                detail: " for mask_index: Attention takes int32".into(),
            });
        }
        let v = t.as_slice::<i32>()?;
        Ok(match t.dims() {
            [n] if *n == batch => Mask::Lengths(v),
            [n] if *n == 2 * batch => Mask::Spans(v),
            [b, n] if *b == batch && *n == seq => Mask::Keys(v),
            [b, s, n] if *b == batch && *s == seq && *n == seq => Mask::Pairs(v),
            dims => {
                return Err(OpError::shape(format!(
                    "mask_index has shape {dims:?}; the native Attention takes ({batch}), \
                     ({}), ({batch}, {seq}) or ({batch}, {seq}, {seq}) for {batch} sequences of \
                     {seq}",
                    2 * batch
                )));
            }
        })
    }

    /// Whether query `i` of sequence `b` may not see key `j`.
    fn hides(&self, b: usize, i: usize, j: usize, seq: usize) -> bool {
        let j32 = j as i64;
        match self {
            Mask::None => false,
            Mask::Lengths(len) => j32 >= i64::from(len[b]),
            Mask::Spans(v) => j32 >= i64::from(v[b]) || j32 < i64::from(v[v.len() / 2 + b]),
            Mask::Keys(m) => m[b * seq + j] == 0,
            Mask::Pairs(m) => m[(b * seq + i) * seq + j] == 0,
        }
    }
}

/// com.microsoft::Attention (float32, no past): `input · weights + bias` as one product,
/// then for each sequence and head `softmax(q·kᵀ · scale + attention_bias + mask) · v` with
/// both products on the f32 matmul kernels. The mask adds `mask_filter_value` (not -inf) as
/// onnxruntime does, so a query that sees no key averages them all as it does there.
fn attention(
    a: &Attention,
    inputs: &[Option<&Tensor>],
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let (x, w) = (input(inputs, 0)?, input(inputs, 1)?);
    let [batch, seq, hidden_in] = *x.dims() else {
        return Err(OpError::shape(format!(
            "input has shape {:?}; expected (batch, sequence, hidden)",
            x.dims()
        )));
    };
    let [w_in, width] = *w.dims() else {
        return Err(OpError::shape(format!(
            "weights have shape {:?}; expected (input hidden, Q + K + V widths)",
            w.dims()
        )));
    };
    if w_in != hidden_in {
        return Err(OpError::shape(format!(
            "weights have {w_in} rows for an input of hidden size {hidden_in}"
        )));
    }
    let heads = a.num_heads;
    let [qw, kw, vw] = a.qkv_sizes.unwrap_or([width / 3; 3]);
    if qw + kw + vw != width || qw % heads != 0 || vw % heads != 0 || qw == 0 {
        return Err(OpError::shape(format!(
            "weights of width {width} do not split into Q, K and V of {qw}, {kw} and {vw} \
             columns, each a multiple of num_heads = {heads}"
        )));
    }
    let (hd, vd) = (qw / heads, vw / heads);
    let (xs, ws) = (f32s(x, "input")?, f32s(w, "weights")?);
    let bias = opt_input(inputs, 2).map(|b| f32s(b, "bias")).transpose()?;
    if let Some(b) = bias
        && b.len() != width
    {
        return Err(OpError::shape(format!(
            "bias has {} values for {width} projected columns",
            b.len()
        )));
    }
    let mask = Mask::read(opt_input(inputs, 3), batch, seq)?;
    let extra = match opt_input(inputs, 5) {
        None => None,
        Some(t) => match *t.dims() {
            [bb, nb, s, n]
                if (bb == 1 || bb == batch) && (nb == 1 || nb == heads) && s == seq && n == seq =>
            {
                Some((f32s(t, "attention_bias")?, bb == batch, nb == heads))
            }
            _ => {
                return Err(OpError::shape(format!(
                    "attention_bias has shape {:?}; expected (1 or {batch}, 1 or {heads}, {seq}, \
                     {seq})",
                    t.dims()
                )));
            }
        },
    };
    let tokens = batch * seq;
    let mut qkv = ctx.alloc(DType::F32, [tokens, width])?;
    match ctx
        .lowered
        .tiles()
        .filter(|t| t.dims() == (hidden_in, width))
    {
        // The weights packed at load: the product, then the bias.
        Some(tiles) => {
            let dst = qkv.as_mut_slice::<f32>()?;
            km::matmul_packed_f32(xs, tokens, tiles, dst, ctx.pool)?;
            if let Some(bias) = bias {
                for row in dst.chunks_mut(width) {
                    for (o, &b) in row.iter_mut().zip(bias) {
                        *o += b;
                    }
                }
            }
        }
        None => {
            let bias = bias.map(|data| Bias {
                data,
                row_stride: 0,
                col_stride: 1,
            });
            let dims = (tokens, hidden_in, width);
            km::gemm(
                xs,
                ws,
                qkv.as_mut_slice::<f32>()?,
                dims,
                (1.0, 1.0),
                bias,
                ctx.pool,
            )
            .map_err(OpError::from)?;
        }
    }
    let scale = a.scale.unwrap_or(1.0 / (hd as f32).sqrt());
    let all = qkv.as_slice::<f32>()?;
    let at = |offset, size| Heads {
        data: all,
        row: width,
        offset,
        size,
        bias: None,
    };
    let dims = AttendDims {
        batch,
        seq_q: seq,
        seq_k: seq,
        heads,
    };
    let out = attend(
        [at(0, hd), at(qw, hd), at(qw + kw, vd)],
        dims,
        |b, h, i, row| {
            // Scaled, biased and masked as onnxruntime adds them, before the softmax.
            for (j, s) in row.iter_mut().enumerate() {
                *s *= scale;
                if let Some((ab, per_batch, per_head)) = extra {
                    let (bi, hi) = (if per_batch { b } else { 0 }, if per_head { h } else { 0 });
                    let plane = bi * if per_head { heads } else { 1 } + hi;
                    *s += ab[(plane * seq + i) * seq + j];
                }
                if mask.hides(b, i, j, seq) || (a.unidirectional && j > i) {
                    *s += a.mask_filter_value;
                }
            }
        },
        ctx,
    )?;
    ctx.arena.release(qkv);
    Ok(out)
}

/// `oxgen::EncoderAttention`: the self-attention an encoder export spells out, each score
/// scaled and masked with the graph's operations (`s / c` or `s · c`, then `+ mask`), the
/// products and softmax on the kernels the graph's `MatMul`s and `Softmax` run, so the same
/// bits.
fn encoder_attention(
    a: &EncoderAttention,
    inputs: &[Option<&Tensor>],
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let heads = a.heads;
    let shape = |k: usize, what: &str| -> Result<(&[f32], [usize; 3]), OpError> {
        let t = input(inputs, k)?;
        match *t.dims() {
            [b, s, w] if heads > 0 && w % heads == 0 => Ok((f32s(t, what)?, [b, s, w])),
            _ => Err(OpError::shape(format!(
                "{what} has shape {:?}; expected (batch, sequence, a multiple of {heads} heads)",
                t.dims()
            ))),
        }
    };
    let (q, [batch, seq_q, qw]) = shape(0, "q")?;
    let (k, [kb, seq_k, kw]) = shape(1, "k")?;
    let (v, [vb, vs, vw]) = shape(2, "v")?;
    if (kb, kw) != (batch, qw) || (vb, vs) != (batch, seq_k) {
        return Err(OpError::shape(format!(
            "q ({batch}, {seq_q}, {qw}), k ({kb}, {seq_k}, {kw}) and v ({vb}, {vs}, {vw}) do not \
             make one attention: k must match q's batch and width, v k's batch and length"
        )));
    }
    let dims = [batch, heads, seq_q, seq_k];
    let mask = match opt_input(inputs, 3) {
        None => None,
        Some(t) => Some((f32s(t, "mask")?, broadcast_strides(t.dims(), dims)?)),
    };
    let scale = match a.scale {
        ScoreScale::Divide(c) => Scale::Divide(c),
        ScoreScale::Multiply(c) => Scale::Multiply(c),
    };
    let bias = |k: usize, width: usize, what: &str| match opt_input(inputs, k) {
        None => Ok(None),
        Some(t) if t.dims() == [width] => f32s(t, what).map(Some),
        Some(t) => Err(OpError::shape(format!(
            "{what} has shape {:?}; expected [{width}], one value per column",
            t.dims()
        ))),
    };
    let biases = [
        bias(4, qw, "q's bias")?,
        bias(5, kw, "k's bias")?,
        bias(6, vw, "v's bias")?,
    ];
    let heads_of = |data, row: usize, bias| Heads {
        data,
        row,
        offset: 0,
        size: row / heads,
        bias,
    };
    let attend_dims = AttendDims {
        batch,
        seq_q,
        seq_k,
        heads,
    };
    attend(
        [
            heads_of(q, qw, biases[0]),
            heads_of(k, kw, biases[1]),
            heads_of(v, vw, biases[2]),
        ],
        attend_dims,
        |b, h, i, row| match mask {
            // A row of the mask as it is stored, or one value repeated.
            Some((m, [sb, sh, si, 1])) => {
                let m = &m[b * sb + h * sh + i * si..][..row.len()];
                ks::scale_and_add(row, scale, Some(m));
            }
            Some((m, [sb, sh, si, _])) => {
                ks::scale_and_add(row, scale, None);
                let m = m[b * sb + h * sh + i * si];
                row.iter_mut().for_each(|s| *s += m);
            }
            None => ks::scale_and_add(row, scale, None),
        },
        ctx,
    )
}

/// The strides that read a tensor of `dims` broadcast to `to` (ONNX's multidirectional
/// broadcasting, dimensions aligned at the end; a dimension of 1 repeats), or an error naming
/// both shapes.
fn broadcast_strides(dims: &[usize], to: [usize; 4]) -> Result<[usize; 4], OpError> {
    let fits = dims.len() <= 4
        && (dims.iter().rev().zip(to.iter().rev())).all(|(&d, &t)| d == 1 || d == t);
    if !fits {
        return Err(OpError::shape(format!(
            "the mask has shape {dims:?}, which does not broadcast to the scores' {to:?}"
        )));
    }
    let mut strides = [0; 4];
    let mut stride = 1;
    for (a, &d) in dims.iter().enumerate().rev() {
        let axis = 4 - dims.len() + a;
        strides[axis] = if d == 1 { 0 } else { stride };
        stride *= d;
    }
    Ok(strides)
}

/// Where one of Q, K and V sits in token rows: element `d` of head `h` of token `t` (of all
/// sequences' tokens) is `data[t * row + offset + h * size + d]`, plus `bias[h * size + d]`
/// where there is a bias.
#[derive(Clone, Copy)]
struct Heads<'a> {
    data: &'a [f32],
    row: usize,
    offset: usize,
    size: usize,
    bias: Option<&'a [f32]>,
}

impl Heads<'_> {
    /// Head `h` of token `t` into `out[d * stride]` for each `d`.
    fn gather(&self, (t, h): (usize, usize), out: &mut [f32], stride: usize) {
        let values = &self.data[t * self.row + self.offset + h * self.size..][..self.size];
        let bias = self.bias.map(|b| &b[h * self.size..][..self.size]);
        match (bias, stride) {
            // Contiguous: loops the compiler turns into vector code.
            (Some(b), 1) => (out[..self.size].iter_mut().zip(values).zip(b))
                .for_each(|((o, &v), &b)| *o = v + b),
            (None, 1) => out[..self.size].copy_from_slice(values),
            (Some(b), _) => (out.iter_mut().step_by(stride).zip(values).zip(b))
                .for_each(|((o, &v), &b)| *o = v + b),
            (None, _) => (out.iter_mut().step_by(stride).zip(values)).for_each(|(o, &v)| *o = v),
        }
    }
}

/// The sizes of an attention: sequences, queries and keys per sequence, heads.
#[derive(Clone, Copy)]
struct AttendDims {
    batch: usize,
    seq_q: usize,
    seq_k: usize,
    heads: usize,
}

/// For each sequence `b` and head `h`, `softmax(adjust(q·kᵀ)) · v` with both products on the
/// f32 matmul kernels, merged into `(batch, seq_q, heads · v size)`; `adjust(b, h, i, row)`
/// scales, biases and masks query `i`'s row of scores before its softmax. Heads run in
/// parallel, a share of the (sequence, head) pairs per task, each on the products of one
/// thread: q (seq_q, d), kᵀ (d, seq_k), v (seq_k, v size), the scores and their softmax in the
/// task's own scratch, its output rows head-major until they are merged.
fn attend(
    [q, k, v]: [Heads; 3],
    AttendDims {
        batch,
        seq_q,
        seq_k,
        heads,
    }: AttendDims,
    adjust: impl Fn(usize, usize, usize, &mut [f32]) + Sync,
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let (hd, vd) = (q.size, v.size);
    let pairs = batch * heads;
    let tasks = (ctx.pool.threads() * 2).clamp(1, pairs.max(1));
    let per_task = pairs.div_ceil(tasks);
    let scratch = seq_q * hd + hd * seq_k + seq_k * vd + seq_q * seq_k;
    let mut heads_out = ctx.alloc(DType::F32, [pairs * seq_q * vd])?;
    let mut work = ctx.alloc(DType::F32, [tasks * scratch])?;
    let failed = std::sync::atomic::AtomicBool::new(false);
    // Each task's products on its own thread (a pool without workers runs its tasks inline).
    let one = oxgen_kernels::ThreadPool::new(1);
    par::par_chunks2(
        ctx.pool,
        heads_out.as_mut_slice::<f32>()?,
        per_task * seq_q * vd,
        work.as_mut_slice::<f32>()?,
        scratch,
        |task, outs, buf| {
            let (qs, rest) = buf.split_at_mut(seq_q * hd);
            let (kt, rest) = rest.split_at_mut(hd * seq_k);
            let (vs, scores) = rest.split_at_mut(seq_k * vd);
            for (p, o) in outs.chunks_mut((seq_q * vd).max(1)).enumerate() {
                let (b, h) = ((task * per_task + p) / heads, (task * per_task + p) % heads);
                for t in 0..seq_q {
                    q.gather((b * seq_q + t, h), &mut qs[t * hd..][..hd], 1);
                }
                for t in 0..seq_k {
                    k.gather((b * seq_k + t, h), &mut kt[t..], seq_k);
                    v.gather((b * seq_k + t, h), &mut vs[t * vd..][..vd], 1);
                }
                if km::matmul(qs, kt, scores, seq_q, hd, seq_k, &one).is_err() {
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                    return;
                }
                // Each row scaled and masked, then its softmax in place.
                for (i, row) in scores.chunks_mut(seq_k.max(1)).enumerate() {
                    adjust(b, h, i, row);
                    ks::softmax_row_in_place(row);
                }
                if km::matmul(scores, vs, o, seq_q, seq_k, vd, &one).is_err() {
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                    return;
                }
            }
        },
    );
    if failed.into_inner() {
        return Err(OpError::shape(
            "an attention product's shapes did not match".to_string(),
        ));
    }
    let width = heads * vd;
    let mut out = ctx.alloc(DType::F32, [batch, seq_q, width])?;
    {
        let (src, dst) = (heads_out.as_slice::<f32>()?, out.as_mut_slice::<f32>()?);
        for (p, head) in src.chunks((seq_q * vd).max(1)).enumerate() {
            let (b, h) = (p / heads, p % heads);
            for (t, row) in head.chunks(vd.max(1)).enumerate() {
                dst[(b * seq_q + t) * width + h * vd..][..vd].copy_from_slice(row);
            }
        }
    }
    ctx.arena.release(heads_out);
    ctx.arena.release(work);
    Ok(out)
}
