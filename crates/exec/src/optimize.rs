//! Graph passes with the native kernels as their evaluator: [`optimize`] runs
//! `oxgen_graph::passes` (constant folding, RMSNorm / rotary / attention fusion) on a graph
//! before it is planned.
//!
//! The evaluator runs only the nodes a request depends on, one thread, one node at a time,
//! and frees each value after its last use, so checking a mask or computing a rotary table
//! costs at most a forward pass over a few tokens.

use std::collections::HashMap;

use oxgen_graph::passes::{self, Evaluator, Options, Report};
use oxgen_graph::{Graph, ValueId, ValueKind};
use oxgen_kernels::ThreadPool;
use oxgen_runtime::LmContract;
use oxgen_tensor::Tensor;

use crate::Arena;
use crate::lower::Lowered;
use crate::ops::{self, OpCtx};

/// Runs nodes on the native kernels for the passes.
pub struct NativeEvaluator {
    arena: Arena,
    pool: ThreadPool,
}

impl Default for NativeEvaluator {
    fn default() -> Self {
        NativeEvaluator {
            arena: Arena::default(),
            pool: ThreadPool::new(1),
        }
    }
}

impl Evaluator for NativeEvaluator {
    fn evaluate(
        &mut self,
        graph: &Graph,
        feeds: &[(ValueId, Tensor)],
        wanted: &[ValueId],
    ) -> Result<Vec<Tensor>, String> {
        let mut values: HashMap<ValueId, Tensor> = feeds.iter().cloned().collect();
        let mut producer = vec![None; graph.values.len()];
        for (i, node) in graph.nodes.iter().enumerate() {
            for v in node.outputs.iter().flatten() {
                producer[v.0] = Some(i);
            }
        }
        // The nodes `wanted` depends on, and how many of them read each value.
        let mut needed = vec![false; graph.nodes.len()];
        let mut stack: Vec<ValueId> = wanted.to_vec();
        let mut seen = vec![false; graph.values.len()];
        while let Some(v) = stack.pop() {
            if std::mem::replace(&mut seen[v.0], true)
                || values.contains_key(&v)
                || graph.initializers.contains_key(&v)
            {
                continue;
            }
            match producer[v.0] {
                Some(p) => {
                    needed[p] = true;
                    stack.extend(graph.nodes[p].inputs.iter().flatten());
                }
                None if graph.value(v).kind == ValueKind::Input => {
                    return Err(format!(
                        "graph input '{}' is not given",
                        graph.value(v).name
                    ));
                }
                None => return Err(format!("value '{}' has no producer", graph.value(v).name)),
            }
        }
        let mut reads = vec![0usize; graph.values.len()];
        for (i, node) in graph.nodes.iter().enumerate() {
            if needed[i] {
                for v in node.inputs.iter().flatten() {
                    reads[v.0] += 1;
                }
            }
        }
        for v in wanted {
            // Kept to the end.
            reads[v.0] += 1;
        }
        for (i, node) in graph.nodes.iter().enumerate() {
            if !needed[i] {
                continue;
            }
            let inputs: Vec<Option<&Tensor>> = node
                .inputs
                .iter()
                .map(|v| v.and_then(|id| graph.initializers.get(&id).or(values.get(&id))))
                .collect();
            let mut donated: Vec<Option<Tensor>> = vec![None; node.inputs.len()];
            let mut ctx = OpCtx {
                arena: &mut self.arena,
                pool: &self.pool,
                exact: true,
                wanted: u64::MAX,
                lowered: &Lowered::Plain,
                kv: None,
                weights: &mut ops::WeightUse {
                    counters: ops::OpCounters::default(),
                    residency: crate::residency::Residency::new(None, Default::default()),
                },
            };
            let produced = ops::run(
                &node.op,
                &inputs,
                &mut donated,
                node.outputs.len(),
                &mut ctx,
            )
            .map_err(|e| format!("{}: {e}", node.node_ref()))?;
            for v in node.inputs.iter().flatten() {
                reads[v.0] -= 1;
                if reads[v.0] == 0 {
                    values.remove(v);
                }
            }
            for (out, t) in node.outputs.iter().zip(produced) {
                if let Some(v) = out {
                    values.insert(*v, t);
                }
            }
        }
        wanted
            .iter()
            .map(|v| {
                values
                    .get(v)
                    .or_else(|| graph.initializers.get(v))
                    .cloned()
                    .ok_or_else(|| format!("value '{}' was not computed", graph.value(*v).name))
            })
            .collect()
    }
}

/// Optimizes `graph` for the native backend (see `oxgen_graph::passes`). `lm` is the
/// language-model contract when the graph is stepped as one; without it the attention
/// rewrite, which relies on how language models are fed, is skipped.
pub fn optimize(mut graph: Graph, lm: Option<&LmContract>, options: &Options) -> (Graph, Report) {
    let lm = lm.map(|c| passes::LmInputs {
        input_ids: (c.input_ids.clone(), c.input_ids_dtype),
        attention_mask: c.attention_mask.clone(),
        position_ids: c.position_ids.clone(),
        past_kv: (c.layers.iter())
            .map(|l| (l.past_key.clone(), l.past_value.clone()))
            .collect(),
        kv_dtype: c.kv_dtype,
        kv_heads: c.kv_heads,
        head_size: c.head_size,
    });
    let report = passes::optimize(
        &mut graph,
        &mut NativeEvaluator::default(),
        lm.as_ref(),
        options,
    );
    (graph, report)
}
