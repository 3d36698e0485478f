//! The native session: runs a plan over named inputs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use oxgen_graph::{Graph, Index, ValueId, ValueKind};
use oxgen_kernels::ThreadPool;
use oxgen_kernels::matmul::PackedF32;
use oxgen_runtime::{IoSpec, OpTime, RuntimeError, Session, Tensors};
use oxgen_tensor::Tensor;

use crate::kv::PagedStep;
use crate::lora::LoraRows;
use crate::lower::{self, Lowered};
use crate::ops::{self, OpCounters, OpCtx, WeightUse};
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

/// A planned graph running on oxgen's own kernels: it executes the plan's ops in order; each
/// op owns what it runs with ([`Lowered`]).
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
    /// The LoRA adapters of a run's rows.
    lora: LoraRows,
    /// What reading weights cost over every run so far (bytes the plan's unpacked matrices
    /// were read for, and what ops counted themselves), and which experts stay resident.
    weights: WeightUse,
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
/// process may use ([`oxgen_runtime::resolve_threads`]), leaving room for other processes
/// while they hold some.
pub fn pool_for(threads: usize) -> ThreadPool {
    pool_of(oxgen_runtime::resolve_threads(threads), threads == 0)
}

/// A pool of `threads` (resolved); with `leave_room`, one that leaves room for other
/// processes while they hold some of its cores ([`ThreadPool::leaving_room`]).
pub fn pool_of(threads: usize, leave_room: bool) -> ThreadPool {
    match leave_room {
        true => ThreadPool::leaving_room(threads),
        false => ThreadPool::new(threads),
    }
}

impl NativeSession {
    /// Loads the graph at `path`, optimizes it (the passes that need no language-model
    /// contract) and plans it: the door for graphs that are not language models (encoders).
    pub fn open(
        path: &std::path::Path,
        options: &ExecOptions,
    ) -> Result<NativeSession, crate::OpenError> {
        let graph = crate::open::load_graph(path)?;
        let (graph, _) = crate::optimize(graph, None, &crate::PassOptions::default());
        Ok(NativeSession::new(graph, options))
    }

    /// Loads a decoder's graph cut at its final hidden states (the output head's input, see
    /// [`oxgen_graph::passes::layers::keep_hidden_states`]) and plans it: the door for
    /// embeddings from a language model. Returns the session, whose one output is
    /// `hidden_states`, and the contract of the graph as loaded (its KV inputs, which a run
    /// feeds empty).
    pub fn open_hidden_states(
        path: &std::path::Path,
        kv: &oxgen_runtime::KvTemplates,
        options: &ExecOptions,
    ) -> Result<(NativeSession, oxgen_runtime::LmContract), crate::OpenError> {
        let mut graph = crate::open::load_graph(path)?;
        let refused = |source| crate::OpenError::Runtime {
            path: path.display().to_string(),
            source,
        };
        let (inputs, outputs) = crate::open::io_specs(&graph);
        let contract =
            oxgen_runtime::LmContract::from_io(&inputs, &outputs, kv).map_err(refused)?;
        oxgen_graph::passes::layers::keep_hidden_states(&mut graph, &contract.logits)
            .map_err(|e| refused(oxgen_runtime::RuntimeError::Contract(e)))?;
        let (graph, _) = crate::optimize(graph, None, &crate::PassOptions::default());
        Ok((NativeSession::new(graph, options), contract))
    }

    pub fn new(graph: Graph, options: &ExecOptions) -> NativeSession {
        Self::with_pool(graph, Arc::new(pool_for(options.threads)), options.exact)
    }

