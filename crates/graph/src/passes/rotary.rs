//! Rotary embeddings as exporters spell them → `com.microsoft::RotaryEmbedding` over cos/sin
//! caches computed once.
//!
//! Hugging Face's `apply_rotary_pos_emb` exports as `Add(Mul(x, cos), Mul(rotate_half(x),
//! sin))`, with `rotate_half(x) = Concat(Neg(x[..., h/2:]), x[..., :h/2], axis=-1)` and
//! `cos`/`sin` computed every step from `position_ids` (an `inv_freq` `MatMul`, `Concat`
//! of the frequencies with themselves, `Cos`/`Sin`, scaling, casts). The pattern is matched
//! on `x` of shape `[batch, heads, sequence, head_size]` (heads before positions, as the
//! contrib op's 4-D form reads it).
//!
//! The caches come from the model's own `cos`/`sin` subgraph run on positions
//! `0..context_length` (whatever its frequencies, scaling or casts), and are accepted only when
//! (a) the subgraph depends on one integer graph input (the positions) and constants,
//! (b) each row repeats its first half in its second (the `rotate_half` convention), and
//! (c) running it on the positions in reverse order gives the same rows reversed, so row `p`
//! depends on position `p` alone. Row `p` of the cache is then bit for bit what the original
//! graph computes for position `p`.

use std::collections::HashMap;

use oxgen_tensor::{DType, Tensor};

use super::Evaluator;
use super::edit::{self, Edits, Index, input, output};
use super::shapes::{Facts, Sym, slice_range};
use crate::ops::{BinaryOp, Op, Rotary, RotaryKind, UnaryOp};
use crate::{Graph, Node, ValueId, ValueKind};

/// The single graph input `values` depend on (besides initializers), if there is one.
pub(crate) fn only_input(graph: &Graph, index: &Index, values: &[ValueId]) -> Option<ValueId> {
    let mut seen = vec![false; graph.values.len()];
    let mut stack: Vec<ValueId> = values.to_vec();
    let mut found = None;
    while let Some(v) = stack.pop() {
        if std::mem::replace(&mut seen[v.0], true) {
            continue;
        }
        match graph.values[v.0].kind {
            ValueKind::Input | ValueKind::Captured => {
                if found.replace(v).is_some_and(|f| f != v) {
                    return None;
                }
            }
            ValueKind::Initializer => {}
            ValueKind::Node => {
                let (_, node) = index.node(graph, v)?;
                stack.extend(node.inputs.iter().flatten());
            }
        }
    }
    found
}

/// The `(first, count)` a `Slice` node takes along the last axis of a tensor of `width`
/// there (step 1, one axis).
fn last_axis_slice(facts: &Facts, node: &Node, width: i64) -> Option<(i64, i64)> {
    let Op::Slice(s) = &node.op else {
        return None;
    };
    let x = input(node, 0)?;
    let rank = facts.rank(x)? as i64;
    let param = |k: usize| input(node, k).and_then(|v| facts.known_data(v));
    let (starts, ends, axes, steps) = match (&s.starts, &s.ends) {
        (Some(st), Some(en)) => (st.clone(), en.clone(), s.axes.clone(), None),
        _ => (
            param(1)?,
            param(2)?,
            input(node, 3).and_then(|_| param(3)),
            input(node, 4).and_then(|_| param(4)),
        ),
    };
    let axis = match axes.as_deref() {
        Some([a]) => *a,
        None if rank == 1 => 0,
        _ => return None,
    };
    let step = match steps.as_deref() {
        None | Some([1]) => 1,
        _ => return None,
    };
    if !(axis == -1 || axis == rank - 1) || starts.len() != 1 || ends.len() != 1 {
        return None;
    }
    slice_range(width, starts[0], ends[0], step)
}

