//! Attention as exporters spell it → `com.microsoft::GroupQueryAttention`, which appends KV in
//! place.
//!
//! Hugging Face's eager attention with a KV cache exports per layer as
//!
//! ```text
//! q4 = Transpose(Reshape(q, [b, s, H, d]), [0,2,1,3])          (k4, v4 likewise, kv heads)
//! q4, k4 = RotaryEmbedding(q4), RotaryEmbedding(k4)             (after the rotary pass)
//! K = Concat(past_key, k4, axis=2) -> present.key    V = Concat(past_value, v4, axis=2)
//! Kx = Reshape(Expand(Unsqueeze(K, [2]), [b, kv, n_rep, t, d]), [b, H, t, d])   (repeat_kv;
//!      absent when H == kv)
//! P  = Softmax(Cast?(Add(Mul(MatMul(q4, Transpose(Kx, [0,1,3,2])), scale), mask)), axis=-1)
//! o  = Reshape(Transpose(MatMul(Cast?(P), Vx), [0,2,1,3]), [b, s, H*d])
//! ```
//!
//! which becomes one `GroupQueryAttention(q, k, v, past_key, past_value, seqlens_k,
//! total_sequence_length, cos?, sin?)` producing `o`, `present.key` and `present.value`; the
//! rotary embeddings fold into it (`do_rotary`) when both q and k went through the same caches.
//! `seqlens_k = ReduceSum(attention_mask) - 1` and `total_sequence_length =
//! Shape(attention_mask)[1]` are computed once, as onnxruntime-genai's builder does.
//!
//! What is checked: every edge and op above; head counts and sizes, repeat_kv's head order
//! and the head merge through the shape [`Facts`]; the KV `Concat` reading the contract's
//! past inputs of one layer; and the mask by running the model's own mask subgraph for three
//! (batch, cached, new) sizes with the all-ones `attention_mask` it is fed: a key allowed by
//! causality must get exactly 0, any other at most [`MASKED_MAX`]. Nothing else may read the
//! concatenated KV once the block is gone (it becomes the in-place buffer).

use std::collections::{BTreeSet, HashMap, HashSet};

use oxgen_tensor::{DType, Tensor};

use super::edit::{self, Edits, Index, input, output};
use super::shapes::{Facts, Sym, reshape_dims};
use super::{Evaluator, LmInputs};
use crate::ops::{BinaryOp, Cast, GroupQueryAttention, Op, Reduce, ReduceKind, RotaryKind};
use crate::{Graph, Node, ValueId, ValueKind};

/// Softmax subtracts the row maximum, so a key masked by at most this gets
/// `exp(score - 1e4 - max) <= exp(2|s| - 1e4)`, which underflows to exactly 0 in f32 (below
/// about -104) while scores stay under ~4_900 in magnitude: no weight, as in
/// `GroupQueryAttention`, which skips the key. Exporters use -1e4 (older transformers) or the
/// float32 minimum.
pub const MASKED_MAX: f32 = -1e4;

/// (batch, cached positions, new positions) the mask is checked at: a prompt, a chunk after
/// a cache in a batch of two, and a decode step.
const PROBES: [(usize, usize, usize); 3] = [(1, 0, 5), (2, 3, 2), (1, 4, 1)];

/// How a 4-D `[batch, heads, seq, head]` tensor reaches the 3-D `[batch, seq, heads * head]`
/// layout `GroupQueryAttention` reads.
#[derive(Debug, Clone, Copy)]
enum Rows {
    /// The graph already holds it (the projection before the head split).
    Existing(ValueId),
    /// Needs `Reshape(Transpose(x4, [0,2,1,3]), [0, 0, -1])` inserted.
    Insert(ValueId),
}

#[derive(Debug, Clone)]
struct Candidate {
    softmax: usize,
    /// The head-merge `Reshape` (replaced by the GQA node) and its output.
    merge: usize,
    out: ValueId,
    q: Rows,
    k: Rows,
    v: Rows,
    past_key: ValueId,
    past_value: ValueId,
    /// The `Concat` nodes and their outputs (present key/value).
    concat_k: (usize, ValueId),
    concat_v: (usize, ValueId),
    rotary: Option<(ValueId, ValueId)>,
    mask: ValueId,
    scale: f32,
    heads: usize,
    kv_heads: usize,
}

