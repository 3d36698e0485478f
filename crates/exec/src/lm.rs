//! The native backend as a [`LanguageModel`].
//!
//! **Paged and fused** (graphs whose every past-KV input feeds one `GroupQueryAttention`
//! node per layer): KV lives in a block pool ([`oxgen_runtime::BlockPool`] for the
//! bookkeeping, [`KvStore`] for the memory) shared by all sequences, with prefix caching. A
//! step runs every sequence of the batch in **one** forward: their tokens (prefill chunks and
//! decode tokens alike) are stacked as the rows of one `(1, tokens)` input, every op but
//! attention is row-wise, and each attention node reads and writes the pool through the
//! sequences' block tables ([`PagedStep`]). So the weights are read once per step whatever the
//! batch, and a sequence's logits are the same bits alone or batched (the kernels' reduction
//! contract: a row never depends on the other rows).
//!
//! **Dense** (other graphs, e.g. `Concat(past, new)` attention that the passes could not turn
//! into `GroupQueryAttention`): each sequence owns its past tensors, fed to the graph and
//! taken back from its present outputs, and sequences of a batch run one after another.
//! (A shared-buffer graph whose attention nodes cannot be matched to layers gets
//! context-sized buffers updated in place.)
//!
//! Graphs are optimized first ([`crate::optimize`]): an optimum export's `Concat(past, new)`
//! attention becomes `GroupQueryAttention`, so it is paged too.

use std::path::Path;

use oxgen_graph::passes::{Options as PassOptions, Report as PassReport};
use oxgen_graph::{Graph, Op};
use oxgen_kernels::attention::paged::{PagedLayout, Segment};
use oxgen_runtime::{
    Batch, BlockPool, BlockTable, Capabilities, IoSpec, KvDtype, KvUsage, LanguageModel,
    LmContract, LogitsWanted, OpTime, RuntimeError, SeqId, SeqStep, SeqTable, Session,
    StepCounters, StepLogits, check_context,
};
use oxgen_tensor::{DType, Tensor, bf16, f16};

use crate::kv::{KvStore, PagedStep};
use crate::open::{
    DEFAULT_KV_BLOCKS, KV_BLOCK_SIZE, KvBudget, NativeOptions, OpenError, io_specs,
    keep_first_layers, load_graph,
};
use crate::{ExecError, NativeSession};

/// One sequence's KV.
enum SeqKv {
    /// Per layer: key and value. Taken while a step runs.
    Dense(Vec<[Option<Tensor>; 2]>),
    /// Blocks of the pool, and the ids they hold (for the prefix cache).
    Paged { table: BlockTable, ids: Vec<u32> },
}

/// The paged KV of a fused model, and buffers a step reuses.
struct Paged {
    pool: BlockPool,
    prefix_cache: bool,
    store: KvStore,
    /// Per node: the layer a `GroupQueryAttention` node reads.
    layer_of_node: Vec<Option<usize>>,
    /// Per layer: the empty past tensors fed to the graph (attention reads the pool).
    empty: Vec<[Option<Tensor>; 2]>,
    segments: Vec<Segment>,
    tables: Vec<u32>,
    /// Rows of the stacked batch whose logits are wanted.
    rows: Vec<usize>,
}

impl Paged {
    /// The pool `options.kv` asks for.
    fn new(
        c: &LmContract,
        layer_of_node: Vec<Option<usize>>,
        options: &NativeOptions,
    ) -> Result<Paged, RuntimeError> {
        let block_layout =
            |blocks| PagedLayout::dense(blocks, KV_BLOCK_SIZE, c.kv_heads, c.head_size);
        let kv = options.kv_dtype.unwrap_or(c.graph_kv_dtype());
        let blocks = match options.kv {
            KvBudget::Sequences(n) => sequence_blocks(
                n,
                options.ctx_size.or(options.context_length),
                c.kv_bytes(kv, KV_BLOCK_SIZE),
                physical_memory(),
            ),
            KvBudget::Blocks(n) => n,
            KvBudget::Bytes(bytes) => (bytes / c.kv_bytes(kv, KV_BLOCK_SIZE).max(1)).max(1),
        };
        Ok(Paged {
            pool: BlockPool::new(blocks, KV_BLOCK_SIZE)?,
            prefix_cache: options.prefix_cache,
            store: KvStore::new(kv, block_layout(blocks), c.layers.len())?,
            layer_of_node,
            empty: fresh_kv(c, false, 0)?,
            segments: Vec::new(),
            tables: Vec::new(),
            rows: Vec::new(),
        })
    }
}

