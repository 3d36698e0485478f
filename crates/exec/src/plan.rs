//! The execution plan: `Graph → Plan → Session`. Planning lowers every node
//! ([`crate::lower`]) and works out, once per graph, what running them in order needs:
//! value lifetimes, in-place updates, which outputs are read, the weight bytes each op
//! streams.

use std::sync::Arc;

use oxgen_graph::{Graph, ValueKind};
use oxgen_kernels::ThreadPool;

use crate::lower::{self, Lowered};

/// A graph prepared for execution.
pub struct Plan {
    pub graph: Graph,
    /// For each value: the index of the last node that reads it, or `None` when it must
    /// outlive the run (graph outputs, initializers) or is never read.
    pub last_use: Vec<Option<usize>>,
    /// For each node, in order: the op it runs as.
    pub ops: Vec<PlannedOp>,
}

/// One node as it runs.
pub struct PlannedOp {
    /// What it runs with beyond its inputs.
    pub lowered: Lowered,
    /// The input positions handed over to it to update in place (see
    /// [`oxgen_graph::Op::inplace_inputs`]).
    pub donations: Vec<usize>,
    /// Bit `k` set when output `k` is named and read (by a later node or as a graph output);
    /// the op may leave the others uncomputed (see [`crate::ops::OpCtx::wants`]).
    pub wanted: u64,
    /// Bytes of weight matrix a run reads from the graph's initializers (0 when its weights
    /// were repacked: the packed copy counts what its kernel streams).
    pub matrix_bytes: u64,
}

impl Plan {
    /// Lowers `graph`'s nodes (subgraph sessions on `pool`; `exact` as
    /// [`crate::ExecOptions::exact`]) and plans their run.
    pub fn new(mut graph: Graph, pool: &Arc<ThreadPool>, exact: bool) -> Plan {
        let lowered = lower::lower(&mut graph, pool, exact);
        let matrix_bytes = lower::unpacked_matrix_bytes(&graph, &lowered);
        let mut last_use = vec![None; graph.values.len()];
        for (i, node) in graph.nodes.iter().enumerate() {
            for v in node.inputs.iter().flatten() {
                last_use[v.0] = Some(i);
            }
        }
        for (id, value) in graph.values.iter().enumerate() {
            if value.kind == ValueKind::Initializer {
                last_use[id] = None;
            }
        }
        for out in &graph.outputs {
            last_use[out.0] = None;
        }
        let donations: Vec<Vec<usize>> = graph
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                node.op
                    .inplace_inputs()
                    .iter()
                    .copied()
                    .filter(|&k| {
                        let Some(Some(v)) = node.inputs.get(k) else {
                            return false;
                        };
                        last_use[v.0] == Some(i)
                            && node.inputs.iter().filter(|w| **w == Some(*v)).count() == 1
                    })
                    .collect()
            })
            .collect();
        let wanted: Vec<u64> = graph
            .nodes
            .iter()
            .map(|node| {
                node.outputs
                    .iter()
                    .enumerate()
                    .fold(0u64, |mask, (k, out)| match out {
                        Some(id)
                            if k < 64
                                && (last_use[id.0].is_some() || graph.outputs.contains(id)) =>
                        {
                            mask | 1 << k
                        }
                        _ => mask,
                    })
            })
            .collect();
        let ops = (lowered
            .into_iter()
            .zip(donations)
            .zip(wanted)
            .zip(matrix_bytes))
        .map(|(((lowered, donations), wanted), matrix_bytes)| PlannedOp {
            lowered,
            donations,
            wanted,
            matrix_bytes,
        })
        .collect();
        Plan {
            graph,
            last_use,
            ops,
        }
    }

    /// The first op after op `i` that reads weights (packed, or matrices from the graph):
    /// where the weights to stream in next are, while op `i` runs.
    pub fn next_weighted(&self, i: usize) -> Option<usize> {
        (i + 1..self.ops.len()).find(|&j| {
            let op = &self.ops[j];
            op.matrix_bytes > 0 || op.lowered.nbits().is_some() || op.lowered.tiles().is_some()
        })
    }
}
