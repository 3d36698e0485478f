//! Who produces and who reads each value of a graph, and the analyses a backend runs on
//! that: which node computes an output row by row, how a language model's KV cache can be
//! laid out, whether a control-flow node decides from a step's inputs. The passes edit with
//! the same [`Index`].

use crate::ops::Op;
use crate::{Graph, Node, ValueId};

/// Producers and readers of every value, for one state of the graph (rebuild it after an
/// edit).
pub struct Index {
    /// The node producing each value (`None`: an input, an initializer or unused).
    pub producer: Vec<Option<usize>>,
    /// Node indices reading each value (a node reading a value twice appears twice).
    pub consumers: Vec<Vec<usize>>,
    /// Whether each value is a graph output.
    pub is_output: Vec<bool>,
}

impl Index {
    pub fn new(graph: &Graph) -> Index {
        let n = graph.values.len();
        let mut producer = vec![None; n];
        let mut consumers = vec![Vec::new(); n];
        for (i, node) in graph.nodes.iter().enumerate() {
            for out in node.outputs.iter().flatten() {
                producer[out.0] = Some(i);
            }
            for v in node.inputs.iter().flatten() {
                consumers[v.0].push(i);
            }
        }
        let mut is_output = vec![false; n];
        for v in &graph.outputs {
            is_output[v.0] = true;
        }
        Index {
            producer,
            consumers,
            is_output,
        }
    }

    /// The node producing `v`, with its index.
    pub fn node<'g>(&self, graph: &'g Graph, v: ValueId) -> Option<(usize, &'g Node)> {
        self.producer[v.0].map(|i| (i, &graph.nodes[i]))
    }

    /// How many times nodes read `v` (a node reading it twice counts twice).
    pub fn readers(&self, v: ValueId) -> usize {
        self.consumers[v.0].len()
    }

    /// Whether `v` is read only by node `reader` (once) and is not a graph output.
    pub fn only_read_by(&self, v: ValueId, reader: usize) -> bool {
        !self.is_output[v.0] && self.consumers[v.0] == [reader]
    }

    /// The one node reading `v` (once), when `v` is not a graph output.
    pub fn sole_reader(&self, v: ValueId) -> Option<usize> {
        match self.consumers[v.0].as_slice() {
            [i] if !self.is_output[v.0] => Some(*i),
            _ => None,
        }
    }

    /// The node computing graph output `output` row by row: a row-wise product
    /// (`MatMulNBits`, or `MatMul` by a 2-D initializer), alone or followed by element-wise
    /// steps that keep rows apart (unary ops, binary ops with a one-value initializer:
    /// Gemma's final-logit softcap `tanh(x / c) * c`), each step's input read by nothing
    /// else. Each output row then depends on its input row alone, so the steps can run on
    /// the rows the product made (a prompt step wants the logits of its last token only).
    pub fn row_wise_producer(&self, graph: &Graph, output: usize) -> Option<usize> {
        let scalar = |v: Option<ValueId>| {
            v.and_then(|v| graph.initializers.get(&v))
                .is_some_and(|t| t.numel() == 1)
        };
        let mut id = *graph.outputs.get(output)?;
        loop {
            let (i, node) = self.node(graph, id)?;
            let input = |k: usize| node.inputs.get(k).copied().flatten();
            let next = match &node.op {
                Op::MatMulNBits(_) => return Some(i),
                Op::MatMul => {
                    let b = input(1).and_then(|b| graph.initializers.get(&b));
                    return b.is_some_and(|t| t.rank() == 2).then_some(i);
                }
                Op::Unary(_) => input(0)?,
                Op::Binary(_) => match (scalar(input(0)), scalar(input(1))) {
                    (false, true) => input(0)?,
                    (true, false) => input(1)?,
                    _ => return None,
                },
                _ => return None,
            };
            self.sole_reader(next)?;
            id = next;
        }
    }

    /// How a language model's KV cache can be kept, given each layer's past key and value
    /// inputs by name (see [`KvLayout`]).
    pub fn kv_layout(&self, graph: &Graph, past: &[[&str; 2]]) -> KvLayout {
        let ids: Option<Vec<[ValueId; 2]>> = (past.iter())
            .map(|[k, v]| Some([graph.find(k)?, graph.find(v)?]))
            .collect();
        let Some(ids) = ids else {
            return KvLayout::Grown;
        };
        // Every past input read, and only by attention nodes that update a max-length
        // buffer in place.
        let shared = ids.iter().flatten().all(|&id| {
            let readers = &self.consumers[id.0];
            !readers.is_empty()
                && (readers.iter())
                    .all(|&i| matches!(graph.nodes[i].op, Op::GroupQueryAttention(_)))
        });
        if !shared {
            return KvLayout::Grown;
        }
        // Paged when each layer's pair is read by one attention node alone, as its inputs
        // 3 and 4, and no node reads two layers.
        let mut layer_of_node = vec![None; graph.nodes.len()];
        for (l, &[k, v]) in ids.iter().enumerate() {
            let mut readers = self.consumers[k.0].iter().chain(&self.consumers[v.0]);
            let Some(&i) = readers.next() else {
                return KvLayout::SharedBuffers;
            };
            let node = &graph.nodes[i];
            let reads_both =
                node.inputs.get(3) == Some(&Some(k)) && node.inputs.get(4) == Some(&Some(v));
            if readers.any(|&j| j != i)
                || self.readers(k) != 1
                || self.readers(v) != 1
                || !reads_both
                || layer_of_node[i].is_some()
            {
                return KvLayout::SharedBuffers;
            }
            layer_of_node[i] = Some(l);
        }
        KvLayout::Paged { layer_of_node }
    }
}

/// How a language model's KV cache can be kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvLayout {
    /// Every layer's past key and value are read by one `GroupQueryAttention` node alone:
    /// the cache can live in a block pool the node reads through block tables (`Some(l)`:
    /// the node of layer `l`).
    Paged { layer_of_node: Vec<Option<usize>> },
    /// Only `GroupQueryAttention` nodes read the pasts, but not one per layer: context-sized
    /// buffers updated in place.
    SharedBuffers,
    /// Something else reads them (`Concat(past, new)`): each step's present outputs are the
    /// next step's pasts, grown by its tokens.
    Grown,
}

impl KvLayout {
    /// Whether the cache is updated in place (paged or context-sized buffers).
    pub fn in_place(&self) -> bool {
        !matches!(self, KvLayout::Grown)
    }
}

/// A control-flow node that decides from the graph's inputs (an `If` on the mask's
/// length, a loop counted by a sequence length), directly or through nodes computed from
/// them. A batched step feeds one mask and one set of ids for every sequence, so such a
/// decision would be one for all of them.
pub fn decides_from_inputs(graph: &Graph) -> Option<&Node> {
    let mut from_inputs = vec![false; graph.values.len()];
    for v in &graph.inputs {
        from_inputs[v.0] = true;
    }
    for node in &graph.nodes {
        let reads = |k: usize| {
            node.inputs
                .get(k)
                .copied()
                .flatten()
                .is_some_and(|v| from_inputs[v.0])
        };
        // If's cond, Loop's trip count and cond, and whatever a Scan scans.
        let decides = match node.op {
            Op::If(_) => reads(0),
            Op::Loop(_) => reads(0) || reads(1),
            Op::Scan(_) => (0..node.inputs.len()).any(reads),
            _ => false,
        };
        if decides {
            return Some(node);
        }
        if node.inputs.iter().flatten().any(|v| from_inputs[v.0]) {
            for out in node.outputs.iter().flatten() {
                from_inputs[out.0] = true;
            }
        }
    }
    None
}
