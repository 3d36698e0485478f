//! The native session: runs a plan over named inputs.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use oxgen_graph::ops::MatMulNBits;
use oxgen_graph::{Graph, Op, ValueId, ValueKind};
use oxgen_kernels::ThreadPool;
use oxgen_kernels::matmul::{self as km, PACKED_TILE, PackedF32};
use oxgen_kernels::nbits::PackedNBits;
use oxgen_runtime::{IoSpec, OpTime, RuntimeError, Session, Tensors};
use oxgen_tensor::Tensor;

use crate::kv::{PagedLayer, PagedStep};
use crate::ops::moe::PackedExperts;
use crate::ops::{self, OpCounters, OpCtx};
use crate::residency::{ExpertCache, Residency};
use crate::{Arena, ExecError, OpError, Plan};

/// Options for a native session.
#[derive(Debug, Clone, Default)]
pub struct ExecOptions {
    /// Threads kernels may use (the calling thread included); 0 means all available cores.
    pub threads: usize,
    /// f32 activations everywhere: `MatMulNBits` nodes with `accuracy_level` 4 run the f32
    /// kernel instead of quantizing activations to int8.
    pub exact: bool,
}

/// Measurements of the last run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Most bytes of node outputs alive at once.
    pub peak_activation_bytes: usize,
    /// Nodes executed.
    pub nodes: usize,
}

/// Per-node timing, on when profiling: each node's row in `times`.
struct Profile {
    row_of_node: Vec<usize>,
    times: Vec<OpTime>,
}

impl Profile {
    fn new(graph: &Graph) -> Profile {
        let mut times: Vec<OpTime> = Vec::new();
        let row_of_node = graph
            .nodes
            .iter()
            .map(|node| {
                let name = if node.domain.is_empty() {
                    node.op_type.clone()
                } else {
                    format!("{}::{}", node.domain, node.op_type)
                };
                times
                    .iter()
                    .position(|t| t.op_type == name)
                    .unwrap_or_else(|| {
                        times.push(OpTime {
                            op_type: name,
                            calls: 0,
                            total: Duration::ZERO,
                        });
                        times.len() - 1
                    })
            })
            .collect();
        Profile { row_of_node, times }
    }
}

/// A graph running on oxgen's own kernels.
pub struct NativeSession {
    plan: Plan,
    inputs: Vec<IoSpec>,
    outputs: Vec<IoSpec>,
    arena: Arena,
    pool: Arc<ThreadPool>,
    slots: Vec<Option<Tensor>>,
    stats: RunStats,
    exact: bool,
    profile: Option<Profile>,
    /// A node that computes only some rows of its input 0 in the next runs, and which (see
    /// [`NativeSession::set_rows_only`]).
    row_node: Option<usize>,
    rows: Vec<usize>,
    /// Per node that is not repacked: the bytes of the weight matrix its kernel reads per
    /// run (0 for other nodes); repacked ones count what their kernel streams itself.
    matrix_bytes: Vec<u64>,
    /// Over every run so far: bytes those unpacked matrices were read for (in `streamed`)
    /// and what ops counted themselves.
    counters: OpCounters,
    /// Which expert weights are resident, under the weight budget.
    residency: Residency,
    /// Per node: `MatMulNBits` weights repacked at load for the int8 kernel.
    packed: Vec<Option<PackedNBits>>,
    /// Per node: a `MatMul`'s f32 `B` packed at load in column tiles.
    tiles: Vec<Option<PackedF32>>,
    /// Per node: a QMoE node's experts repacked for their kernel, once the
    /// session is told it has no weight budget ([`NativeSession::set_weight_budget`]).
    experts: Vec<Option<PackedExperts>>,
    /// Per node: a session for each of its branches or bodies (`If`, `Loop`, `Scan`).
    subgraphs: Vec<Vec<NativeSession>>,
}

fn spec(graph: &Graph, id: ValueId) -> IoSpec {
    let v = graph.value(id);
    IoSpec {
        name: v.name.clone(),
        dtype: v.dtype,
        dims: v.dims.clone(),
    }
}

/// The pool a session runs on when asked for `threads`: that many, or with 0 every core the
/// process may use, leaving room for other processes while they hold some
/// ([`ThreadPool::leaving_room`]).
pub fn pool_for(threads: usize) -> ThreadPool {
    match threads {
        0 => ThreadPool::leaving_room(oxgen_runtime::resolve_threads(0)),
        n => ThreadPool::new(n),
    }
}