/// The single reader of `v`, when it has exactly one and `v` is not a graph output.
fn sole_reader<'g>(graph: &'g Graph, index: &Index, v: ValueId) -> Option<(usize, &'g Node)> {
    index.sole_reader(v).map(|i| (i, &graph.nodes[i]))
}

fn is_perm(node: &Node, perm: &[i64]) -> bool {
    matches!(&node.op, Op::Transpose { perm: Some(p) } if p == perm)
}

fn known(s: Option<Sym>) -> Option<i64> {
    match s {
        Some(Sym::Known(v)) => Some(v),
        _ => None,
    }
}

struct Matcher<'a> {
    graph: &'a Graph,
    index: &'a Index,
    facts: &'a Facts,
}

impl Matcher<'_> {
    fn node(&self, v: ValueId) -> Option<(usize, &Node)> {
        self.index.node(self.graph, v)
    }

    /// repeat_kv rooted at `kx`: `(K, n_rep)`; `kx` itself with 1 when it is not repeated.
    fn repeated(&self, kx: ValueId) -> Option<(ValueId, i64)> {
        let f = self.facts;
        let Some((_, reshape)) = self
            .node(kx)
            .filter(|(_, n)| matches!(n.op, Op::Reshape { .. }))
        else {
            return Some((kx, 1));
        };
        let (_, expand) = self.node(input(reshape, 0)?)?;
        let (_, unsq) = self.node(input(expand, 0)?)?;
        if !matches!(expand.op, Op::Expand) {
            return None;
        }
        let axes = match &unsq.op {
            Op::Unsqueeze(s) => s.axes.clone().or_else(|| f.known_data(input(unsq, 1)?))?,
            _ => return None,
        };
        let k = input(unsq, 0)?;
        let kd = f.dims(k)?;
        let [k0, Sym::Known(kv), k2, Sym::Known(d)] = *kd else {
            return None;
        };
        let n_rep = known(f.dim(output(expand)?, 2))?;
        let expanded = [k0, Sym::Known(kv), Sym::Known(n_rep), k2, Sym::Known(d)];
        let merged = [k0, Sym::Known(kv * n_rep), k2, Sym::Known(d)];
        let ok = (axes == [2] || axes == [-3])
            && f.dims(output(unsq)?)
                == Some(&[k0, Sym::Known(kv), Sym::Known(1), k2, Sym::Known(d)][..])
            && f.dims(output(expand)?) == Some(&expanded[..])
            && f.dims(kx) == Some(&merged[..]);
        ok.then_some((k, n_rep))
    }

    /// `Concat(past, new, axis=2)` rooted at `v`: `(concat index, past, new)`.
    fn kv_concat(&self, v: ValueId, past: &HashSet<ValueId>) -> Option<(usize, ValueId, ValueId)> {
        let (i, n) = self.node(v)?;
        let Op::Concat { axis } = n.op else {
            return None;
        };
        let [Some(p), Some(new)] = n.inputs[..] else {
            return None;
        };
        ((axis == 2 || axis == -2) && past.contains(&p) && self.facts.rank(v) == Some(4))
            .then_some((i, p, new))
    }

    /// The 3-D rows of a 4-D `x4` with `heads` heads of `size`.
    fn rows(&self, x4: ValueId, heads: i64, size: i64) -> Option<Rows> {
        let f = self.facts;
        let d = f.dims(x4)?;
        if d.len() != 4 || d[1] != Sym::Known(heads) || d[3] != Sym::Known(size) {
            return None;
        }
        let existing = (|| {
            let (_, t) = self.node(x4).filter(|(_, n)| is_perm(n, &[0, 2, 1, 3]))?;
            let (_, r) = self
                .node(input(t, 0)?)
                .filter(|(_, n)| matches!(n.op, Op::Reshape { .. }))?;
            let x3 = input(r, 0)?;
            let d3 = f.dims(x3)?;
            let split = [
                d3.first().copied()?,
                d3.get(1).copied()?,
                Sym::Known(heads),
                Sym::Known(size),
            ];
            (d3.len() == 3
                && d3[2] == Sym::Known(heads * size)
                && f.dims(output(r)?) == Some(&split[..])
                && f.dtype(x3) == Some(DType::F32))
            .then_some(x3)
        })();
        Some(existing.map_or(Rows::Insert(x4), Rows::Existing))
    }

    /// `(x4, pos, cos, sin)` when `v` is a contrib RotaryEmbedding over the whole head.
    fn rotary(&self, v: ValueId) -> Option<(ValueId, ValueId, ValueId, ValueId)> {
        let (_, n) = self.node(v)?;
        let Op::Rotary(r) = &n.op else {
            return None;
        };
        let d = known(self.facts.dim(v, -1))?;
        let whole = r.rotary_embedding_dim == 0 || r.rotary_embedding_dim as i64 == d;
        (r.kind == RotaryKind::Contrib && !r.interleaved && whole).then_some((
            input(n, 0)?,
            input(n, 1)?,
            input(n, 2)?,
            input(n, 3)?,
        ))
    }

    /// Matches the block whose `Softmax` is node `i`.
    fn block(&self, i: usize, sm: &Node, past: &HashSet<ValueId>) -> Option<Candidate> {
        let f = self.facts;
        let Op::Softmax(s) = sm.op else {
            return None;
        };
        let mut scores = input(sm, 0)?;
        // `softmax(x, dtype=torch.float32)` may export a cast in front.
        if let Some((_, cast)) = self.node(scores)
            && matches!(
                &cast.op,
                Op::Cast(Cast {
                    to: Some(DType::F32),
                    ..
                })
            )
        {
            scores = input(cast, 0)?;
        }
        if s.log || s.hard || f.rank(scores) != Some(4) || !(s.axis == -1 || s.axis == 3) {
            return None;
        }
        // Softmax -> Cast(float32)? -> MatMul(P, Vx) -> Transpose -> Reshape.
        let mut probs = output(sm)?;
        let (_, mut reader) = sole_reader(self.graph, self.index, probs)?;
        if matches!(
            &reader.op,
            Op::Cast(Cast {
                to: Some(DType::F32),
                ..
            })
        ) {
            probs = output(reader)?;
            reader = sole_reader(self.graph, self.index, probs)?.1;
        }
        if !matches!(reader.op, Op::MatMul) || input(reader, 0) != Some(probs) {
            return None;
        }
        let vx = input(reader, 1)?;
        let (_, t) = sole_reader(self.graph, self.index, output(reader)?)?;
        let (merge, rs) = sole_reader(self.graph, self.index, output(t)?)?;
        if !is_perm(t, &[0, 2, 1, 3])
            || !matches!(rs.op, Op::Reshape { .. })
            || input(rs, 0) != output(t)
        {
            return None;
        }
        let out = output(rs)?;
        // Add(scale(MatMul(Q, Transpose(Kx))), mask), operands in either order.
        let (_, add) = self.node(scores)?;
        if !matches!(add.op, Op::Binary(BinaryOp::Add)) {
            return None;
        }
        let (a, b) = (input(add, 0)?, input(add, 1)?);
        let (scale, qk, mask) = [(a, b), (b, a)].into_iter().find_map(|(scaled, mask)| {
            let (_, n) = self.node(scaled)?;
            let (x, y) = (input(n, 0)?, input(n, 1)?);
            let (scale, qk) = match n.op {
                Op::Binary(BinaryOp::Mul) => edit::scalar_f64(self.graph, y)
                    .map(|c| (c, x))
                    .or_else(|| edit::scalar_f64(self.graph, x).map(|c| (c, y)))?,
                Op::Binary(BinaryOp::Div) => (1.0 / edit::scalar_f64(self.graph, y)?, x),
                _ => return None,
            };
            Some((scale as f32, qk, mask))
        })?;
        if !(scale.is_finite() && scale > 0.0) || f.dtype(scores) != Some(DType::F32) {
            return None;
        }
        let (_, mm) = self.node(qk)?;
        if !matches!(mm.op, Op::MatMul) {
            return None;
        }
        let q = input(mm, 0)?;
        let (_, kt) = self.node(input(mm, 1)?)?;
        if !is_perm(kt, &[0, 1, 3, 2]) {
            return None;
        }
        let (kc, n_rep_k) = self.repeated(input(kt, 0)?)?;
        let (vc, n_rep_v) = self.repeated(vx)?;
        let (concat_k, past_key, k_new) = self.kv_concat(kc, past)?;
        let (concat_v, past_value, v_new) = self.kv_concat(vc, past)?;
        let heads = known(f.dim(q, 1))?;
        let size = known(f.dim(q, 3))?;
        let kv_heads = known(f.dim(kc, 1))?;
        if n_rep_k != n_rep_v
            || kv_heads * n_rep_k != heads
            || known(f.dim(kc, 3)) != Some(size)
            || known(f.dim(vc, 1)) != Some(kv_heads)
            || known(f.dim(vc, 3)) != Some(size)
        {
            return None;
        }
        // The merge must give [batch, seq, heads * size] of the query's batch and seq. Its
        // input is `[batch, seq, heads, size]` of the query's batch and seq: scores take the
        // query's rows, the mask (checked by running it) broadcasts into them without
        // changing their shape, and `·V` keeps them.
        let qd = f.dims(q)?;
        let merged_from = [qd[0], qd[2], Sym::Known(heads), Sym::Known(size)];
        let target = f.data(input(rs, 1)?)?;
        let Op::Reshape { allowzero } = rs.op else {
            return None;
        };
        let want = [Some(qd[0]), Some(qd[2]), Some(Sym::Known(heads * size))];
        if reshape_dims(Some(&merged_from), target, allowzero)? != want {
            return None;
        }
        let (q4, k4, rotary) = match (self.rotary(q), self.rotary(k_new)) {
            (Some((q4, qp, qc, qs)), Some((k4, kp, kc_, ks))) if (qp, qc, qs) == (kp, kc_, ks) => {
                // GroupQueryAttention reads [positions, size / 2] caches by absolute position.
                let [_, Sym::Known(half)] = *f.dims(qc)? else {
                    return None;
                };
                if half * 2 != size {
                    return None;
                }
                (q4, k4, Some((qc, qs)))
            }
            (None, None) => (q, k_new, None),
            _ => return None,
        };
        Some(Candidate {
            softmax: i,
            merge,
            out,
            q: self.rows(q4, heads, size)?,
            k: self.rows(k4, kv_heads, size)?,
            v: self.rows(v_new, kv_heads, size)?,
            past_key,
            past_value,
            concat_k: (concat_k, kc),
            concat_v: (concat_v, vc),
            rotary,
            mask,
            scale,
            heads: heads as usize,
            kv_heads: kv_heads as usize,
        })
    }
}