/// Blocks for `sequences` sequences of the whole `context` (at least [`DEFAULT_KV_BLOCKS`]),
/// but at most half of `memory` bytes at `block_bytes` a block: a long-context package
/// (Llama 3.2's 131072 positions: 60 GB of f32 KV for two sequences of its 3B model) would
/// otherwise ask for more than the machine has and fail to open.
fn sequence_blocks(
    sequences: usize,
    context: Option<usize>,
    block_bytes: usize,
    memory: Option<usize>,
) -> usize {
    let want = context.map_or(DEFAULT_KV_BLOCKS, |len| {
        DEFAULT_KV_BLOCKS.max(sequences.saturating_mul(len.div_ceil(KV_BLOCK_SIZE)))
    });
    let fits = memory.map_or(usize::MAX, |m| m / 2 / block_bytes.max(1));
    want.min(fits).max(1)
}

/// The machine's physical memory in bytes, where the system says.
fn physical_memory() -> Option<usize> {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no preconditions.
        let (pages, page) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        usize::try_from(pages)
            .ok()
            .zip(usize::try_from(page).ok())
            .map(|(pages, page)| pages.saturating_mul(page))
            .filter(|&m| m > 0)
    }
    #[cfg(not(unix))]
    None
}

/// A language model on the native backend.
pub struct NativeLm {
    session: NativeSession,
    contract: LmContract,
    shared_kv: bool,
    passes: PassReport,
    seqs: SeqTable<SeqKv>,
    paged: Option<Paged>,
    counters: StepCounters,
    io: IoIndex,
    /// The node computing the logits, when it can compute the last row alone.
    logits_node: Option<usize>,
    /// Inputs and outputs of a run, in declared order; reused so a step allocates nothing.
    in_slots: Vec<Option<Tensor>>,
    out_slots: Vec<Option<Tensor>>,
}

fn backend_error(msg: String) -> RuntimeError {
    RuntimeError::Backend(msg.into())
}

/// Whether every past-KV input is read only by `GroupQueryAttention` nodes (which update a
/// max-length buffer in place).
fn kv_is_shared_buffer(graph: &Graph, contract: &LmContract) -> bool {
    contract
        .layers
        .iter()
        .flat_map(|l| [&l.past_key, &l.past_value])
        .all(|name| {
            let Some(id) = graph.find(name) else {
                return false;
            };
            let readers: Vec<&Op> = graph
                .nodes
                .iter()
                .filter(|n| n.inputs.contains(&Some(id)))
                .map(|n| &n.op)
                .collect();
            !readers.is_empty()
                && readers
                    .iter()
                    .all(|op| matches!(op, Op::GroupQueryAttention(_)))
        })
}