impl NativeSession {
    pub fn new(graph: Graph, options: &ExecOptions) -> NativeSession {
        Self::with_pool(graph, Arc::new(pool_for(options.threads)), options.exact)
    }

    /// A session that shares an existing thread pool.
    pub fn with_pool(graph: Graph, pool: Arc<ThreadPool>, exact: bool) -> NativeSession {
        let mut graph = graph;
        let packed = prepack_weights(&mut graph, exact);
        let tiles = prepack_f32(&graph);
        // Repacked by `set_weight_budget(None)`, not before: a budget would drop them.
        let experts = (0..graph.nodes.len()).map(|_| None).collect();
        // A subgraph's captured values come after its own inputs.
        let inputs = (graph.inputs.iter().chain(&graph.captures))
            .map(|&id| spec(&graph, id))
            .collect();
        // Each branch or body moves into a session of its own.
        let subgraphs = (graph.nodes.iter_mut())
            .map(|node| {
                (node.op.subgraphs_mut().into_iter())
                    .map(|sub| {
                        let sub = std::mem::take(&mut sub.graph);
                        NativeSession::with_pool(sub, pool.clone(), exact)
                    })
                    .collect()
            })
            .collect();
        let outputs = graph.outputs.iter().map(|&id| spec(&graph, id)).collect();
        let slots = vec![None; graph.values.len()];
        let matrix_bytes = unpacked_matrix_bytes(&graph, &packed);
        NativeSession {
            plan: Plan::new(graph),
            inputs,
            outputs,
            arena: Arena::default(),
            pool,
            slots,
            stats: RunStats::default(),
            exact,
            profile: None,
            row_node: None,
            rows: Vec::new(),
            matrix_bytes,
            counters: OpCounters::default(),
            residency: Residency::new(None, ExpertCache::default()),
            packed,
            tiles,
            experts,
            subgraphs,
        }
    }

    pub fn graph(&self) -> &Graph {
        &self.plan.graph
    }

    /// Times each node from now on (`true`, counters from zero) or stops timing.
    pub fn set_profiling(&mut self, on: bool) {
        self.profile = on.then(|| Profile::new(&self.plan.graph));
    }

    /// Time per op type since profiling was switched on, most expensive first.
    pub fn op_times(&self) -> Vec<OpTime> {
        let mut times: Vec<OpTime> = self
            .profile
            .iter()
            .flat_map(|p| p.times.iter().filter(|t| t.calls > 0).cloned())
            .collect();
        times.sort_by_key(|t| std::cmp::Reverse(t.total));
        times
    }

    /// Statistics of the last completed run.
    pub fn last_run(&self) -> RunStats {
        self.stats
    }

    /// Runs the graph; errors name the failing node.
    pub fn run_graph(&mut self, inputs: Tensors) -> Result<Tensors, ExecError> {
        let mut bound: Vec<Option<Tensor>> = oxgen_runtime::bind_inputs(&self.inputs, inputs)?
            .into_iter()
            .map(Some)
            .collect();
        let mut outputs = vec![None; self.outputs.len()];
        self.run_ordered(&mut bound, &mut outputs)?;
        Ok(self
            .outputs
            .iter()
            .zip(outputs)
            .map(|(spec, t)| {
                (
                    spec.name.clone(),
                    t.expect("a successful run fills every output"),
                )
            })
            .collect())
    }

    /// Runs the graph on inputs in declared order (`inputs[i]` feeds input `i` and is taken),
    /// writing the outputs in declared order. The allocation-free entry point: with buffers
    /// reused by the caller, a run that repeats earlier shapes touches no allocator.
    pub fn run_ordered(
        &mut self,
        inputs: &mut [Option<Tensor>],
        outputs: &mut [Option<Tensor>],
    ) -> Result<(), ExecError> {
        self.run_ordered_paged(inputs, outputs, None)
    }