fn int_tensor(dtype: DType, dims: &[usize], values: impl Iterator<Item = i64>) -> Option<Tensor> {
    match dtype {
        DType::I32 => {
            let v: Option<Vec<i32>> = values.map(|x| i32::try_from(x).ok()).collect();
            Tensor::from_slice(dims, &v?).ok()
        }
        DType::I64 => Tensor::from_slice(dims, &values.collect::<Vec<_>>()).ok(),
        _ => None,
    }
}

/// The contract's inputs for one probe: ids 0, an all-ones mask, positions from `past` on,
/// zero KV of `past` positions.
fn probe_feeds(
    graph: &Graph,
    lm: &LmInputs,
    (b, past, s): (usize, usize, usize),
) -> Option<Vec<(ValueId, Tensor)>> {
    let mut feeds = vec![(
        graph.find(&lm.input_ids.0)?,
        int_tensor(lm.input_ids.1, &[b, s], std::iter::repeat_n(0, b * s))?,
    )];
    let (mask, dtype) = lm.attention_mask.as_ref()?;
    feeds.push((
        graph.find(mask)?,
        int_tensor(
            *dtype,
            &[b, past + s],
            std::iter::repeat_n(1, b * (past + s)),
        )?,
    ));
    if let Some((name, dtype)) = &lm.position_ids {
        let pos = (0..b).flat_map(|_| past as i64..(past + s) as i64);
        feeds.push((graph.find(name)?, int_tensor(*dtype, &[b, s], pos)?));
    }
    for (key, value) in &lm.past_kv {
        for name in [key, value] {
            let t = Tensor::zeros(lm.kv_dtype, [b, lm.kv_heads, past, lm.head_size]).ok()?;
            feeds.push((graph.find(name)?, t));
        }
    }
    Some(feeds)
}