    /// A session that shares an existing thread pool.
    pub fn with_pool(graph: Graph, pool: Arc<ThreadPool>, exact: bool) -> NativeSession {
        let plan = Plan::new(graph, &pool, exact);
        let graph = &plan.graph;
        // A subgraph's captured values come after its own inputs.
        let inputs = (graph.inputs.iter().chain(&graph.captures))
            .map(|&id| spec(graph, id))
            .collect();
        let outputs = graph.outputs.iter().map(|&id| spec(graph, id)).collect();
        let slots = vec![None; graph.values.len()];
        NativeSession {
            plan,
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
            lora: LoraRows::default(),
            weights: WeightUse {
                counters: OpCounters::default(),
                residency: Residency::new(None, ExpertCache::default()),
            },
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

    /// The node computing graph output `output` row by row ([`Index::row_wise_producer`]).
    pub fn row_wise_producer(&self, output: usize) -> Option<usize> {
        let graph = &self.plan.graph;
        Index::new(graph).row_wise_producer(graph, output)
    }

    /// Lowers the `GroupQueryAttention` nodes `layer_of_node` names to read and write that
    /// layer of the paged KV cache in a ragged step ([`NativeSession::run_ordered_paged`]).
    pub fn page_kv(&mut self, layer_of_node: &[Option<usize>]) {
        for (op, layer) in self.plan.ops.iter_mut().zip(layer_of_node) {
            if let Some(l) = *layer {
                op.lowered = Lowered::KvLayer(l);
            }
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

    /// The LoRA adapters of the next runs' rows (empty: none).
    pub fn lora_rows(&mut self) -> &mut LoraRows {
        &mut self.lora
    }

    /// Bytes of weight matrices read over every run so far, as measured: a repacked
    /// `MatMulNBits` counts the columns its kernel streamed (its whole packed size per pass
    /// over them), every other `MatMulNBits`, `MatMul` and `Gemm` weight initializer its
    /// size each time its node runs. Embedding lookups read only the rows they gather and
    /// are not counted.
    pub fn streamed_weight_bytes(&self) -> u64 {
        let packed: u64 = (self.plan.ops.iter())
            .filter_map(|op| op.lowered.nbits())
            .map(|p| p.streamed_bytes())
            .sum();
        packed + self.weights.counters.streamed
    }

    /// Bytes of f32 `MatMul` weights held packed in column tiles (made at load; their file
    /// pages were handed back).
    pub fn packed_f32_bytes(&self) -> usize {
        (self.plan.ops.iter())
            .filter_map(|op| op.lowered.tiles())
            .map(PackedF32::nbytes)
            .sum()
    }

    /// What the ops counted over every run so far (MoE experts and routes among them).
    pub fn op_counters(&self) -> OpCounters {
        self.weights.counters
    }

    /// Bounds the bytes of mixture-of-experts weights kept resident (`None`: no bound); see
    /// `crate::residency`. Forgets what was resident. Without a bound, QMoE nodes' integer
    /// experts that take f32 activations and MXFP4 experts that take int8 activations are
    /// repacked for their kernel (once; a session never told runs them as stored, with the
    /// same bits); a bound drops the copies, since it counts what stays resident of the
    /// files' experts and the copies (memory of their own) would stay whatever it says.
    pub fn set_weight_budget(&mut self, budget: Option<u64>, policy: ExpertCache) {
        self.weights.residency = Residency::new(budget, policy);
        let ops = &mut self.plan.ops;
        let repacked = ops.iter().any(|op| op.lowered.experts().is_some());
        match budget {
            None if !repacked => {
                let packed = lower::prepack_experts(&self.plan.graph, self.exact);
                for (op, packed) in ops.iter_mut().zip(packed) {
                    if let Lowered::Experts(e) = &mut op.lowered {
                        *e = packed;
                    }
                }
            }
            None => {}
            Some(_) => (ops.iter_mut()).for_each(|op| {
                if let Lowered::Experts(e) = &mut op.lowered {
                    *e = None;
                }
            }),
        }
    }

    /// The weight budget's account so far.
    pub fn expert_residency(&self) -> oxgen_runtime::ExpertResidency {
        self.weights.residency.counters()
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
        let Plan {
            graph,
            last_use,
            ops: planned,
        } = &self.plan;
        for (i, (node, op)) in graph.nodes.iter().zip(planned.iter()).enumerate() {
            let mut donated: SmallVec<[Option<Tensor>; 16]> =
                smallvec::smallvec![None; node.inputs.len()];
            for &k in &op.donations {
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
            self.weights.counters.streamed += op.matrix_bytes;
            let mut ctx = OpCtx {
                arena: &mut self.arena,
                pool: &self.pool,
                exact: self.exact,
                wanted: op.wanted,
                lowered: &op.lowered,
                kv: paged.as_deref_mut().map(|p| PagedStep {
                    store: &mut *p.store,
                    segments: p.segments,
                    tables: p.tables,
                }),
                weights: &mut self.weights,
            };
            let mut produced = ops::run(
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
            if !self.lora.is_empty() {
                let x = inputs.first().copied().flatten();
                (self.lora.apply(i, x, &mut produced, &self.pool)).map_err(|source| {
                    ExecError::Node {
                        node: Box::new(node.node_ref()),
                        source,
                    }
                })?;
            }
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
                    Some(id) if last_use[id.0].is_some() || graph.outputs.contains(id) => {
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
                if last_use[v.0] == Some(i)
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

    fn set_profiling(&mut self, on: bool) {
        NativeSession::set_profiling(self, on);
    }

    fn op_times(&self) -> Vec<OpTime> {
        NativeSession::op_times(self)
    }
}