    /// [`NativeSession::run_ordered`] as one ragged step over a paged KV cache: the
    /// `GroupQueryAttention` nodes `paged` names read and write its pools for its segments
    /// instead of their past/present inputs, which pass through unchanged.
    pub fn run_ordered_paged(
        &mut self,
        inputs: &mut [Option<Tensor>],
        outputs: &mut [Option<Tensor>],
        paged: Option<&mut PagedStep>,
    ) -> Result<(), ExecError> {
        let graph = &self.plan.graph;
        if inputs.len() != self.inputs.len() || outputs.len() != graph.outputs.len() {
            return Err(ExecError::Runtime(RuntimeError::Contract(format!(
                "{} inputs and {} outputs given; the graph declares {} and {}",
                inputs.len(),
                outputs.len(),
                self.inputs.len(),
                graph.outputs.len()
            ))));
        }
        for (spec, slot) in self.inputs.iter().zip(inputs.iter()) {
            match slot {
                Some(t) => spec.check(t)?,
                None => {
                    return Err(ExecError::Runtime(RuntimeError::MissingInput {
                        name: spec.name.clone(),
                    }));
                }
            }
        }
        for (&id, tensor) in graph
            .inputs
            .iter()
            .chain(&graph.captures)
            .zip(inputs.iter_mut())
        {
            self.slots[id.0] = tensor.take();
        }
        self.arena.reset_peak();
        let result = self.execute(paged);
        let graph = &self.plan.graph;
        if result.is_ok() {
            for (k, &id) in graph.outputs.iter().enumerate() {
                outputs[k] = Some(match self.slots[id.0].take() {
                    Some(t) => {
                        self.arena.forget(&t);
                        t
                    }
                    // An output that is an initializer, or a value listed again.
                    None => match graph.initializers.get(&id) {
                        Some(t) => t.clone(),
                        None => {
                            let first = graph.outputs[..k]
                                .iter()
                                .position(|&o| o == id)
                                .expect("a graph output has a value after a successful run");
                            outputs[first].clone().expect("filled above")
                        }
                    },
                });
            }
        }
        // Whatever is left (inputs, values of a failed run) is released for reuse.
        for (id, slot) in self.slots.iter_mut().enumerate() {
            if let Some(t) = slot.take() {
                dispose(&mut self.arena, graph, ValueId(id), t);
            }
        }
        result
    }

    /// The node computing graph output `output` row by row: a row-wise product (`MatMulNBits`,
    /// or `MatMul` by a 2-D initializer), alone or followed by element-wise steps that keep
    /// rows apart (unary ops, binary ops with a one-value initializer: Gemma's final-logit
    /// softcap `tanh(x / c) * c`), each step's input read by nothing else. Each output row
    /// then depends on its input row alone, so the steps run on the rows the product made.
    pub fn row_wise_producer(&self, output: usize) -> Option<usize> {
        let graph = &self.plan.graph;
        let scalar = |v: Option<ValueId>| {
            v.and_then(|v| graph.initializers.get(&v))
                .is_some_and(|t| t.numel() == 1)
        };
        let mut id = *graph.outputs.get(output)?;
        loop {
            let (i, node) =
                (graph.nodes.iter().enumerate()).find(|(_, n)| n.outputs.contains(&Some(id)))?;
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
            let readers = (graph.nodes.iter())
                .filter(|n| n.inputs.contains(&Some(next)))
                .count();
            if readers != 1 || graph.outputs.contains(&next) {
                return None;
            }
            id = next;
        }
    }

    /// Makes node `node` (from [`NativeSession::row_wise_producer`]) compute only rows
    /// `rows` (ascending) of a batch-1 input in the runs that follow, or every row again
    /// (`None`). A prompt step needs the logits of its last token only, a batch those of each
    /// sequence's last token; the output head is the largest matrix.
    pub fn set_rows_only(&mut self, node: Option<usize>, rows: &[usize]) {
        self.row_node = node;
        self.rows.clear();
        self.rows.extend_from_slice(rows);
    }

    /// Bytes of weight matrices read over every run so far, as measured: a repacked
    /// `MatMulNBits` counts the columns its kernel streamed (its whole packed size per pass
    /// over them), every other `MatMulNBits`, `MatMul` and `Gemm` weight initializer its
    /// size each time its node runs. Embedding lookups read only the rows they gather and
    /// are not counted.
    pub fn streamed_weight_bytes(&self) -> u64 {
        let packed: u64 = self
            .packed
            .iter()
            .flatten()
            .map(PackedNBits::streamed_bytes)
            .sum();
        packed + self.counters.streamed
    }

    /// Bytes of f32 `MatMul` weights held packed in column tiles (made at load; their file
    /// pages were handed back).
    pub fn packed_f32_bytes(&self) -> usize {
        self.tiles.iter().flatten().map(PackedF32::nbytes).sum()
    }