/// Checks `mask` is the causal mask for `past` cached and `s` new positions (see the module
/// doc), broadcast over batch `b` and any heads.
fn check_causal(mask: &Tensor, (b, past, s): (usize, usize, usize)) -> Result<(), String> {
    let t = past + s;
    let d = mask.dims();
    if d.len() > 4 {
        return Err(format!("the mask has rank {}", d.len()));
    }
    let dims: Vec<usize> = std::iter::repeat_n(1, 4 - d.len())
        .chain(d.iter().copied())
        .collect();
    if !(dims[0] == 1 || dims[0] == b) || dims[2] != s || dims[3] != t {
        return Err(format!(
            "the mask has shape {:?} for batch {b}, {s} new and {t} total positions",
            mask.dims()
        ));
    }
    let values = mask
        .as_slice::<f32>()
        .map_err(|_| format!("the mask is {}, not float32", mask.dtype()))?;
    for (k, &v) in values.iter().enumerate() {
        let (i, j) = ((k / t) % s, k % t);
        let allowed = j <= past + i;
        let ok = if allowed { v == 0.0 } else { v <= MASKED_MAX };
        if !ok {
            return Err(format!(
                "with {past} cached positions, query {i} gets {v} for key {j}; a causal mask gives {}",
                if allowed {
                    "0".to_string()
                } else {
                    format!("at most {MASKED_MAX}")
                }
            ));
        }
    }
    Ok(())
}