/// `rotate_half(x)` rooted at `v`: returns `x`.
fn rotate_half(graph: &Graph, index: &Index, facts: &Facts, v: ValueId) -> Option<ValueId> {
    let (_, concat) = index.node(graph, v)?;
    let Op::Concat { axis } = concat.op else {
        return None;
    };
    let [Some(neg), Some(first)] = concat.inputs[..] else {
        return None;
    };
    let (_, neg_node) = index.node(graph, neg)?;
    if !matches!(neg_node.op, Op::Unary(UnaryOp::Neg)) {
        return None;
    }
    let (_, second) = index.node(graph, input(neg_node, 0)?)?;
    let (_, first) = index.node(graph, first)?;
    let x = input(first, 0)?;
    if input(second, 0) != Some(x) {
        return None;
    }
    let rank = facts.rank(x)?;
    let Some(Sym::Known(width)) = facts.dim(x, -1) else {
        return None;
    };
    let half = width / 2;
    let last = axis == -1 || axis == rank as i64 - 1;
    let ok = rank == 4
        && width % 2 == 0
        && last
        && last_axis_slice(facts, first, width) == Some((0, half))
        && last_axis_slice(facts, second, width) == Some((half, half));
    ok.then_some(x)
}

/// What a fused node reads besides `x`: positions, cos cache, sin cache.
type Fused = (ValueId, ValueId, ValueId);

/// A match: `Add` node index, the rotated `x`, and the cos/sin values.
struct Candidate {
    add: usize,
    x: ValueId,
    cos: ValueId,
    sin: ValueId,
}

fn match_at(
    graph: &Graph,
    index: &Index,
    facts: &Facts,
    i: usize,
    node: &Node,
) -> Option<Candidate> {
    if !matches!(node.op, Op::Binary(BinaryOp::Add)) {
        return None;
    }
    let products: Vec<&Node> = [input(node, 0)?, input(node, 1)?]
        .iter()
        .map(|&v| index.node(graph, v).map(|(_, n)| n))
        .collect::<Option<_>>()?;
    for (with_cos, with_sin) in [(products[0], products[1]), (products[1], products[0])] {
        let both = |n: &Node| -> Option<[(ValueId, ValueId); 2]> {
            if !matches!(n.op, Op::Binary(BinaryOp::Mul)) {
                return None;
            }
            let (a, b) = (input(n, 0)?, input(n, 1)?);
            Some([(a, b), (b, a)])
        };
        let (Some(cos_pairs), Some(sin_pairs)) = (both(with_cos), both(with_sin)) else {
            continue;
        };
        for (rh, sin) in sin_pairs {
            let Some(x) = rotate_half(graph, index, facts, rh) else {
                continue;
            };
            if let Some((_, cos)) = cos_pairs.into_iter().find(|&(a, _)| a == x) {
                return Some(Candidate {
                    add: i,
                    x,
                    cos,
                    sin,
                });
            }
        }
    }
    None
}

/// Positions `0..n` (or reversed) as a `[1, n]` tensor of `dtype`.
fn positions(dtype: DType, n: usize, reverse: bool) -> Option<Tensor> {
    let p: Vec<i64> = if reverse {
        (0..n as i64).rev().collect()
    } else {
        (0..n as i64).collect()
    };
    match dtype {
        DType::I64 => Tensor::from_slice([1, n], &p).ok(),
        DType::I32 => {
            let p: Option<Vec<i32>> = p.iter().map(|&v| i32::try_from(v).ok()).collect();
            Tensor::from_slice([1, n], &p?).ok()
        }
        _ => None,
    }
}

/// `[n, width]` rows of a cos/sin value evaluated on `n` positions: its shape must be
/// `[1, 1, n, width]` after left-padding with ones (positions on the sequence axis).
fn rows(t: &Tensor, n: usize, width: usize) -> Result<&[f32], String> {
    let dims = t.dims();
    let padded: Vec<usize> = std::iter::repeat_n(1, 4usize.saturating_sub(dims.len()))
        .chain(dims.iter().copied())
        .collect();
    if padded != [1, 1, n, width] {
        return Err(format!(
            "the cos/sin value has shape {:?} for {n} positions; expected [1, 1, {n}, {width}]",
            t.dims()
        ));
    }
    t.as_slice::<f32>()
        .map_err(|_| format!("the cos/sin value is {}, not float32", t.dtype()))
}