/// A control-flow node that decides from the step's inputs (an `If` on the mask's length, a
/// loop counted by a sequence length). A batched step feeds one mask and one set of ids for
/// every sequence, so such a decision would be one for all of them.
fn batch_wide_decision(graph: &Graph) -> Option<&oxgen_graph::Node> {
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

fn logits_rows(
    t: &Tensor,
    rows: std::ops::Range<usize>,
    vocab: usize,
    out: &mut Vec<f32>,
) -> Result<(), RuntimeError> {
    let range = rows.start * vocab..rows.end * vocab;
    let err = |e: oxgen_tensor::TensorError| backend_error(format!("logits: {e}"));
    match t.dtype() {
        DType::F32 => out.extend_from_slice(&t.as_slice::<f32>().map_err(err)?[range]),
        DType::F16 => out.extend(
            t.as_slice::<f16>().map_err(err)?[range]
                .iter()
                .map(|v| v.to_f32()),
        ),
        DType::BF16 => out.extend(
            t.as_slice::<bf16>().map_err(err)?[range]
                .iter()
                .map(|v| v.to_f32()),
        ),
        other => {
            return Err(backend_error(format!(
                "logits are {other}; expected float32, float16 or bfloat16"
            )));
        }
    }
    Ok(())
}

impl NativeLm {
    /// Opens the graph at `path`: loads it, optimizes it (rotary caches sized to
    /// `options.context_length`), plans it and sizes the paged KV pool once.
    pub fn open(path: &Path, options: &NativeOptions) -> Result<NativeLm, OpenError> {
        let graph = load_graph(path)?;
        NativeLm::from_graph(graph, options).map_err(|source| OpenError::Runtime {
            path: path.display().to_string(),
            source,
        })
    }

    /// Checks that the native backend can load the graph at `path` (every node's op type,
    /// opset and attributes known), without optimizing or planning it.
    pub fn check(path: &Path) -> Result<(), OpenError> {
        load_graph(path).map(drop)
    }

    /// [`NativeLm::open`] on a graph already built (tests build them in memory).
    pub fn from_graph(mut graph: Graph, options: &NativeOptions) -> Result<NativeLm, RuntimeError> {
        if let Some(layers) = options.layers {
            keep_first_layers(&mut graph, layers, &options.kv_names)?;
        }
        let (inputs, outputs) = io_specs(&graph);
        let contract = LmContract::from_io(&inputs, &outputs, &options.kv_names)?;
        let passes = PassOptions {
            enabled: options.optimize,
            context_length: options.context_length,
        };
        let (graph, report) = crate::optimize(graph, Some(&contract), &passes);
        let mut session = match &options.pool {
            Some(pool) => NativeSession::with_pool(graph, pool.clone(), options.exec.exact),
            None => NativeSession::new(graph, &options.exec),
        };
        session.set_weight_budget(options.weight_budget, options.expert_cache);
        let shared_kv = kv_is_shared_buffer(session.graph(), &contract);
        let io = IoIndex::new(&contract, session.inputs(), session.outputs())?;
        let logits_node = session.row_wise_producer(io.logits);
        let layer_of_node = attention_layers(session.graph(), &contract).filter(|_| shared_kv);
        if let (Some(_), Some(node)) = (&layer_of_node, batch_wide_decision(session.graph())) {
            return Err(RuntimeError::Contract(format!(
                "{} decides from the step's inputs, which a batched step shares between \
                 sequences; the native backend rewrites only LongRoPE's cache choice (with graph \
                 optimizations on); use --backend ort for this graph",
                node.node_ref()
            )));
        }
        let paged = match layer_of_node {
            Some(layer_of_node) => Some(Paged::new(&contract, layer_of_node, options)?),
            None => match options.kv_dtype {
                Some(kv) if kv != contract.graph_kv_dtype() => {
                    return Err(RuntimeError::Contract(format!(
                        "this graph's attention cannot read a paged KV cache, so its KV stays \
                         {} (its past inputs' dtype); drop --kv-dtype {kv}",
                        contract.graph_kv_dtype()
                    )));
                }
                _ => None,
            },
        };
        Ok(NativeLm {
            logits_node,
            in_slots: vec![None; session.inputs().len()],
            out_slots: vec![None; session.outputs().len()],
            session,
            contract,
            shared_kv,
            passes: report,
            seqs: SeqTable::default(),
            paged,
            counters: StepCounters::default(),
            io,
        })
    }

    /// What the graph passes did at load.
    pub fn pass_report(&self) -> &PassReport {
        &self.passes
    }

    /// The graph as it runs (after the passes).
    pub fn graph(&self) -> &Graph {
        self.session.graph()
    }

    /// Whether KV is updated in place (paged, or context-sized buffers) rather than grown.
    pub fn shared_kv(&self) -> bool {
        self.shared_kv
    }

    /// Whether KV is paged and a batch runs as one forward.
    pub fn paged(&self) -> bool {
        self.paged.is_some()
    }

    fn count(&mut self, forwards: u64, tokens: usize) {
        let c = &mut self.counters;
        c.forwards += forwards;
        c.tokens += tokens as u64;
    }

    /// One forward over every step of `batch` (see the module doc).
    fn step_paged(&mut self, batch: &Batch, out: &mut StepLogits) -> Result<(), RuntimeError> {
        for (i, step) in batch.steps.iter().enumerate() {
            self.seqs.check(step)?;
            if batch.steps[..i].iter().any(|s| s.seq == step.seq) {
                return Err(RuntimeError::Sequence(
                    step.seq.0,
                    "appears twice in one batch".into(),
                ));
            }
        }
        let p = self.paged.as_mut().expect("called for a paged model");
        let (c, io, session) = (&self.contract, &self.io, &mut self.session);
        p.segments.clear();
        p.tables.clear();
        p.rows.clear();
        let mut row = 0;
        for step in batch.steps {
            let n = step.tokens.len();
            let slot = self.seqs.get_mut(step.seq).expect("checked above");
            let SeqKv::Paged { table, .. } = &mut slot.kv else {
                unreachable!("a paged model holds paged sequences")
            };
            p.pool.prepare_write(table, step.pos, step.pos + n)?;
            let first = p.tables.len();
            p.tables.extend_from_slice(&table.blocks);
            p.segments.push(Segment {
                rows: row..row + n,
                start: step.pos,
                table: first..p.tables.len(),
            });
            match step.logits {
                LogitsWanted::Last => p.rows.push(row + n - 1),
                LogitsWanted::All => p.rows.extend(row..row + n),
                LogitsWanted::None => {}
            }
            row += n;
        }
        for copy in p.pool.take_copies() {
            p.store.copy_block(copy.src, copy.dst);
        }
        let tokens = row;
        let token = |i: usize| {
            let s = p.segments.partition_point(|s| s.rows.end <= i);
            let step = &batch.steps[s];
            (
                step.tokens[i - p.segments[s].rows.start],
                step.pos + i - p.segments[s].rows.start,
            )
        };
        let slots = &mut self.in_slots;
        slots[io.input_ids] = Some(int_tensor(session, c.input_ids_dtype, tokens, &|i| {
            i64::from(token(i).0)
        })?);
        if let (Some(index), Some((_, dtype))) = (io.attention_mask, &c.attention_mask) {
            slots[index] = Some(int_tensor(session, *dtype, tokens, &|_| 1)?);
        }
        if let (Some(index), Some((_, dtype))) = (io.position_ids, &c.position_ids) {
            slots[index] = Some(int_tensor(session, *dtype, tokens, &|i| token(i).1 as i64)?);
        }
        for (&(ki, vi), kv) in io.past.iter().zip(p.empty.iter_mut()) {
            slots[ki] = kv[0].take();
            slots[vi] = kv[1].take();
        }
        session.set_rows_only(self.logits_node, &p.rows);
        let mut paged = PagedStep {
            store: &mut p.store,
            segments: &p.segments,
            tables: &p.tables,
            layer_of_node: &p.layer_of_node,
        };
        let result = session.run_ordered_paged(slots, &mut self.out_slots, Some(&mut paged));
        if let Err(e) = result {
            // Nothing advanced: the sequences keep their lengths, and what the run wrote past
            // them is overwritten by the next step.
            self.in_slots.iter_mut().for_each(|s| *s = None);
            self.out_slots.iter_mut().for_each(|s| *s = None);
            p.empty = fresh_kv(c, false, 0)?;
            return Err(match e {
                ExecError::Runtime(r) => r,
                other => RuntimeError::Backend(Box::new(other)),
            });
        }
        for (&(ki, vi), kv) in io.present.iter().zip(p.empty.iter_mut()) {
            *kv = [self.out_slots[ki].take(), self.out_slots[vi].take()];
        }
        if p.empty.iter().flatten().any(Option::is_none) {
            p.empty = fresh_kv(c, false, 0)?;
        }
        let logits = self.out_slots[io.logits]
            .take()
            .ok_or_else(|| backend_error(format!("the run returned no '{}'", c.logits)))?;
        let copied = copy_rows(&logits, batch, &p.rows, tokens, out);
        // Rows the graph computed for exactly the wanted tokens are read in place; the
        // tensor comes back at the next step.
        let unheld = match copied {
            Ok(true) => out.hold(logits).err(),
            _ => Some(logits),
        };
        if let Some(logits) = unheld {
            self.session.recycle(logits);
        }
        for t in self.out_slots.iter_mut().filter_map(Option::take) {
            self.session.recycle(t);
        }
        copied?;
        for step in batch.steps {
            let slot = self.seqs.get_mut(step.seq).expect("checked above");
            let end = step.pos + step.tokens.len();
            slot.len = end;
            if let SeqKv::Paged { table, ids } = &mut slot.kv {
                ids.truncate(step.pos);
                ids.extend_from_slice(step.tokens);
                if p.prefix_cache {
                    let settled = ids.len() - step.proposed.min(step.tokens.len());
                    p.pool.register_full(table, &ids[..settled]);
                }
            }
        }
        self.count(1, tokens);
        Ok(())
    }

    fn step_one(&mut self, step: &SeqStep, out: &mut StepLogits) -> Result<(), RuntimeError> {
        let seq_err = |msg: String| RuntimeError::Sequence(step.seq.0, msg);
        let end = self.seqs.check(step)?;
        let n = step.tokens.len();
        // Inputs come from the session's arena and go back to it after the run, so a step
        // that repeats earlier shapes allocates nothing.
        let (c, io, session) = (&self.contract, &self.io, &mut self.session);
        let slots = &mut self.in_slots;
        slots[io.input_ids] = Some(int_tensor(session, c.input_ids_dtype, n, &|i| {
            i64::from(step.tokens[i])
        })?);
        if let (Some(index), Some((_, dtype))) = (io.attention_mask, &c.attention_mask) {
            slots[index] = Some(int_tensor(session, *dtype, end, &|_| 1)?);
        }
        if let (Some(index), Some((_, dtype))) = (io.position_ids, &c.position_ids) {
            slots[index] = Some(int_tensor(session, *dtype, n, &|i| (step.pos + i) as i64)?);
        }
        let state = self.seqs.get_mut(step.seq).expect("checked above");
        let SeqKv::Dense(kv) = &mut state.kv else {
            unreachable!("a dense model holds dense sequences")
        };
        for (&(ki, vi), kv) in io.past.iter().zip(kv.iter_mut()) {
            let (k, v) = (kv[0].take(), kv[1].take());
            let (Some(k), Some(v)) = (k, v) else {
                return Err(seq_err("its KV was lost by an earlier failed step".into()));
            };
            let (k, v) = if self.shared_kv {
                (k, v)
            } else {
                (truncate(k, step.pos)?, truncate(v, step.pos)?)
            };
            self.in_slots[ki] = Some(k);
            self.in_slots[vi] = Some(v);
        }
        // A prompt chunk that wants the last token's logits computes only that row of the
        // output head.
        let last_row = !matches!(step.logits, LogitsWanted::All) && n > 1;
        self.session
            .set_rows_only(self.logits_node.filter(|_| last_row), &[n - 1]);
        let result = self
            .session
            .run_ordered(&mut self.in_slots, &mut self.out_slots);
        let state = self
            .seqs
            .get_mut(step.seq)
            .expect("the sequence was found above");
        if let Err(e) = result {
            // The KV went into the failed run: start the sequence over rather than keep a
            // cache that may be half written.
            self.in_slots.iter_mut().for_each(|s| *s = None);
            self.out_slots.iter_mut().for_each(|s| *s = None);
            state.len = 0;
            state.kv = SeqKv::Dense(fresh_kv(c, self.shared_kv, state.ctx_size)?);
            return Err(match e {
                ExecError::Runtime(r) => r,
                other => RuntimeError::Backend(Box::new(other)),
            });
        }
        let want = if self.shared_kv { state.ctx_size } else { end };
        let SeqKv::Dense(kv) = &mut state.kv else {
            unreachable!("a dense model holds dense sequences")
        };
        for (names, (&(ki, vi), kv)) in c.layers.iter().zip(io.present.iter().zip(kv.iter_mut())) {
            let (Some(k), Some(v)) = (self.out_slots[ki].take(), self.out_slots[vi].take()) else {
                return Err(backend_error(format!(
                    "the run returned no '{}' / '{}'",
                    names.present_key, names.present_value
                )));
            };
            if k.dims().get(2) != Some(&want) || v.dims().get(2) != Some(&want) {
                return Err(backend_error(format!(
                    "'{}' has shape {}, expected {want} positions",
                    names.present_key,
                    k.shape()
                )));
            }
            *kv = [Some(k), Some(v)];
        }
        state.len = end;
        let logits = self.out_slots[io.logits]
            .take()
            .ok_or_else(|| backend_error(format!("the run returned no '{}'", c.logits)))?;
        let copied = copy_logits(&logits, step, out);
        self.session.recycle(logits);
        for t in self.out_slots.iter_mut().filter_map(Option::take) {
            self.session.recycle(t);
        }
        self.count(1, n);
        copied
    }
}

/// A `[1, len]` integer input of `dtype` (int32 or int64) from the session's arena, element
/// `i` being `value(i)`.
fn int_tensor(
    session: &mut NativeSession,
    dtype: DType,
    len: usize,
    value: &dyn Fn(usize) -> i64,
) -> Result<Tensor, RuntimeError> {
    let err = |e: String| backend_error(e);
    let mut t = session
        .alloc_input(dtype, &[1, len])
        .map_err(|e| err(e.to_string()))?;
    match dtype {
        DType::I32 => {
            let s = t.as_mut_slice::<i32>().map_err(|e| err(e.to_string()))?;
            for (i, v) in s.iter_mut().enumerate() {
                *v = value(i) as i32;
            }
        }
        _ => {
            let s = t.as_mut_slice::<i64>().map_err(|e| err(e.to_string()))?;
            for (i, v) in s.iter_mut().enumerate() {
                *v = value(i);
            }
        }
    }
    Ok(t)
}

/// For each layer, the one `GroupQueryAttention` node reading its past key and value (as
/// inputs 3 and 4); `None` unless every layer has exactly one such node and no other node reads
/// them (the condition for paging).
fn attention_layers(graph: &Graph, c: &LmContract) -> Option<Vec<Option<usize>>> {
    let mut layer_of_node = vec![None; graph.nodes.len()];
    for (l, names) in c.layers.iter().enumerate() {
        let (k, v) = (graph.find(&names.past_key)?, graph.find(&names.past_value)?);
        let mut readers = graph
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.inputs.contains(&Some(k)) || n.inputs.contains(&Some(v)));
        let (i, node) = readers.next()?;
        let reads_both =
            node.inputs.get(3) == Some(&Some(k)) && node.inputs.get(4) == Some(&Some(v));
        if readers.next().is_some()
            || !reads_both
            || !matches!(node.op, Op::GroupQueryAttention(_))
            || layer_of_node[i].is_some()
        {
            return None;
        }
        layer_of_node[i] = Some(l);
    }
    Some(layer_of_node)
}

