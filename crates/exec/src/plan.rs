//! The execution plan: node order and value lifetimes, computed once per graph.

use oxgen_graph::{Graph, ValueKind};

/// A graph prepared for execution.
pub struct Plan {
    pub graph: Graph,
    /// For each value: the index of the last node that reads it, or `None` when it must
    /// outlive the run (graph outputs, inputs, initializers) or is never read.
    pub last_use: Vec<Option<usize>>,
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
            if value.kind != ValueKind::Node {
                last_use[id] = None;
            }
        }
        for out in &graph.outputs {
            last_use[out.0] = None;
        }
        Plan { graph, last_use }
    }
}