    /// What the ops counted over every run so far (MoE experts and routes among them).
    pub fn op_counters(&self) -> OpCounters {
        self.counters
    }

    /// Bounds the bytes of mixture-of-experts weights kept resident (`None`: no bound); see
    /// `crate::residency`. Forgets what was resident. Without a bound, QMoE nodes' integer
    /// experts that take f32 activations and MXFP4 experts that take int8 activations are
    /// repacked for their kernel (once; a session never told runs them as stored, with the
    /// same bits); a bound drops the copies, since it counts what stays resident of the
    /// files' experts and the copies (memory of their own) would stay whatever it says.
    pub fn set_weight_budget(&mut self, budget: Option<u64>, policy: ExpertCache) {
        self.residency = Residency::new(budget, policy);
        let repacked = self.experts.iter().any(Option::is_some);
        match budget {
            None if !repacked => self.experts = prepack_experts(&self.plan.graph, self.exact),
            None => {}
            Some(_) => self.experts.iter_mut().for_each(|e| *e = None),
        }
    }

    /// The weight budget's account so far.
    pub fn expert_residency(&self) -> oxgen_runtime::ExpertResidency {
        self.residency.counters()
    }

    /// Returns a tensor's buffer (an output the caller is done with) to the arena.
    pub fn recycle(&mut self, tensor: Tensor) {
        self.arena.recycle(tensor);
    }

    /// A buffer from this session's arena (for inputs of the next run, so their memory comes
    /// back to the arena after it).
    pub fn alloc_input(
        &mut self,
        dtype: oxgen_tensor::DType,
        dims: &[usize],
    ) -> Result<Tensor, ExecError> {
        self.arena
            .alloc(dtype, dims)
            .map_err(|e| ExecError::Runtime(RuntimeError::Contract(e.to_string())))
    }

    fn execute(&mut self, mut paged: Option<&mut PagedStep>) -> Result<(), ExecError> {
        let plan = &self.plan;
        let graph = &plan.graph;
        for (i, node) in graph.nodes.iter().enumerate() {
            let mut donated: SmallVec<[Option<Tensor>; 16]> =
                smallvec::smallvec![None; node.inputs.len()];
            for &k in &plan.donations[i] {
                if let Some(id) = node.inputs[k] {
                    donated[k] = self.slots[id.0].take();
                }
            }
            let last_row = match self.row_node {
                Some(n) if n == i => rows_of(&mut self.arena, node, graph, &self.slots, &self.rows)
                    .map_err(|source| ExecError::Node {
                        node: Box::new(node.node_ref()),
                        source,
                    })?,
                _ => None,
            };
            let mut inputs: SmallVec<[Option<&Tensor>; 16]> = node
                .inputs
                .iter()
                .map(|v| v.and_then(|id| graph.initializers.get(&id).or(self.slots[id.0].as_ref())))
                .collect();
            if let Some(row) = &last_row {
                inputs[0] = Some(row);
            }
            let started = self.profile.is_some().then(Instant::now);
            self.counters.streamed += self.matrix_bytes[i];
            let mut ctx = OpCtx {
                arena: &mut self.arena,
                pool: &self.pool,
                exact: self.exact,
                packed: self.packed[i].as_ref(),
                tiles: self.tiles[i].as_ref(),
                experts: self.experts[i].as_ref(),
                wanted: plan.wanted[i],
                subgraphs: &mut self.subgraphs[i],
                counters: &mut self.counters,
                residency: &mut self.residency,
                paged: paged.as_deref_mut().and_then(|p| {
                    let layer = p.layer_of_node.get(i).copied().flatten()?;
                    Some(PagedLayer {
                        store: &mut *p.store,
                        layer,
                        segments: p.segments,
                        tables: p.tables,
                    })
                }),
            };
            let produced = ops::run(
                &node.op,
                &inputs,
                &mut donated,
                node.outputs.len(),
                &mut ctx,
            )
            .map_err(|source| ExecError::Node {
                node: Box::new(node.node_ref()),
                source,
            })?;
            drop(inputs);
            if let Some(row) = last_row {
                self.arena.recycle(row);
            }
            if let (Some(profile), Some(started)) = (&mut self.profile, started) {
                let row = &mut profile.times[profile.row_of_node[i]];
                row.calls += 1;
                row.total += started.elapsed();
            }
            if produced.len()
                < node
                    .outputs
                    .iter()
                    .rposition(Option::is_some)
                    .map_or(0, |p| p + 1)
            {
                return Err(ExecError::OutputCount {
                    node: Box::new(node.node_ref()),
                    expected: node.outputs.len(),
                    got: produced.len(),
                });
            }
            for (out, tensor) in node.outputs.iter().zip(produced) {
                self.arena.track(tensor.nbytes());
                match out {
                    Some(id) if plan.last_use[id.0].is_some() || graph.outputs.contains(id) => {
                        self.slots[id.0] = Some(tensor)
                    }
                    _ => self.arena.release(tensor),
                }
            }
            for (v, t) in node.inputs.iter().zip(donated) {
                if let (Some(v), Some(t)) = (v, t) {
                    dispose(&mut self.arena, graph, *v, t);
                }
            }
            for v in node.inputs.iter().flatten() {
                if plan.last_use[v.0] == Some(i)
                    && let Some(t) = self.slots[v.0].take()
                {
                    dispose(&mut self.arena, graph, *v, t);
                }
            }
        }
        self.stats = RunStats {
            peak_activation_bytes: self.arena.peak_bytes(),
            nodes: graph.nodes.len(),
        };
        Ok(())
    }
}