/// Appends to `out` the logits rows each step of `batch` wants from the `logits` of a
/// stacked batch of `tokens` rows, which holds either those rows or only rows `rows`. When
/// it holds only those, in f32, they are already `out`'s rows: nothing is copied and the
/// result is `true` (the caller has `out` hold the tensor).
fn copy_rows(
    logits: &Tensor,
    batch: &Batch,
    rows: &[usize],
    tokens: usize,
    out: &mut StepLogits,
) -> Result<bool, RuntimeError> {
    let (have, vocab) = match logits.dims() {
        [1, r, v] => (*r, *v),
        other => {
            return Err(backend_error(format!(
                "logits have shape {other:?}; expected [1, tokens, vocab]"
            )));
        }
    };
    let selected = have == rows.len();
    if !selected && have != tokens {
        return Err(backend_error(format!(
            "the graph returns {have} logits rows for {tokens} tokens"
        )));
    }
    out.vocab = vocab;
    let in_place = selected && logits.dtype() == DType::F32;
    let mut next = 0;
    for step in batch.steps {
        let want = match step.logits {
            LogitsWanted::Last => 1,
            LogitsWanted::All => step.tokens.len(),
            LogitsWanted::None => 0,
        };
        out.rows.push(next..next + want);
        for &r in &rows[next..next + want] {
            let r = if selected { next } else { r };
            if !in_place {
                logits_rows(logits, r..r + 1, vocab, &mut out.data)?;
            }
            next += 1;
        }
    }
    Ok(in_place)
}

