//! Cuts a decoder: its first layers and its output head (the draft of self-speculative
//! decoding, a layer-skip draft that shares the target's weights file), or everything up to
//! its final hidden states (an embedding model made of a decoder).
//!
//! Found by structure, not names. After the norm fusions every layer after the first begins
//! with a skip norm (the residual add and the input norm), each layer has one more in the
//! middle (after attention), and the final norm is one too: a graph of N layers has 2N skip
//! norms, in order `post_0, in_1, post_1, …, in_{N−1}, post_{N−1}, final` (the first layer's
//! input norm has no residual to add). Keeping L layers feeds the final norm what layer L's
//! input norm reads (the residual stream after layer L − 1), drops the KV inputs and outputs
//! of the later layers, and removes every node that no longer reaches an output.

use crate::ops::Op;
use crate::{Graph, Index, ValueId};

use super::{edit, norm};

/// Keeps the first `layers` of the graph's `total` layers; `dropped` names the KV inputs
/// and outputs of the layers after them. Fails, saying why, for a graph whose layers are not
/// laid out as the module doc describes.
pub fn keep_first_layers(
    graph: &mut Graph,
    layers: usize,
    total: usize,
    dropped: &[String],
) -> Result<(), String> {
    let refuse = |why: String| {
        Err(format!(
            "keeping {layers} of {total} layers (self-speculation): {why}"
        ))
    };
    if layers == 0 || layers >= total {
        return refuse(format!(
            "the draft needs at least 1 layer and fewer than the model's {total}"
        ));
    }
    norm::fuse_rms_norm(graph);
    norm::fuse_skip_norm(graph);
    let skip_norms: Vec<usize> = (graph.nodes.iter().enumerate())
        .filter(|(_, n)| matches!(n.op, Op::SkipNorm(_)))
        .map(|(i, _)| i)
        .collect();
    if skip_norms.len() != 2 * total {
        return refuse(format!(
            "the graph has {} skip norms where a decoder of {total} layers with a residual \
             norm before attention and MLP has {}; use a draft package instead",
            skip_norms.len(),
            2 * total
        ));
    }
    let layer_input = &graph.nodes[skip_norms[2 * layers - 1]];
    let (a, b) = (layer_input.inputs[0], layer_input.inputs[1]);
    let last = skip_norms[skip_norms.len() - 1];
    let fin = &mut graph.nodes[last];
    fin.inputs[0] = a;
    fin.inputs[1] = b;
    let is_dropped: Vec<bool> = (graph.values.iter())
        .map(|v| dropped.contains(&v.name))
        .collect();
    graph.outputs.retain(|v| !is_dropped[v.0]);
    graph.inputs.retain(|v| !is_dropped[v.0]);
    edit::remove_dead(graph);
    // A node still reading a dropped input means the layers were not what the count said.
    let reads_dropped =
        (graph.nodes.iter()).find(|n| n.inputs.iter().flatten().any(|v| is_dropped[v.0]));
    if let Some(n) = reads_dropped {
        return refuse(format!(
            "node '{}' of a dropped layer still feeds the output",
            n.name
        ));
    }
    Ok(())
}

/// The name [`keep_hidden_states`] gives the graph's one output.
pub const HIDDEN_STATES: &str = "hidden_states";

/// Makes the decoder's final hidden states (what its output head reads: the final norm's
/// output) the graph's one output, named [`HIDDEN_STATES`], and removes the head and
/// whatever only fed the other outputs; KV inputs stay (a run feeds them empty). A graph
/// that already puts out `hidden_states` (onnxruntime-genai's builder with
/// `include_hidden_states`) keeps just that. The head is found from `logits` back through
/// casts, reshapes and element-wise ops with a constant operand (a bias, a final softcap) to
/// the first product. Fails, naming the op met, for another layout.
pub fn keep_hidden_states(graph: &mut Graph, logits: &str) -> Result<(), String> {
    let named = |graph: &Graph, name: &str| {
        (graph.outputs.iter().copied()).find(|v| graph.value(*v).name == name)
    };
    let hidden = match named(graph, HIDDEN_STATES) {
        Some(v) => v,
        None => {
            let start = named(graph, logits).ok_or_else(|| {
                format!("the graph has neither a '{HIDDEN_STATES}' nor a '{logits}' output")
            })?;
            let hidden = head_input(graph, start)?;
            graph.values[hidden.0].name = HIDDEN_STATES.to_string();
            hidden
        }
    };
    graph.outputs = vec![hidden];
    edit::remove_dead(graph);
    Ok(())
}

/// The value the output head producing `v` reads.
fn head_input(graph: &Graph, mut v: ValueId) -> Result<ValueId, String> {
    let index = Index::new(graph);
    let is_constant = |v: &Option<ValueId>| v.is_some_and(|v| edit::constant(graph, v).is_some());
    loop {
        let Some((_, node)) = index.node(graph, v) else {
            return Err(format!(
                "'{}' is not computed by an output head (it is an input or a constant)",
                graph.value(v).name
            ));
        };
        let first = node.inputs.first().copied().flatten();
        v = match node.op_type.as_str() {
            "MatMul"
            | "MatMulNBits"
            | "Gemm"
            | "MatMulInteger"
            | "MatMulIntegerToFloat"
            | "MatMulNBitsGroup" => {
                return first.ok_or_else(|| format!("node '{}' has no input", node.name));
            }
            "Cast" | "Reshape" | "Identity" | "Squeeze" | "Unsqueeze" | "Flatten" | "Tanh" => first,
            "Add" | "Mul" | "Div" | "Sub" => match node.inputs.as_slice() {
                [a, b] if is_constant(b) => *a,
                [a, b] if is_constant(a) => *b,
                _ => None,
            },
            _ => None,
        }
        .ok_or_else(|| {
            format!(
                "the output head's node '{}' ({}) is not a product, a cast, a reshape or an \
                 element-wise op with a constant; export the model with hidden_states as an \
                 output",
                node.name, node.op_type
            )
        })?;
    }
}
