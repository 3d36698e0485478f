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
use std::sync::{Arc, Mutex};

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
    /// The type a projection reads where it is not float32 (adapters add f32 products).
    other_activations: Option<oxgen_tensor::DType>,
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
        let mut other_activations = None;
        for (node, n) in graph.nodes.iter().enumerate() {
            if Some(node) == head {
                continue;
            }
            let reads = n.inputs.first().copied().flatten();
            let dtype = reads.and_then(|x| graph.values[x.0].dtype);
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
                if let Some(d) = dtype.filter(|&d| d != oxgen_tensor::DType::F32) {
                    other_activations = Some(d);
                }
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
            other_activations,
        }
    }

    /// `adapter`'s products placed on the projections they name; an error names the first
    /// module this graph lacks or whose shape differs.
    pub fn place(&self, adapter: Adapter) -> Result<Loaded, RuntimeError> {
        let err = |msg: String| RuntimeError::Backend(msg.into());
        if let Some(d) = self.other_activations {
            return Err(err(format!(
                "LoRA adapters need float32 activations; this model's projections read {d} \
                 (import it at int4, int8 or fp32)"
            )));
        }
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
pub struct LoraRows {
    spans: Vec<(Range<usize>, Arc<Loaded>)>,
    /// Each adapter's rows of the input, gathered one adapter after another.
    x: Vec<f32>,
    /// A node's products: the span that starts the adapter's rows, which of its products,
    /// where its rows lie in `x`.
    jobs: Vec<Job>,
    /// Per product: `x A`, then `(x A) B`.
    scratch: Vec<Mutex<(Vec<f32>, Vec<f32>)>>,
    /// Runs a product inside a task of the node's pool (one thread: no nested regions).
    inline: ThreadPool,
}

#[derive(Clone)]
struct Job {
    first: usize,
    delta: usize,
    rows: Range<usize>,
}

impl Default for LoraRows {
    fn default() -> Self {
        LoraRows {
            spans: Vec::new(),
            x: Vec::new(),
            jobs: Vec::new(),
            scratch: Vec::new(),
            inline: ThreadPool::new(1),
        }
    }
}

/// Rows a product computes at a time when it runs alone (a prompt's): its buffers stay this
/// many rows of the projection's width.
const ROW_TILE: usize = 256;

/// `buf` holding at least `len` floats, its first `len`.
fn room(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl LoraRows {
    pub fn clear(&mut self) {
        self.spans.clear();
    }

    /// Rows `rows` run under `adapter`. Spans are kept grouped by adapter (after the last
    /// span of the same one), so each node finds an adapter's rows as one run of spans.
    pub fn push(&mut self, rows: Range<usize>, adapter: &Arc<Loaded>) {
        let same = |(_, a): &(Range<usize>, Arc<Loaded>)| Arc::ptr_eq(a, adapter);
        let at = self
            .spans
            .iter()
            .rposition(same)
            .map_or(self.spans.len(), |i| i + 1);
        self.spans.insert(at, (rows, adapter.clone()));
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The spans under the adapter of span `first`, which starts its run.
    fn group(&self, first: usize) -> impl Iterator<Item = &Range<usize>> {
        let adapter = &self.spans[first].1;
        (self.spans[first..].iter())
            .take_while(move |(_, a)| Arc::ptr_eq(a, adapter))
            .map(|(r, _)| r)
    }

    /// Adds the products node `node`'s adapters hold for its outputs, `x` being its input:
    /// each adapter's rows gathered, `d = (x A) B` computed by the kernels' f32 product
    /// (each row's sums in order, whatever the other rows: the same bits alone or batched),
    /// then added to the projection's output, as an `Add` after the product would. Several
    /// products (adapters, or a grouped node's parts) run on the pool's threads at once.
    pub fn apply(
        &mut self,
        node: usize,
        x: Option<&Tensor>,
        outputs: &mut [Tensor],
        pool: &ThreadPool,
    ) -> Result<(), OpError> {
        self.jobs.clear();
        let mut gathered = 0;
        for first in 0..self.spans.len() {
            let adapter = &self.spans[first].1;
            let starts_run = first == 0 || !Arc::ptr_eq(&self.spans[first - 1].1, adapter);
            if !starts_run || adapter.deltas(node).is_empty() {
                continue;
            }
            let m: usize = self.group(first).map(|r| r.len()).sum();
            for delta in 0..adapter.deltas(node).len() {
                let rows = gathered..gathered + m;
                self.jobs.push(Job { first, delta, rows });
            }
            gathered += m;
        }
        if self.jobs.is_empty() {
            return Ok(());
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
        for job in &self.jobs {
            let d = &self.spans[job.first].1.deltas(node)[job.delta];
            let y = outputs
                .get(d.output)
                .ok_or_else(|| OpError::value("a LoRA product's projection has no such output"))?;
            let n = y.dims().last().copied().unwrap_or(0);
            let rows_fit = self.group(job.first).all(|r| r.end <= have);
            if !rows_fit || d.a.len() != k * d.rank || d.cols.end > n || y.numel() != have * n {
                return Err(OpError::shape(format!(
                    "a LoRA product of {} by {} does not fit its projection's input {} and \
                     output {}",
                    d.a.len() / d.rank.max(1),
                    d.cols.len(),
                    x.shape(),
                    y.shape()
                )));
            }
        }
        // Each adapter's rows, gathered once for all its products.
        let mut x_rows = std::mem::take(&mut self.x);
        let dst = room(&mut x_rows, gathered * k);
        let mut at = 0;
        for job in self.jobs.iter().filter(|j| j.delta == 0) {
            for r in self.group(job.first) {
                let len = r.len() * k;
                dst[at..at + len].copy_from_slice(&xs[r.start * k..r.end * k]);
                at += len;
            }
        }
        while self.scratch.len() < self.jobs.len() {
            self.scratch.push(Mutex::default());
        }
        // Rows `tile` of product `j` into its slot.
        let product = |j: usize, tile: Range<usize>, pool: &ThreadPool| -> Result<(), OpError> {
            let job = &self.jobs[j];
            let d = &self.spans[job.first].1.deltas(node)[job.delta];
            let m = tile.len();
            let mut slot = lock(&self.scratch[j]);
            let (t, out) = &mut *slot;
            let first = job.rows.start + tile.start;
            let xj = &x_rows[first * k..(first + m) * k];
            matmul(xj, &d.a, room(t, m * d.rank), m, k, d.rank, pool)?;
            let width = d.cols.len();
            let out = room(out, m * width);
            matmul(&t[..m * d.rank], &d.b, out, m, d.rank, width, pool)?;
            Ok(())
        };
        let longest = self.jobs.iter().map(|j| j.rows.len()).max().unwrap_or(0);
        let result = if self.jobs.len() > 1 && longest <= ROW_TILE {
            // Decode-sized: the products at once, one per task, each inline.
            let failed = Mutex::new(Ok(()));
            pool.run(self.jobs.len(), &|j| {
                let rows = 0..self.jobs[j].rows.len();
                if let Err(e) = product(j, rows, &self.inline) {
                    *lock(&failed) = Err(e);
                }
            });
            let done = failed.into_inner().unwrap_or_else(|e| e.into_inner());
            done.and_then(|()| {
                (0..self.jobs.len())
                    .try_for_each(|j| self.add(node, j, 0..self.jobs[j].rows.len(), outputs))
            })
        } else {
            // One product, or prompt-sized ones: each in tiles of rows split over the pool,
            // added as they come (the buffers stay a tile's size).
            (0..self.jobs.len()).try_for_each(|j| {
                let m = self.jobs[j].rows.len();
                (0..m).step_by(ROW_TILE).try_for_each(|start| {
                    let tile = start..(start + ROW_TILE).min(m);
                    product(j, tile.clone(), pool)?;
                    self.add(node, j, tile, outputs)
                })
            })
        };
        self.x = x_rows;
        result
    }

    /// Adds rows `tile` of product `j` (in its slot) to their projection's output.
    fn add(
        &self,
        node: usize,
        j: usize,
        tile: Range<usize>,
        outputs: &mut [Tensor],
    ) -> Result<(), OpError> {
        let job = &self.jobs[j];
        let d = &self.spans[job.first].1.deltas(node)[job.delta];
        let y = &mut outputs[d.output];
        let n = y.dims().last().copied().unwrap_or(0);
        let ys = y
            .as_mut_slice::<f32>()
            .map_err(|_| OpError::value("LoRA adapters need a float32 projection output"))?;
        let slot = lock(&self.scratch[j]);
        let width = d.cols.len();
        let rows = self
            .group(job.first)
            .flat_map(Range::clone)
            .skip(tile.start);
        for (row, added) in rows.zip(slot.1.chunks_exact(width).take(tile.len())) {
            let start = row * n + d.cols.start;
            for (y, v) in ys[start..start + width].iter_mut().zip(added) {
                *y += v;
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

    /// More rows than [`ROW_TILE`] under one adapter run in tiles; the same bits as each row
    /// alone.
    #[test]
    fn products_in_row_tiles_equal_each_row_alone() {
        let (k, rank, n, rows) = (5, 3, 4, ROW_TILE + 50);
        let value = |i: usize| ((i * 37 % 17) as f32 - 8.0) / 7.0;
        let mut by_node: Vec<Vec<Delta>> = vec![Vec::new()];
        by_node[0].push(Delta {
            output: 0,
            cols: 1..4,
            rank,
            a: (0..k * rank).map(value).collect(),
            b: (0..rank * 3).map(|i| value(i + 5)).collect(),
        });
        let adapter = Arc::new(Loaded {
            key: 1,
            by_node,
            nbytes: 0,
        });
        let x: Vec<f32> = (0..rows * k).map(|i| value(i + 11)).collect();
        let x = Tensor::from_slice([1, rows, k], &x).unwrap();
        let pool = ThreadPool::new(2);
        let run = |span: Range<usize>| {
            let mut lora = LoraRows::default();
            lora.push(span, &adapter);
            let mut y = [Tensor::from_slice([1, rows, n], &vec![0.25f32; rows * n]).unwrap()];
            lora.apply(0, Some(&x), &mut y, &pool).unwrap();
            y[0].as_slice::<f32>().unwrap().to_vec()
        };
        let tiled = run(0..rows);
        let mut alone = Vec::new();
        for r in 0..rows {
            alone.extend_from_slice(&run(r..r + 1)[r * n..(r + 1) * n]);
        }
        assert_eq!(tiled.len(), alone.len());
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&tiled), bits(&alone));
        assert!(
            tiled
                .chunks_exact(n)
                .all(|row| row[0] == 0.25 && row[1] != 0.25)
        );
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