/// Appends the rows `step` wants from a `[1, sequence, vocab]` logits tensor to `out`.
fn copy_logits(logits: &Tensor, step: &SeqStep, out: &mut StepLogits) -> Result<(), RuntimeError> {
    let rows = out.rows_for(step, logits.dims())?;
    let vocab = out.vocab;
    logits_rows(logits, rows, vocab, &mut out.data)
}

/// Where each contract name sits among the session's declared inputs and outputs.
struct IoIndex {
    input_ids: usize,
    attention_mask: Option<usize>,
    position_ids: Option<usize>,
    /// Per layer: past key and value input positions.
    past: Vec<(usize, usize)>,
    /// Per layer: present key and value output positions.
    present: Vec<(usize, usize)>,
    logits: usize,
}

impl IoIndex {
    fn new(c: &LmContract, inputs: &[IoSpec], outputs: &[IoSpec]) -> Result<IoIndex, RuntimeError> {
        let find = |specs: &[IoSpec], name: &str| {
            specs.iter().position(|s| s.name == name).ok_or_else(|| {
                backend_error(format!(
                    "the optimized graph lost its '{name}' input or output"
                ))
            })
        };
        let (i, o) = (|n: &str| find(inputs, n), |n: &str| find(outputs, n));
        Ok(IoIndex {
            input_ids: i(&c.input_ids)?,
            attention_mask: c.attention_mask.as_ref().map(|(n, _)| i(n)).transpose()?,
            position_ids: c.position_ids.as_ref().map(|(n, _)| i(n)).transpose()?,
            past: c
                .layers
                .iter()
                .map(|l| Ok((i(&l.past_key)?, i(&l.past_value)?)))
                .collect::<Result<_, RuntimeError>>()?,
            present: c
                .layers
                .iter()
                .map(|l| Ok((o(&l.present_key)?, o(&l.present_value)?)))
                .collect::<Result<_, RuntimeError>>()?,
            logits: o(&c.logits)?,
        })
    }
}

