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

use super::edit::{self, Index, input, ints};
use crate::ops::{GroupQueryAttention, LONG_ROPE_INPUTS, Op};
use crate::{Graph, ValueId, ValueKind};

/// The outputs of a branch made only of `Constant` nodes, in order.
fn constant_outputs(branch: &Graph) -> Option<Vec<oxgen_tensor::Tensor>> {
    if !branch.inputs.is_empty() || !branch.captures.is_empty() {
        return None;
    }
    branch
        .outputs
        .iter()
        .map(|&out| {
            if let Some(t) = branch.initializers.get(&out) {
                return Some(t.clone());
            }
            branch.nodes.iter().find_map(|n| match &n.op {
                Op::Constant(t) if n.outputs.first() == Some(&Some(out)) => Some(t.clone()),
                _ => None,
            })
        })
        .collect()
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

/// Rewrites every LongRoPE `If` it recognizes; returns how many. `mask_name` is the graph
/// input holding the attention mask.
pub fn run(graph: &mut Graph, mask_name: &str, skipped: &mut Vec<String>) -> usize {
    let mut done = 0;
    loop {
        let index = Index::new(graph);
        let found = graph.nodes.iter().enumerate().find_map(|(i, node)| {
            let Op::If(branches) = &node.op else {
                return None;
            };
            Some((i, branches.clone(), node.inputs[0], node.outputs.clone()))
        });
        let Some((i, branches, cond, outputs)) = found else {
            break;
        };
        let why = |reason: &str| {
            format!(
                "longrope: If '{}' left as it is: {reason}",
                graph.nodes[i].name
            )
        };
        let reject = |skipped: &mut Vec<String>, reason: &str| skipped.push(why(reason));
        let Some(after) = cond.and_then(|c| mask_length_above(graph, &index, c, mask_name)) else {
            reject(
                skipped,
                "its condition is not the attention mask's length above a constant",
            );
            break;
        };
        let (Some(long), Some(short)) = (
            constant_outputs(&branches.then_branch.graph),
            constant_outputs(&branches.else_branch.graph),
        ) else {
            reject(skipped, "a branch computes more than constants");
            break;
        };
        let [Some(cos), Some(sin)] = outputs[..] else {
            reject(skipped, "it does not give exactly a cos and a sin cache");
            break;
        };
        if long.len() != 2 || short.len() != 2 {
            reject(skipped, "it does not give exactly a cos and a sin cache");
            break;
        }
        let mut readers: Vec<usize> = [cos, sin]
            .iter()
            .flat_map(|v| index.consumers[v.0].iter().copied())
            .collect();
        readers.sort_unstable();
        readers.dedup();
        let rotating = |n: usize| {
            let node = &graph.nodes[n];
            matches!(&node.op, Op::GroupQueryAttention(g) if g.do_rotary && g.long_rope_after.is_none())
                && input(node, 7) == Some(cos)
                && input(node, 8) == Some(sin)
        };
        if readers.is_empty()
            || index.is_output[cos.0]
            || index.is_output[sin.0]
            || !readers.iter().all(|&n| rotating(n))
        {
            reject(
                skipped,
                "its caches feed something other than rotating GroupQueryAttention nodes",
            );
            break;
        }
        let [short_cos, short_sin] = [&short[0], &short[1]].map(|t| t.clone());
        let [long_cos, long_sin] = [&long[0], &long[1]].map(|t| t.clone());
        let short_ids = [
            edit::add_initializer(graph, "longrope/short_cos", short_cos),
            edit::add_initializer(graph, "longrope/short_sin", short_sin),
        ];
        let long_ids = [
            edit::add_initializer(graph, "longrope/long_cos", long_cos),
            edit::add_initializer(graph, "longrope/long_sin", long_sin),
        ];
        for n in readers {
            let node = &mut graph.nodes[n];
            if let Op::GroupQueryAttention(GroupQueryAttention {
                long_rope_after, ..
            }) = &mut node.op
            {
                *long_rope_after = Some(after);
            }
            node.inputs[7] = Some(short_ids[0]);
            node.inputs[8] = Some(short_ids[1]);
            if node.inputs.len() <= LONG_ROPE_INPUTS[1] {
                node.inputs.resize(LONG_ROPE_INPUTS[1] + 1, None);
            }
            node.inputs[LONG_ROPE_INPUTS[0]] = Some(long_ids[0]);
            node.inputs[LONG_ROPE_INPUTS[1]] = Some(long_ids[1]);
        }
        edit::remove_dead(graph);
        done += 1;
    }
    done
}
