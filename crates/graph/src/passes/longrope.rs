//! LongRoPE (Phi-3.5-mini, Phi-4-mini): the per-step `If` that picks the short or the long
//! cos/sin caches becomes a per-sequence choice inside `GroupQueryAttention`.
//!
//! onnxruntime-genai's builder writes
//!
//! ```text
//! attention_mask -> Shape -> Gather(1) -> Greater(original_max_position_embeddings) -> If
//!     then: Constant(long cos), Constant(long sin)     else: Constant(short cos), ...
//! If -> (cos_cache, sin_cache) -> every GroupQueryAttention (do_rotary) inputs 7 and 8
//! ```
//!
//! so one graph run rotates every token with one pair, chosen from the mask's length: the
//! sequence's length after the step when it runs alone. A batch runs as one graph and feeds no
//! per-sequence mask, so the `If` would switch every sequence at once when one crosses the
//! threshold. The pass instead gives each attention node both pairs
//! ([`GroupQueryAttention::long_rope_after`], the long pair at [`LONG_ROPE_INPUTS`]) and the
//! kernels choose per sequence from its own length after the step, which is what
//! onnxruntime-genai chooses for that sequence alone. (As there, the choice follows the step:
//! a prompt cut in chunks across the threshold rotates its first chunks with the short caches,
//! the whole prompt at once with the long ones.)
//!
//! Matched by structure only; anything else (another condition, a branch that computes, a
//! consumer other than a rotating `GroupQueryAttention`) leaves the `If` to run as it is.

use oxgen_tensor::Tensor;

use super::edit::{self, Index, input, ints};
use crate::ops::{LONG_ROPE_INPUTS, Op};
use crate::{Graph, ValueId, ValueKind};

/// Whether a branch is two `Constant` nodes (or initializers) and nothing else: a cos and a
/// sin cache.
fn two_constants(branch: &Graph) -> bool {
    branch.inputs.is_empty()
        && branch.captures.is_empty()
        && branch.outputs.len() == 2
        && branch.nodes.iter().all(|n| matches!(n.op, Op::Constant(_)))
}

/// A [`two_constants`] branch's outputs, moved out of it.
fn take_constants(mut branch: Graph) -> Option<[Tensor; 2]> {
    let mut take = |out: ValueId| {
        if let Some(t) = branch.initializers.remove(&out) {
            return Some(t);
        }
        let node = branch
            .nodes
            .iter_mut()
            .find(|n| n.outputs.first() == Some(&Some(out)))?;
        match std::mem::replace(&mut node.op, Op::Identity) {
            Op::Constant(t) => Some(t),
            _ => None,
        }
    };
    let [cos, sin] = [branch.outputs[0], branch.outputs[1]];
    Some([take(cos)?, take(sin)?])
}

/// `Greater(Gather(Shape(mask), 1), C)` with `mask` the graph input `mask_name`: `C`.
fn mask_length_above(
    graph: &Graph,
    index: &Index,
    cond: ValueId,
    mask_name: &str,
) -> Option<usize> {
    let (_, greater) = index.node(graph, cond)?;
    let Op::Binary(b) = &greater.op else {
        return None;
    };
    if !matches!(b, crate::ops::BinaryOp::Greater) {
        return None;
    }
    let threshold = match ints(graph, input(greater, 1)?)?[..] {
        [c] => usize::try_from(c).ok()?,
        _ => return None,
    };
    let (_, gather) = index.node(graph, input(greater, 0)?)?;
    let Op::Gather(g) = &gather.op else {
        return None;
    };
    if g.axis != 0 || ints(graph, input(gather, 1)?)?[..] != [1] {
        return None;
    }
    let (_, shape) = index.node(graph, input(gather, 0)?)?;
    let Op::Shape {
        start: 0,
        end: None,
    } = shape.op
    else {
        return None;
    };
    let mask = input(shape, 0)?;
    let v = graph.value(mask);
    (v.kind == ValueKind::Input && v.name == mask_name).then_some(threshold)
}

