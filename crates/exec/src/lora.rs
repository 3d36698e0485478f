//! LoRA adapters on the native backend: an adapted projection's low-rank product
//! `(x A) B` is added to the projection's output right after its node runs, row by row, each
//! row under the adapter of the sequence it belongs to. The base weights (int4 or f32, packed
//! at load) are never touched, so one model serves any number of adapters and the base at
//! once; a row's sum depends on that row alone, so a sequence gets the same bits in any batch.
//!
//! Projections are found in the graph as it runs ([`Sites`]) by their weights' names, in
//! either spelling a package has: onnxruntime-genai's builder
//! (`model.layers.3.attn.qkv_proj.MatMul.weight_Q4`; Q, K and V packed into one product, an
//! adapter's `q_proj` then adds to its columns of it) and oxgen's import (`layers.3.q.qweight`).
//! A node that fused a projection away (gate and up with the SiLU between them) is not
//! made when the model may run adapters (`keep_projections` among the graph passes).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use oxgen_graph::{Graph, Op};
use oxgen_kernels::ThreadPool;
use oxgen_kernels::matmul::matmul;
use oxgen_runtime::{Adapter, RuntimeError};
use oxgen_tensor::{Dim, Tensor};

use crate::OpError;

/// Where a projection's output lands: the node, which of its outputs, which columns.
#[derive(Debug, Clone)]
struct Site {
    node: usize,
    output: usize,
    cols: Range<usize>,
    /// Input features.
    k: usize,
}

/// The projections of a graph an adapter may name, by Hugging Face module name.
pub struct Sites {
    by_module: HashMap<String, Site>,
    nodes: usize,
}

/// The Hugging Face modules a weight named `weight` computes, with their columns of the
/// node's `n` outputs (`kv`: the width of K and V, for a packed QKV projection).
fn projection_modules(weight: &str, n: usize, kv: usize) -> Vec<(String, Range<usize>)> {
    let one = |m: String| vec![(m, 0..n)];
    if weight.contains(".lora_") {
        return Vec::new();
    }
    if let Some((module, _)) = weight.split_once(".MatMul.weight") {
        // onnxruntime-genai's builder: `attn` for `self_attn`, and packed products.
        let module = module.replacen(".attn.", ".self_attn.", 1);
        if let Some(layer) = module.strip_suffix(".self_attn.qkv_proj") {
            let q = n.saturating_sub(2 * kv);
            return vec![
                (format!("{layer}.self_attn.q_proj"), 0..q),
                (format!("{layer}.self_attn.k_proj"), q..q + kv),
                (format!("{layer}.self_attn.v_proj"), q + kv..n),
            ];
        }
        if let Some(layer) = module.strip_suffix(".mlp.gate_up_proj") {
            return vec![
                (format!("{layer}.mlp.gate_proj"), 0..n / 2),
                (format!("{layer}.mlp.up_proj"), n / 2..n),
            ];
        }
        return one(module);
    }
    // oxgen's import: `layers.{l}.{q,k,v,o,gate,up,down}.{qweight,weight}`.
    let parts: Vec<&str> = weight.split('.').collect();
    let [layers, layer, proj, "qweight" | "weight"] = parts[..] else {
        return Vec::new();
    };
    let module = match proj {
        "q" | "k" | "v" | "o" => format!("self_attn.{proj}_proj"),
        "gate" | "up" | "down" => format!("mlp.{proj}_proj"),
        _ => return Vec::new(),
    };
    match (layers, layer.parse::<usize>()) {
        ("layers", Ok(l)) => one(format!("model.layers.{l}.{module}")),
        _ => Vec::new(),
    }
}

/// A fixed dimension of value info.
fn fixed(graph: &Graph, v: oxgen_graph::ValueId, axis: usize) -> Option<usize> {
    match graph.values[v.0].dims.as_deref()?.get(axis)? {
        Dim::Fixed(d) => Some(*d),
        _ => None,
    }
}

impl Sites {
    /// The projections of `graph` (optimized; `kv` the width of K and V), but `head` (the
    /// output head, whose rows a step may cut down).
    pub fn new(graph: &Graph, kv: usize, head: Option<usize>) -> Sites {
        let mut by_module = HashMap::new();
        for (node, n) in graph.nodes.iter().enumerate() {
            if Some(node) == head {
                continue;
            }
            // (output, weight input, k, n) per projection of the node.
            let parts: Vec<(usize, usize, usize, usize)> = match &n.op {
                Op::MatMulNBits(m) => vec![(0, 1, m.k, m.n)],
                Op::MatMulNBitsGroup(ms) => (ms.iter().enumerate())
                    .map(|(p, m)| (p, 1 + 3 * p, m.k, m.n))
                    .collect(),
                Op::MatMul => {
                    let w = n.inputs.get(1).copied().flatten();
                    match w.map(|w| (fixed(graph, w, 0), fixed(graph, w, 1), w)) {
                        Some((Some(k), Some(cols), w))
                            if graph.values[w.0].dims.as_ref().map(Vec::len) == Some(2) =>
                        {
                            vec![(0, 1, k, cols)]
                        }
                        _ => Vec::new(),
                    }
                }
                _ => Vec::new(),
            };
            for (output, w, k, cols) in parts {
                let Some(w) = n.inputs.get(w).copied().flatten() else {
                    continue;
                };
                for (module, cols) in projection_modules(&graph.values[w.0].name, cols, kv) {
                    let site = Site {
                        node,
                        output,
                        cols,
                        k,
                    };
                    by_module.insert(module, site);
                }
            }
        }
        Sites {
            by_module,
            nodes: graph.nodes.len(),
        }
    }

