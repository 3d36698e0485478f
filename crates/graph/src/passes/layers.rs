//! Keeps a decoder's first layers and its output head: the draft of self-speculative
//! decoding (a layer-skip draft that shares the target's weights file).
//!
//! Found by structure, not names. After the norm fusions every layer after the first begins
//! with a skip norm (the residual add and the input norm), each layer has one more in the
//! middle (after attention), and the final norm is one too: a graph of N layers has 2N skip
//! norms, in order `post_0, in_1, post_1, …, in_{N−1}, post_{N−1}, final` (the first layer's
//! input norm has no residual to add). Keeping L layers feeds the final norm what layer L's
//! input norm reads (the residual stream after layer L − 1), drops the KV inputs and outputs
//! of the later layers, and removes every node that no longer reaches an output.

use crate::Graph;
use crate::ops::Op;

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