/// Which candidates' masks are causal at every probe; reasons for the others.
fn verify_masks(
    graph: &Graph,
    eval: &mut dyn Evaluator,
    lm: &LmInputs,
    found: &[Candidate],
) -> Vec<Result<(), String>> {
    let masks: Vec<ValueId> = found
        .iter()
        .map(|c| c.mask)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut verdict: HashMap<ValueId, Result<(), String>> =
        masks.iter().map(|&m| (m, Ok(()))).collect();
    for probe in PROBES {
        let Some(feeds) = probe_feeds(graph, lm, probe) else {
            return found
                .iter()
                .map(|_| Err("the contract's inputs cannot be fed".to_string()))
                .collect();
        };
        match eval.evaluate(graph, &feeds, &masks) {
            Ok(values) => {
                for (m, t) in masks.iter().zip(values) {
                    let v = verdict.get_mut(m).expect("every mask has a verdict");
                    if v.is_ok() {
                        *v = check_causal(&t, probe);
                    }
                }
            }
            Err(e) => {
                return found
                    .iter()
                    .map(|_| Err(format!("running the mask subgraph: {e}")))
                    .collect();
            }
        }
    }
    found.iter().map(|c| verdict[&c.mask].clone()).collect()
}

/// Whether, with the candidates' blocks rewritten, some node other than an attention node
/// still reads a concatenated KV value (which becomes the in-place buffer): returns the
/// offending candidates.
fn kv_still_read(graph: &Graph, accepted: &[&Candidate]) -> Vec<usize> {
    let mut removed: HashSet<usize> = HashSet::new();
    let mut owner: HashMap<ValueId, usize> = HashMap::new();
    for (k, c) in accepted.iter().enumerate() {
        removed.extend([c.merge, c.concat_k.0, c.concat_v.0]);
        owner.insert(c.concat_k.1, k);
        owner.insert(c.concat_v.1, k);
    }
    // Producers after the rewrite: the blocks' outputs come from the new attention nodes,
    // whose inputs are the rows and past KV (what they read is live anyway).
    let mut producer: HashMap<ValueId, usize> = HashMap::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        if !removed.contains(&i) {
            for v in node.outputs.iter().flatten() {
                producer.insert(*v, i);
            }
        }
    }
    let mut gqa_inputs: Vec<ValueId> = Vec::new();
    for c in accepted {
        for rows in [c.q, c.k, c.v] {
            gqa_inputs.push(match rows {
                Rows::Existing(v) | Rows::Insert(v) => v,
            });
        }
    }
    let mut live = vec![false; graph.nodes.len()];
    let mut stack: Vec<ValueId> = graph.outputs.clone();
    stack.extend(gqa_inputs);
    let mut seen: HashSet<ValueId> = HashSet::new();
    while let Some(v) = stack.pop() {
        if !seen.insert(v) {
            continue;
        }
        if let Some(&p) = producer.get(&v)
            && !std::mem::replace(&mut live[p], true)
        {
            stack.extend(graph.nodes[p].inputs.iter().flatten());
        }
    }
    let mut bad = BTreeSet::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        if live[i] {
            for v in node.inputs.iter().flatten() {
                if let Some(&k) = owner.get(v) {
                    bad.insert(k);
                }
            }
        }
    }
    bad.into_iter().collect()
}

