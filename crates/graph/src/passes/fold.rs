//! Constant folding: nodes whose value does not depend on the graph inputs become
//! initializers.
//!
//! Two sources of constants: `Constant` nodes and nodes whose inputs are all initializers
//! (run once through the [`Evaluator`]), and small integer tensors whose every element the
//! [`Facts`] know — shape arithmetic over fixed dimensions, such as `Shape(x)[3] / 2` when
//! `x`'s last dimension is the head size, which folds although the sequence length is not
//! known. A fold never grows the model much: a folded output may take at most
//! [`FOLD_MAX_BYTES`] or the bytes of its inputs (so a `Transpose` of a weight folds, a
//! `ConstantOfShape` of a context-sized mask does not).

use oxgen_tensor::{DType, Tensor};

use super::Evaluator;
use super::edit::{self, Edits};
use super::shapes::{Facts, all_known};
use crate::ops::Op;
use crate::{Graph, ValueId};

/// Bytes a folded output may take beyond those of its inputs.
pub const FOLD_MAX_BYTES: usize = 64 << 10;

/// Folds until nothing changes; returns how many nodes were replaced by initializers.
pub fn run(graph: &mut Graph, eval: &mut dyn Evaluator) -> usize {
    let mut folded = 0;
    // Each round folds whole chains (nodes are visited in order); a second round catches
    // shape facts that only the first round's constants revealed.
    for _ in 0..4 {
        let n = fold_known(graph) + fold_evaluated(graph, eval);
        if n == 0 {
            break;
        }
        folded += n;
    }
    edit::remove_dead(graph);
    folded
}

/// A tensor of `dtype` from known integer elements.
fn int_tensor(dtype: DType, dims: &[usize], data: &[i64]) -> Option<Tensor> {
    match dtype {
        DType::I64 => Tensor::from_slice(dims, data).ok(),
        DType::I32 => {
            let v: Option<Vec<i32>> = data.iter().map(|&x| i32::try_from(x).ok()).collect();
            Tensor::from_slice(dims, &v?).ok()
        }
        _ => None,
    }
}

/// `Constant` nodes, and nodes whose integer outputs the facts know entirely.
fn fold_known(graph: &mut Graph) -> usize {
    let facts = Facts::infer(graph);
    let mut edits = Edits::default();
    let mut constants: Vec<(ValueId, Tensor)> = Vec::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        let outs: Vec<ValueId> = node.outputs.iter().flatten().copied().collect();
        if outs.is_empty() {
            continue;
        }
        if let Op::Constant(t) = &node.op {
            constants.push((outs[0], t.clone()));
            edits.remove.insert(i);
            continue;
        }
        let known: Option<Vec<(ValueId, Tensor)>> = outs
            .iter()
            .map(|&v| {
                let dims: Vec<usize> = all_known(facts.dims(v)?)?
                    .into_iter()
                    .map(|d| usize::try_from(d).ok())
                    .collect::<Option<_>>()?;
                let data = facts.known_data(v)?;
                Some((v, int_tensor(facts.dtype(v)?, &dims, &data)?))
            })
            .collect();
        if let Some(known) = known {
            constants.extend(known);
            edits.remove.insert(i);
        }
    }
    let n = edits.remove.len();
    for (v, t) in constants {
        edit::set_constant(graph, v, t);
    }
    if !edit::apply(graph, edits) {
        return 0;
    }
    n
}

/// Nodes whose inputs are all initializers, run once.
fn fold_evaluated(graph: &mut Graph, eval: &mut dyn Evaluator) -> usize {
    let facts = Facts::infer(graph);
    let mut edits = Edits::default();
    for i in 0..graph.nodes.len() {
        let node = &graph.nodes[i];
        let inputs: Vec<ValueId> = node.inputs.iter().flatten().copied().collect();
        let outs: Vec<ValueId> = node.outputs.iter().flatten().copied().collect();
        if inputs.is_empty()
            || outs.is_empty()
            || !inputs.iter().all(|v| graph.initializers.contains_key(v))
        {
            continue;
        }
        let input_bytes: usize = inputs.iter().map(|v| graph.initializers[v].nbytes()).sum();
        let out_bytes = outs.iter().try_fold(0usize, |acc, &v| {
            let dims = all_known(facts.dims(v)?)?;
            let numel = dims
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(usize::try_from(d).ok()?))?;
            let bits = facts.dtype(v)?.bits();
            acc.checked_add(numel.checked_mul(bits)? / 8)
        });
        match out_bytes {
            Some(b) if b <= FOLD_MAX_BYTES.max(input_bytes) => {}
            _ => continue,
        }
        // A node the backend cannot run stays; running it later fails with its own error.
        let Ok(values) = eval.evaluate(graph, &[], &outs) else {
            continue;
        };
        for (v, t) in outs.into_iter().zip(values) {
            edit::set_constant(graph, v, t);
        }
        edits.remove.insert(i);
    }
    let n = edits.remove.len();
    if !edit::apply(graph, edits) {
        return 0;
    }
    n
}