/// An empty cache for every layer: context-sized buffers when shared, zero positions otherwise.
fn fresh_kv(
    c: &LmContract,
    shared: bool,
    ctx_size: usize,
) -> Result<Vec<[Option<Tensor>; 2]>, RuntimeError> {
    let len = if shared { ctx_size } else { 0 };
    let kv = || {
        Tensor::zeros(c.kv_dtype, [1, c.kv_heads, len, c.head_size])
            .map_err(|e| backend_error(e.to_string()))
    };
    c.layers
        .iter()
        .map(|_| Ok([Some(kv()?), Some(kv()?)]))
        .collect()
}

/// The first `len` positions of a `[1, heads, positions, head_size]` cache.
fn truncate(t: Tensor, len: usize) -> Result<Tensor, RuntimeError> {
    let dims = t.dims().to_vec();
    if dims[2] == len {
        return Ok(t);
    }
    let (heads, have, width) = (dims[1], dims[2], dims[3] * t.dtype().bits() / 8);
    let bytes = t.as_bytes();
    let mut out = Vec::with_capacity(heads * len * width);
    for h in 0..heads {
        let start = h * have * width;
        out.extend_from_slice(&bytes[start..start + len * width]);
    }
    Tensor::from_buf(
        t.dtype(),
        [1, heads, len, dims[3]],
        oxgen_tensor::AlignedBuf::from_bytes(&out),
    )
    .map_err(|e| backend_error(e.to_string()))
}