/// The `MatMulNBits` attributes of a node's parts (one for `MatMulNBits`, several for a
/// group, gate and up for a `MatMulNBitsGlu`), each with the index of its first weight input (B; scales and zero points follow).
fn nbits_parts(op: &Op) -> Vec<(&MatMulNBits, usize)> {
    let parts: &[MatMulNBits] = match op {
        Op::MatMulNBits(m) => std::slice::from_ref(m),
        Op::MatMulNBitsGroup(parts) => parts,
        Op::MatMulNBitsGlu(parts) => parts,
        _ => &[],
    };
    parts
        .iter()
        .enumerate()
        .map(|(p, m)| (m, 1 + 3 * p))
        .collect()
}

/// Repacks the weights of every int8-activation `MatMulNBits` node (and group) whose weights
/// are initializers ([`oxgen_kernels::nbits::PackedNBits`]), then lets go of the originals: an
/// initializer only packed nodes read leaves the graph, and the file pages it was read from
/// are handed back to the OS, so the weights are not resident twice.
fn prepack_weights(graph: &mut Graph, exact: bool) -> Vec<Option<PackedNBits>> {
    let mut packed: Vec<Option<PackedNBits>> = vec![None; graph.nodes.len()];
    // A weight that another node reads too, or whose bytes another initializer holds (a tied
    // embedding's `GatherBlockQuantized` reads the output head's codes, often through a folded
    // `Reshape` view), keeps its pages: else every lookup would read them back from disk.
    let mut readers: HashMap<ValueId, usize> = HashMap::new();
    for node in &graph.nodes {
        for id in node.inputs.iter().flatten() {
            *readers.entry(*id).or_default() += 1;
        }
    }
    let spans: Vec<(ValueId, Range<usize>)> = graph
        .initializers
        .iter()
        .filter(|(_, t)| t.is_shared())
        .map(|(&id, t)| (id, byte_span(t)))
        .collect();
    let keeps_pages = |id: ValueId, t: &Tensor| {
        let span = byte_span(t);
        readers.get(&id) != Some(&1)
            || spans
                .iter()
                .any(|(other, s)| *other != id && s.start < span.end && span.start < s.end)
    };
    for (slot, node) in packed.iter_mut().zip(&graph.nodes) {
        let parts = nbits_parts(&node.op);
        let input = |k: usize| node.inputs.get(k).copied().flatten();
        let init = |id: Option<ValueId>| id.and_then(|id| graph.initializers.get(&id));
        if parts.is_empty()
            || !parts
                .iter()
                .all(|(op, _)| ops::quant::int8_activations(op, exact))
            || matches!(node.op, Op::MatMulNBits(_)) && input(4).is_some()
        {
            continue;
        }
        let Some(weights) = parts
            .iter()
            .map(|&(op, at)| {
                let zero_points = match input(at + 2) {
                    None => None,
                    Some(id) => Some(graph.initializers.get(&id)?),
                };
                Some((op, init(input(at))?, init(input(at + 1))?, zero_points))
            })
            .collect::<Option<Vec<_>>>()
        else {
            continue;
        };
        *slot = match (&node.op, weights.as_slice()) {
            (Op::MatMulNBitsGlu(_), &[gate, up]) => ops::quant::prepack_glu([gate, up]),
            _ => ops::quant::prepack(&weights),
        };
        if slot.is_some() {
            // Right away, so the load never holds every matrix twice.
            for (&(_, at), (_, b, scales, zero_points)) in parts.iter().zip(weights) {
                let tensors = [Some(b), Some(scales), zero_points];
                for (k, t) in tensors.into_iter().enumerate() {
                    if let (Some(id), Some(t)) = (input(at + k), t)
                        && !keeps_pages(id, t)
                    {
                        page_out(t);
                    }
                }
            }
        }
    }
    let weights: Vec<ValueId> = graph
        .nodes
        .iter()
        .zip(&packed)
        .filter(|(_, p)| p.is_some())
        .flat_map(|(n, _)| {
            nbits_parts(&n.op)
                .into_iter()
                .flat_map(|(_, at)| n.inputs.iter().skip(at).take(3).flatten().copied())
        })
        .collect();
    for id in weights {
        let only_packed_readers = graph
            .nodes
            .iter()
            .zip(&packed)
            .filter(|(n, _)| n.inputs.contains(&Some(id)))
            .all(|(_, p)| p.is_some());
        if only_packed_readers && !graph.outputs.contains(&id) {
            graph.initializers.remove(&id);
        }
    }
    packed
}