    /// `adapter`'s products placed on the projections they name; an error names the first
    /// module this graph lacks or whose shape differs.
    pub fn place(&self, adapter: Adapter) -> Result<Loaded, RuntimeError> {
        let err = |msg: String| RuntimeError::Backend(msg.into());
        let mut by_node: Vec<Vec<Delta>> = (0..self.nodes).map(|_| Vec::new()).collect();
        let (key, nbytes) = (adapter.key, adapter.nbytes());
        for m in adapter.modules {
            let Some(site) = self.by_module.get(&m.module) else {
                let mut known: Vec<&str> = self.by_module.keys().map(String::as_str).collect();
                known.sort_unstable();
                known.truncate(3);
                return Err(err(format!(
                    "the adapter's module '{}' names no projection of this model (it has {} \
                     projections, such as {}); the adapter was made for another model",
                    m.module,
                    self.by_module.len(),
                    known.join(", ")
                )));
            };
            let (rows, cols) = (site.k, site.cols.len());
            let shapes_fit = m.in_features == rows
                && m.out_features == cols
                && m.a.len() == rows * m.rank
                && m.b.len() == m.rank * cols;
            if !shapes_fit {
                return Err(err(format!(
                    "the adapter's module '{}' maps {} features to {} at rank {} ({} and {} \
                     values), but this model's projection maps {rows} to {cols}; the adapter \
                     was made for another base model",
                    m.module,
                    m.in_features,
                    m.out_features,
                    m.rank,
                    m.a.len(),
                    m.b.len()
                )));
            }
            by_node[site.node].push(Delta {
                output: site.output,
                cols: site.cols.clone(),
                rank: m.rank,
                a: m.a,
                b: m.b,
            });
        }
        Ok(Loaded {
            key,
            by_node,
            nbytes,
        })
    }
}

/// An adapter's products, by the node whose output they add to.
pub struct Loaded {
    /// The adapter's key (its sequences' prefix-cache chains start from it).
    pub key: u64,
    by_node: Vec<Vec<Delta>>,
    pub nbytes: usize,
}

impl Loaded {
    /// Its products on node `node`'s outputs.
    fn deltas(&self, node: usize) -> &[Delta] {
        self.by_node.get(node).map_or(&[], Vec::as_slice)
    }
}

/// One product: `(x A) B` added to columns `cols` of output `output`.
struct Delta {
    output: usize,
    cols: Range<usize>,
    rank: usize,
    a: Vec<f32>,
    b: Vec<f32>,
}

/// The adapters of a run's rows (rows under none are left out); reused run after run, with
/// the buffers the products are computed in.
#[derive(Default)]
pub struct LoraRows {
    spans: Vec<(Range<usize>, Arc<Loaded>)>,
    /// One adapter's rows of the input, gathered.
    x: Vec<f32>,
    /// `x A`, then `(x A) B`.
    t: Vec<f32>,
    d: Vec<f32>,
}

/// `buf` holding at least `len` floats, its first `len`.
fn room(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
}

impl LoraRows {
    pub fn clear(&mut self) {
        self.spans.clear();
    }

