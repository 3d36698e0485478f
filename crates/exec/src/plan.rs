//! The execution plan: node order and value lifetimes, computed once per graph.

use oxgen_graph::{Graph, ValueKind};

/// A graph prepared for execution.
pub struct Plan {
    pub graph: Graph,
    /// For each value: the index of the last node that reads it, or `None` when it must
    /// outlive the run (graph outputs, initializers) or is never read.
    pub last_use: Vec<Option<usize>>,
    /// For each node: the input positions handed over to it to update in place (see
    /// [`oxgen_graph::Op::inplace_inputs`]).
    pub donations: Vec<Vec<usize>>,
    /// For each node: bit `k` set when output `k` is named and read (by a later node or as a
    /// graph output); an op may leave the others uncomputed (see [`crate::ops::OpCtx::wants`]).
    pub wanted: Vec<u64>,
}

impl Plan {
    pub fn new(graph: Graph) -> Plan {
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
        let donations = graph
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
        let wanted = graph
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
        Plan {
            graph,
            last_use,
            donations,
            wanted,
        }
    }
}