/// Packs the f32 `B` of every `MatMul` node whose `B` is a 2-D f32 initializer mapped from the
/// model file and read by that node alone into column tiles ([`PackedF32`]), so a product
/// streams contiguous memory, then hands the file pages of the original back to the OS (the
/// tensor stays in the graph, for its shape; it is read again only if something else reads
/// it). Nothing where the CPU has no vector kernel to stream them.
fn prepack_f32(graph: &Graph) -> Vec<Option<PackedF32>> {
    let mut readers: HashMap<ValueId, usize> = HashMap::new();
    for node in &graph.nodes {
        for id in node.inputs.iter().flatten() {
            *readers.entry(*id).or_default() += 1;
        }
    }
    (graph.nodes.iter())
        .map(|node| {
            let id = (matches!(node.op, Op::MatMul) && km::f32_kernel_available())
                .then(|| node.inputs.get(1).copied().flatten())??;
            let b = graph.initializers.get(&id)?;
            let &[k, n] = b.dims() else {
                return None;
            };
            let sole = readers.get(&id) == Some(&1) && !graph.outputs.contains(&id);
            if b.dtype() != oxgen_tensor::DType::F32 || !b.is_shared() || !sole || n < PACKED_TILE {
                return None;
            }
            let packed = PackedF32::pack(b.as_slice::<f32>().ok()?, k, n).ok()?;
            page_out(b);
            Some(packed)
        })
        .collect()
}

/// Repacks the experts of every QMoE node whose weights are initializers and whose kernel
/// takes them repacked (`crate::ops::moe::prepack`), then hands the file pages of the originals
/// back to the OS: they are read again only if a weight budget later sends the node back to
/// them.
fn prepack_experts(graph: &Graph, exact: bool) -> Vec<Option<PackedExperts>> {
    (graph.nodes.iter())
        .map(|node| {
            let Op::Moe(op) = &node.op else {
                return None;
            };
            let inputs: Vec<Option<&Tensor>> = (node.inputs.iter())
                .map(|id| id.and_then(|id| graph.initializers.get(&id)))
                .collect();
            let packed = ops::moe::prepack(op, &inputs, exact)?;
            let at = op.inputs();
            let zero_points = at.zero_points.map_or([None; 2], |z| [Some(z.0), Some(z.1)]);
            let weights = [at.fc1.0, at.fc2.0].into_iter().map(Some);
            let scales = [at.fc1, at.fc2].map(|(w, s, _)| Some(s.unwrap_or(w + 1)));
            for k in weights.chain(scales).chain(zero_points).flatten() {
                if let Some(Some(t)) = inputs.get(k) {
                    page_out(t);
                }
            }
            Some(packed)
        })
        .collect()
}

/// The addresses of a tensor's bytes.
fn byte_span(t: &Tensor) -> Range<usize> {
    let bytes = t.as_bytes();
    let start = bytes.as_ptr() as usize;
    start..start + bytes.len()
}