impl LanguageModel for NativeLm {
    fn backend(&self) -> &'static str {
        "native"
    }

    fn contract(&self) -> &LmContract {
        &self.contract
    }

    fn sequence_count(&self) -> usize {
        self.seqs.count()
    }

    fn set_profiling(&mut self, on: bool) {
        self.session.set_profiling(on);
    }

    fn op_times(&self) -> Vec<OpTime> {
        self.session.op_times()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fused_decode: self.paged.is_some(),
            fused_prefill_with_past: self.paged.is_some(),
        }
    }

    fn add_sequence(&mut self, ctx_size: usize) -> Result<SeqId, RuntimeError> {
        self.start_sequence(ctx_size, &[]).map(|(seq, _)| seq)
    }

    fn start_sequence(
        &mut self,
        ctx_size: usize,
        prompt: &[u32],
    ) -> Result<(SeqId, usize), RuntimeError> {
        check_context(ctx_size)?;
        let Some(p) = &mut self.paged else {
            let kv = fresh_kv(&self.contract, self.shared_kv, ctx_size)?;
            return Ok((self.seqs.add(ctx_size, SeqKv::Dense(kv)), 0));
        };
        let mut table = p.pool.reserve(ctx_size)?;
        let cached = if p.prefix_cache {
            p.pool
                .attach_prefix(&mut table, prompt, prompt.len().saturating_sub(1))
        } else {
            0
        };
        let mut ids = Vec::with_capacity(ctx_size);
        ids.extend_from_slice(&prompt[..cached]);
        let seq = self.seqs.add(ctx_size, SeqKv::Paged { table, ids });
        self.seqs.get_mut(seq).expect("just added").len = cached;
        Ok((seq, cached))
    }

    fn remove_sequence(&mut self, seq: SeqId) {
        if let Some(slot) = self.seqs.take(seq)
            && let (SeqKv::Paged { table, .. }, Some(p)) = (slot.kv, &mut self.paged)
        {
            p.pool.release(table);
        }
    }

    fn sequence_len(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(seq).map(|s| s.len)
    }

    fn step(&mut self, batch: &Batch, out: &mut StepLogits) -> Result<(), RuntimeError> {
        if let Some(logits) = out.take_held() {
            self.session.recycle(logits);
        }
        out.clear();
        self.counters.steps += 1;
        if self.paged.is_some() {
            return self.step_paged(batch, out);
        }
        for step in batch.steps {
            self.step_one(step, out)?;
        }
        Ok(())
    }

    fn kv_usage(&self) -> Option<KvUsage> {
        self.paged.as_ref().map(|p| p.pool.usage())
    }

    fn kv_dtype(&self) -> KvDtype {
        self.paged
            .as_ref()
            .map_or(self.contract.graph_kv_dtype(), |p| p.store.kv_dtype())
    }

    fn counters(&self) -> StepCounters {
        // The kernels keep the weight bytes count; summed here, when asked, not every step.
        let ops = self.session.op_counters();
        StepCounters {
            weight_bytes: self.session.streamed_weight_bytes(),
            moe_layers: ops.moe_layers,
            moe_experts: ops.moe_experts,
            moe_routes: ops.moe_routes,
            experts: self.session.expert_residency(),
            ..self.counters
        }
    }
}

#[cfg(test)]
mod kv_budget_tests {
    use super::*;

    #[test]
    fn the_default_kv_pool_fits_in_half_the_memory() {
        const GIB: usize = 1 << 30;
        // Two sequences of 4096 positions: 512 blocks, raised to the default's 1024.
        assert_eq!(
            sequence_blocks(2, Some(4096), 1 << 20, Some(24 * GIB)),
            1024
        );
        // Two of 131072 (16384 blocks of 3.7 MB, Llama 3.2 3B's f32 KV): 60 GB; 24 GB of
        // memory holds 3510 of them in its half.
        let block = 28 * 8 * 128 * 2 * 4 * KV_BLOCK_SIZE;
        assert_eq!(
            sequence_blocks(2, Some(131072), block, Some(24 * GIB)),
            12 * GIB / block
        );
        // Unknown memory: what the context asks for; unknown context: the default.
        assert_eq!(sequence_blocks(2, Some(131072), block, None), 16384);
        assert_eq!(sequence_blocks(2, None, block, Some(24 * GIB)), 1024);
        // Never none.
        assert_eq!(sequence_blocks(2, Some(131072), block, Some(1 << 20)), 1);
    }
}