/// Replaces every attention block; returns how many. Reasons for leaving a matched block
/// alone go to `skipped`.
pub fn run(
    graph: &mut Graph,
    eval: &mut dyn Evaluator,
    lm: &LmInputs,
    skipped: &mut Vec<String>,
) -> usize {
    let Some(mask_input) = lm
        .attention_mask
        .as_ref()
        .and_then(|(name, _)| graph.find(name))
    else {
        return 0;
    };
    let layer_of: HashMap<(ValueId, ValueId), usize> = lm
        .past_kv
        .iter()
        .enumerate()
        .filter_map(|(l, (key, value))| Some(((graph.find(key)?, graph.find(value)?), l)))
        .collect();
    let past: HashSet<ValueId> = layer_of.keys().flat_map(|&(k, v)| [k, v]).collect();
    let index = Index::new(graph);
    let facts = Facts::infer(graph);
    let matcher = Matcher {
        graph,
        index: &index,
        facts: &facts,
    };
    let found: Vec<Candidate> = graph
        .nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| matcher.block(i, n, &past))
        .filter(|c| layer_of.contains_key(&(c.past_key, c.past_value)))
        .collect();
    if found.is_empty() {
        return 0;
    }
    let verdicts = verify_masks(graph, eval, lm, &found);
    let mut accepted: Vec<&Candidate> = Vec::new();
    for (c, verdict) in found.iter().zip(verdicts) {
        match verdict {
            Ok(()) => accepted.push(c),
            Err(why) => skipped.push(format!(
                "attention at node '{}': {why}",
                graph.nodes[c.softmax].name
            )),
        }
    }
    loop {
        let bad = kv_still_read(graph, &accepted);
        if bad.is_empty() {
            break;
        }
        for &k in bad.iter().rev() {
            let c = accepted.remove(k);
            skipped.push(format!(
                "attention at node '{}': another node reads the concatenated KV",
                graph.nodes[c.softmax].name
            ));
        }
    }
    if accepted.is_empty() {
        return 0;
    }
    let accepted: Vec<Candidate> = accepted.into_iter().cloned().collect();
    rewrite(graph, mask_input, &accepted)
}