    /// Rows `rows` run under `adapter`.
    pub fn push(&mut self, rows: Range<usize>, adapter: &Arc<Loaded>) {
        self.spans.push((rows, adapter.clone()));
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Adds the products node `node`'s adapters hold for its outputs, `x` being its input:
    /// per adapter, its rows gathered, `d = (x A) B` computed by the kernels' f32 product
    /// (each row's sums in order, whatever the other rows: the same bits alone or batched),
    /// then added to the projection's output, as an `Add` after the product would.
    pub fn apply(
        &mut self,
        node: usize,
        x: Option<&Tensor>,
        outputs: &mut [Tensor],
        pool: &ThreadPool,
    ) -> Result<(), OpError> {
        for first in 0..self.spans.len() {
            let adapter = &self.spans[first].1;
            let seen = (self.spans[..first].iter()).any(|(_, a)| Arc::ptr_eq(a, adapter));
            if seen || adapter.deltas(node).is_empty() {
                continue;
            }
            let Some(x) = x else {
                return Err(OpError::value("a LoRA product's projection has no input"));
            };
            let xs = x.as_slice::<f32>().map_err(|_| {
                OpError::value(
                    "LoRA adapters need float32 activations; this projection reads another type",
                )
            })?;
            let k = x.dims().last().copied().unwrap_or(0);
            let have = xs.len() / k.max(1);
            // This adapter's rows, gathered in order.
            let mine = || (self.spans[first..].iter()).filter(|(_, a)| Arc::ptr_eq(a, adapter));
            let m: usize = mine().map(|(r, _)| r.len()).sum();
            if mine().any(|(r, _)| r.end > have) {
                return Err(OpError::shape(format!(
                    "a LoRA product's rows do not fit its projection's input {}",
                    x.shape()
                )));
            }
            let gathered = room(&mut self.x, m * k);
            let mut at = 0;
            for (rows, _) in mine() {
                let len = rows.len() * k;
                gathered[at..at + len].copy_from_slice(&xs[rows.start * k..rows.end * k]);
                at += len;
            }
            for d in adapter.deltas(node) {
                let y = outputs.get_mut(d.output).ok_or_else(|| {
                    OpError::value("a LoRA product's projection has no such output")
                })?;
                let n = y.dims().last().copied().unwrap_or(0);
                let width = d.cols.len();
                if d.a.len() != k * d.rank || d.cols.end > n || y.numel() != have * n {
                    return Err(OpError::shape(format!(
                        "a LoRA product of {} by {width} does not fit its projection's input {} \
                         and output {}",
                        d.a.len() / d.rank.max(1),
                        x.shape(),
                        y.shape()
                    )));
                }
                let t = room(&mut self.t, m * d.rank);
                matmul(&self.x[..m * k], &d.a, t, m, k, d.rank, pool)?;
                let out = room(&mut self.d, m * width);
                matmul(&self.t[..m * d.rank], &d.b, out, m, d.rank, width, pool)?;
                let ys = y.as_mut_slice::<f32>().map_err(|_| {
                    OpError::value("LoRA adapters need a float32 projection output")
                })?;
                let mut rows = mine().flat_map(|(r, _)| r.clone());
                for (row, added) in (&mut rows).zip(self.d.chunks_exact(width).take(m)) {
                    let start = row * n + d.cols.start;
                    for (y, v) in ys[start..start + width].iter_mut().zip(added) {
                        *y += v;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_name_their_modules_in_both_spellings() {
        let m = |w: &str| projection_modules(w, 96, 16);
        assert_eq!(
            m("model.layers.2.attn.qkv_proj.MatMul.weight_Q4"),
            vec![
                ("model.layers.2.self_attn.q_proj".to_string(), 0..64),
                ("model.layers.2.self_attn.k_proj".to_string(), 64..80),
                ("model.layers.2.self_attn.v_proj".to_string(), 80..96),
            ]
        );
        assert_eq!(
            m("model.layers.0.mlp.down_proj.MatMul.weight"),
            vec![("model.layers.0.mlp.down_proj".to_string(), 0..96)]
        );
        assert_eq!(
            m("layers.11.gate.qweight"),
            vec![("model.layers.11.mlp.gate_proj".to_string(), 0..96)]
        );
        assert_eq!(
            m("layers.3.o.weight"),
            vec![("model.layers.3.self_attn.o_proj".to_string(), 0..96)]
        );
        assert!(m("model.layers.0.attn.q_proj.lora_A.MatMul.weight").is_empty());
        assert!(m("embed.qweight").is_empty());
        assert!(m("lm_head.qweight").is_empty());
    }

    #[test]
    fn products_add_to_their_adapters_rows_and_columns_only() {
        // k = 2, rank 1, columns 1..3 of 3; rows 0 and 2 of 3 under the adapter.
        let mut by_node: Vec<Vec<Delta>> = vec![Vec::new(), Vec::new()];
        by_node[1].push(Delta {
            output: 0,
            cols: 1..3,
            rank: 1,
            a: vec![1.0, 2.0],
            b: vec![10.0, 100.0],
        });
        let adapter = Arc::new(Loaded {
            key: 7,
            by_node,
            nbytes: 16,
        });
        let mut rows = LoraRows::default();
        rows.push(0..1, &adapter);
        rows.push(2..3, &adapter);
        let x = Tensor::from_slice([1, 3, 2], &[1.0f32, 1.0, 5.0, 5.0, 3.0, 4.0]).unwrap();
        let mut y = [Tensor::from_slice([1, 3, 3], &[0.5f32; 9]).unwrap()];
        let pool = ThreadPool::new(1);
        rows.apply(0, Some(&x), &mut y, &pool).unwrap();
        assert_eq!(
            y[0].as_slice::<f32>().unwrap(),
            &[0.5; 9],
            "node 0 has no products"
        );
        rows.apply(1, Some(&x), &mut y, &pool).unwrap();
        // Row 0: x A = 1 + 2 = 3; row 2: 3 + 8 = 11.
        let want = [0.5, 30.5, 300.5, 0.5, 0.5, 0.5, 0.5, 110.5, 1100.5];
        assert_eq!(y[0].as_slice::<f32>().unwrap(), &want);
    }
}