/// Runs the cos and sin subgraphs on every position and checks them (see the module doc);
/// returns the `[n, width / 2]` caches.
fn caches(
    graph: &Graph,
    eval: &mut dyn Evaluator,
    pos: ValueId,
    (cos, sin): (ValueId, ValueId),
    n: usize,
    width: usize,
) -> Result<(Tensor, Tensor), String> {
    let dtype = graph.values[pos.0].dtype.unwrap_or(DType::I64);
    let feed = |reverse| positions(dtype, n, reverse).ok_or("positions input is not int32/int64");
    let forward = eval.evaluate(graph, &[(pos, feed(false)?)], &[cos, sin])?;
    let backward = eval.evaluate(graph, &[(pos, feed(true)?)], &[cos, sin])?;
    let half = width / 2;
    let mut out = Vec::new();
    for (f, b) in forward.iter().zip(&backward) {
        let (f, b) = (rows(f, n, width)?, rows(b, n, width)?);
        let mut cache = Vec::with_capacity(n * half);
        for p in 0..n {
            let row = &f[p * width..(p + 1) * width];
            let back = &b[(n - 1 - p) * width..(n - p) * width];
            let bits = |s: &[f32]| s.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            if bits(&row[..half]) != bits(&row[half..]) {
                return Err(format!(
                    "row {p} does not repeat its first half (not the rotate_half layout)"
                ));
            }
            if bits(row) != bits(back) {
                return Err(format!("row {p} depends on more than position {p}"));
            }
            cache.extend_from_slice(&row[..half]);
        }
        out.push(Tensor::from_slice([n, half], &cache).map_err(|e| e.to_string())?);
    }
    let sin_cache = out.pop().expect("two values were evaluated");
    let cos_cache = out.pop().expect("two values were evaluated");
    Ok((cos_cache, sin_cache))
}

/// Replaces every rotary pattern; returns how many. Reasons for leaving a match alone go to
/// `skipped`.
pub fn run(
    graph: &mut Graph,
    eval: &mut dyn Evaluator,
    context_length: usize,
    skipped: &mut Vec<String>,
) -> usize {
    if context_length == 0 {
        return 0;
    }
    let index = Index::new(graph);
    let facts = Facts::infer(graph);
    let found: Vec<Candidate> = graph
        .nodes
        .iter()
        .enumerate()
        .filter_map(|(i, node)| match_at(graph, &index, &facts, i, node))
        .collect();
    // Caches by (cos, sin) value, and distinct caches by content: layers share one pair.
    let mut by_value: HashMap<(ValueId, ValueId), Option<Fused>> = HashMap::new();
    let mut tables: Vec<(Tensor, Tensor, ValueId, ValueId)> = Vec::new();
    let mut edits = Edits::default();
    for c in found {
        let node_name = graph.nodes[c.add].name.clone();
        let key = (c.cos, c.sin);
        if let std::collections::hash_map::Entry::Vacant(slot) = by_value.entry(key) {
            let width = match facts.dim(c.x, -1) {
                Some(Sym::Known(w)) => w as usize,
                _ => continue,
            };
            let made = match only_input(graph, &index, &[c.cos, c.sin]) {
                None => Err("cos/sin depend on more than one graph input".to_string()),
                Some(pos) => caches(graph, eval, pos, key, context_length, width).map(|t| (pos, t)),
            };
            let entry = match made {
                Ok((pos, (cos_t, sin_t))) => {
                    let same = tables.iter().find(|(a, b, ..)| {
                        a.as_bytes() == cos_t.as_bytes() && b.as_bytes() == sin_t.as_bytes()
                    });
                    let (cos_id, sin_id) = match same {
                        Some(&(_, _, a, b)) => (a, b),
                        None => {
                            let a = edit::add_initializer(graph, "rotary.cos_cache", cos_t.clone());
                            let b = edit::add_initializer(graph, "rotary.sin_cache", sin_t.clone());
                            tables.push((cos_t, sin_t, a, b));
                            (a, b)
                        }
                    };
                    Some((pos, cos_id, sin_id))
                }
                Err(why) => {
                    skipped.push(format!("rotary at node '{node_name}': {why}"));
                    None
                }
            };
            slot.insert(entry);
        }
        let Some(Some((pos, cos_id, sin_id))) = by_value.get(&key).copied() else {
            continue;
        };
        let add = &graph.nodes[c.add];
        let fused = edit::new_node(
            graph,
            format!("{node_name}/rotary"),
            ("com.microsoft", "RotaryEmbedding"),
            Op::Rotary(Rotary {
                kind: RotaryKind::Contrib,
                interleaved: false,
                rotary_embedding_dim: 0,
                num_heads: 0,
            }),
            vec![Some(c.x), Some(pos), Some(cos_id), Some(sin_id)],
            vec![output(add)],
        );
        edits.replace.push((c.add, fused));
    }
    let n = edits.replace.len();
    if edit::apply(graph, edits) { n } else { 0 }
}