/// Builds the shared `seqlens_k` / `total_sequence_length` nodes and one attention node per
/// candidate.
fn rewrite(graph: &mut Graph, mask: ValueId, blocks: &[Candidate]) -> usize {
    let mut edits = Edits::default();
    let mask_dtype = graph.values[mask.0].dtype.unwrap_or(DType::I64);
    let Some(one) = int_tensor(mask_dtype, &[], std::iter::once(1)) else {
        return 0;
    };
    let one = edit::add_initializer(graph, "attention.one", one);
    let value = |graph: &mut Graph, hint: &str, dtype| {
        edit::add_value(graph, hint, ValueKind::Node, Some(dtype), None)
    };
    let sum = value(graph, "attention.mask_sum", mask_dtype);
    let last = value(graph, "attention.seqlens_k_wide", mask_dtype);
    let seqlens = value(graph, "attention.seqlens_k", DType::I32);
    let total_wide = value(graph, "attention.total_sequence_length_wide", DType::I64);
    let total = value(graph, "attention.total_sequence_length", DType::I32);
    let cast = |to| {
        Op::Cast(Cast {
            to: Some(to),
            saturate: true,
        })
    };
    let shared = [
        (
            "ReduceSum",
            Op::Reduce(Reduce {
                kind: ReduceKind::Sum,
                axes: Some(vec![1]),
                keepdims: false,
                noop_with_empty_axes: false,
            }),
            vec![Some(mask)],
            sum,
        ),
        (
            "Sub",
            Op::Binary(BinaryOp::Sub),
            vec![Some(sum), Some(one)],
            last,
        ),
        ("Cast", cast(DType::I32), vec![Some(last)], seqlens),
        (
            "Shape",
            Op::Shape {
                start: 1,
                end: Some(2),
            },
            vec![Some(mask)],
            total_wide,
        ),
        ("Cast", cast(DType::I32), vec![Some(total_wide)], total),
    ];
    for (op_type, op, inputs, out) in shared {
        let name = format!(
            "oxgen::attention/{}",
            graph.values[out.0].name.trim_start_matches("oxgen::")
        );
        let node = edit::new_node(graph, name, ("", op_type), op, inputs, vec![Some(out)]);
        edits.add.push(node);
    }
    let merge_shape = edit::add_initializer(
        graph,
        "attention.merge_heads",
        Tensor::from_slice([3], &[0i64, 0, -1]).expect("3 values"),
    );
    for c in blocks {
        let base = graph.nodes[c.softmax].name.clone();
        let rows = |graph: &mut Graph, r: Rows, what: &str, edits: &mut Edits| -> ValueId {
            match r {
                Rows::Existing(v) => v,
                Rows::Insert(x4) => {
                    let t = value(graph, &format!("attention.{what}_transposed"), DType::F32);
                    let x3 = value(graph, &format!("attention.{what}_rows"), DType::F32);
                    let tn = edit::new_node(
                        graph,
                        format!("{base}/{what}_transpose"),
                        ("", "Transpose"),
                        Op::Transpose {
                            perm: Some(vec![0, 2, 1, 3]),
                        },
                        vec![Some(x4)],
                        vec![Some(t)],
                    );
                    let rn = edit::new_node(
                        graph,
                        format!("{base}/{what}_reshape"),
                        ("", "Reshape"),
                        Op::Reshape { allowzero: false },
                        vec![Some(t), Some(merge_shape)],
                        vec![Some(x3)],
                    );
                    edits.add.extend([tn, rn]);
                    x3
                }
            }
        };
        let q = rows(graph, c.q, "query", &mut edits);
        let k = rows(graph, c.k, "key", &mut edits);
        let v = rows(graph, c.v, "value", &mut edits);
        let (cos, sin) = c.rotary.map_or((None, None), |(a, b)| (Some(a), Some(b)));
        let op = Op::GroupQueryAttention(GroupQueryAttention {
            num_heads: c.heads,
            kv_num_heads: c.kv_heads,
            scale: Some(c.scale),
            softcap: 0.0,
            local_window_size: None,
            do_rotary: c.rotary.is_some(),
            rotary_interleaved: false,
            window_cache: false,
            sinks: false,
            long_rope_after: None,
        });
        let gqa = edit::new_node(
            graph,
            format!("{base}/group_query_attention"),
            ("com.microsoft", "GroupQueryAttention"),
            op,
            vec![
                Some(q),
                Some(k),
                Some(v),
                Some(c.past_key),
                Some(c.past_value),
                Some(seqlens),
                Some(total),
                cos,
                sin,
            ],
            vec![Some(c.out), Some(c.concat_k.1), Some(c.concat_v.1)],
        );
        edits.replace.push((c.merge, gqa));
        edits.remove.extend([c.concat_k.0, c.concat_v.0]);
    }
    if edit::apply(graph, edits) {
        blocks.len()
    } else {
        0
    }
}