/// Why the `If` at node `i` is not LongRoPE's cache choice, or what it is: the threshold and
/// the cos and sin values it gives.
fn recognize(
    graph: &Graph,
    index: &Index,
    i: usize,
    mask_name: &str,
) -> Result<(usize, ValueId, ValueId), &'static str> {
    let node = &graph.nodes[i];
    let Op::If(branches) = &node.op else {
        unreachable!("called for If nodes")
    };
    let after = input(node, 0)
        .and_then(|c| mask_length_above(graph, index, c, mask_name))
        .ok_or("its condition is not the attention mask's length above a constant")?;
    if !two_constants(&branches.then_branch.graph) || !two_constants(&branches.else_branch.graph) {
        return Err("its branches are not a cos and a sin constant each");
    }
    let [Some(cos), Some(sin)] = node.outputs[..] else {
        return Err("it does not give exactly a cos and a sin cache");
    };
    let rotating = |n: &usize| {
        let node = &graph.nodes[*n];
        matches!(&node.op, Op::GroupQueryAttention(g) if g.do_rotary && g.long_rope_after.is_none())
            && input(node, 7) == Some(cos)
            && input(node, 8) == Some(sin)
    };
    let readers = [cos, sin].map(|v| &index.consumers[v.0]);
    if readers
        .iter()
        .any(|r| r.is_empty() || !r.iter().all(rotating))
        || index.is_output[cos.0]
        || index.is_output[sin.0]
    {
        return Err("its caches feed something other than rotating GroupQueryAttention nodes");
    }
    Ok((after, cos, sin))
}

/// Rewrites every LongRoPE `If` it recognizes; returns how many. `mask_name` is the graph
/// input holding the attention mask.
pub fn run(graph: &mut Graph, mask_name: &str, skipped: &mut Vec<String>) -> usize {
    let ifs: Vec<usize> = (graph.nodes.iter().enumerate())
        .filter(|(_, n)| matches!(n.op, Op::If(_)))
        .map(|(i, _)| i)
        .collect();
    let index = Index::new(graph);
    let mut done = 0;
    for i in ifs {
        let (after, cos, sin) = match recognize(graph, &index, i, mask_name) {
            Ok(found) => found,
            Err(reason) => {
                let name = &graph.nodes[i].name;
                skipped.push(format!("longrope: If '{name}' left as it is: {reason}"));
                continue;
            }
        };
        // The branches' tables move into initializers; the `If` is then dead.
        let Op::If(branches) = std::mem::replace(&mut graph.nodes[i].op, Op::Identity) else {
            unreachable!("recognized as an If")
        };
        let (Some(long), Some(short)) = (
            take_constants(branches.then_branch.graph),
            take_constants(branches.else_branch.graph),
        ) else {
            unreachable!("two_constants checked both branches")
        };
        let [short, long] = [("short", short), ("long", long)].map(|(kind, [c, s])| {
            [
                edit::add_initializer(graph, &format!("longrope/{kind}_cos"), c),
                edit::add_initializer(graph, &format!("longrope/{kind}_sin"), s),
            ]
        });
        let readers = index.consumers[cos.0].iter().chain(&index.consumers[sin.0]);
        for &n in readers {
            let node = &mut graph.nodes[n];
            if let Op::GroupQueryAttention(g) = &mut node.op {
                g.long_rope_after = Some(after);
            }
            node.inputs[7] = Some(short[0]);
            node.inputs[8] = Some(short[1]);
            if node.inputs.len() <= LONG_ROPE_INPUTS[1] {
                node.inputs.resize(LONG_ROPE_INPUTS[1] + 1, None);
            }
            node.inputs[LONG_ROPE_INPUTS[0]] = Some(long[0]);
            node.inputs[LONG_ROPE_INPUTS[1]] = Some(long[1]);
        }
        done += 1;
    }
    if done > 0 {
        edit::remove_dead(graph);
    }
    done
}