/// Hands the resident pages of a tensor mapped from the model file back to the OS; they are
/// read from the file again if something touches them. `MADV_PAGEOUT` is only a hint: it never
/// changes what the memory holds.
fn page_out(t: &Tensor) {
    #[cfg(target_os = "linux")]
    if t.is_shared() {
        let bytes = t.as_bytes();
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let (addr, len) = (bytes.as_ptr() as usize, bytes.len());
        let start = addr.next_multiple_of(page);
        let end = (addr + len) / page * page;
        if end > start {
            // SAFETY: whole pages inside the tensor's live bytes; PAGEOUT does not alter their
            // contents (mapped file pages are re-read on the next access).
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_PAGEOUT);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = t;
}

/// Rows `rows` of `node`'s input 0 (`[1, .., r, k]` → `[1, .., rows.len(), k]`) in an arena
/// buffer, unless that is every row already.
fn rows_of(
    arena: &mut Arena,
    node: &oxgen_graph::Node,
    graph: &Graph,
    slots: &[Option<Tensor>],
    rows: &[usize],
) -> Result<Option<Tensor>, OpError> {
    let Some(Some(id)) = node.inputs.first() else {
        return Ok(None);
    };
    let Some(x) = graph.initializers.get(id).or(slots[id.0].as_ref()) else {
        return Ok(None);
    };
    let dims = x.dims();
    let rank = dims.len();
    if rank < 2 || dims[..rank - 2].iter().any(|&d| d != 1) {
        return Ok(None);
    }
    let have = dims[rank - 2];
    if rows.iter().enumerate().all(|(i, &r)| i == r) && rows.len() == have {
        return Ok(None);
    }
    if let Some(&r) = rows.iter().find(|&&r| r >= have) {
        return Err(OpError::shape(format!(
            "row {r} was asked for, but the input has {have} rows"
        )));
    }
    let mut shape: SmallVec<[usize; 8]> = SmallVec::from_slice(dims);
    shape[rank - 2] = rows.len();
    let mut out = arena.alloc(x.dtype(), &shape[..])?;
    let bytes = x.as_bytes();
    let width = bytes.len() / have.max(1);
    for (dst, &r) in out.as_mut_bytes().chunks_exact_mut(width).zip(rows) {
        dst.copy_from_slice(&bytes[r * width..(r + 1) * width]);
    }
    Ok(Some(out))
}

/// Per node, the bytes of weight matrix a run of it reads when it is not repacked (see
/// [`NativeSession::streamed_weight_bytes`]); 0 for repacked and other nodes.
fn unpacked_matrix_bytes(graph: &Graph, packed: &[Option<PackedNBits>]) -> Vec<u64> {
    let init = |id: &Option<ValueId>| {
        id.and_then(|id| graph.initializers.get(&id))
            .map_or(0, |t| t.nbytes() as u64)
    };
    graph
        .nodes
        .iter()
        .zip(packed)
        .map(|(node, p)| match (&node.op, p) {
            (_, Some(_)) => 0,
            (Op::MatMulNBits(_) | Op::MatMulNBitsGroup(_) | Op::MatMulNBitsGlu(_), None) => node
                .inputs
                .iter()
                .skip(1)
                .take(3 * nbits_parts(&node.op).len())
                .map(init)
                .sum(),
            (Op::MatMul | Op::Gemm(_), _) => node.inputs.iter().take(2).map(init).sum(),
            _ => 0,
        })
        .collect()
}

/// Returns a dead value's buffer to the arena; graph inputs were never counted live.
fn dispose(arena: &mut Arena, graph: &Graph, id: ValueId, tensor: Tensor) {
    if graph.value(id).kind == ValueKind::Input {
        arena.recycle(tensor);
    } else {
        arena.release(tensor);
    }
}

impl Session for NativeSession {
    fn backend(&self) -> &'static str {
        "native"
    }

    fn inputs(&self) -> &[IoSpec] {
        &self.inputs
    }

    fn outputs(&self) -> &[IoSpec] {
        &self.outputs
    }

    fn run(&mut self, inputs: Tensors) -> Result<Tensors, RuntimeError> {
        self.run_graph(inputs).map_err(|e| match e {
            ExecError::Runtime(r) => r,
            other => RuntimeError::Backend(Box::new(other)),
        })
    }
}
