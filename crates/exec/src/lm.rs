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
//! context-sized buffers updated in place.) Both step paths stay: the dense one is how a
//! graph whose attention the passes cannot fuse runs at all, since only a
//! `GroupQueryAttention` node per layer knows how to read a block pool.
//!
//! Which layout a graph gets is [`oxgen_graph::Index::kv_layout`]'s call; the pool is sized
//! in `pool.rs`, the steps are in `step.rs`.
//!
//! Graphs are optimized first ([`crate::optimize`]): an optimum export's `Concat(past, new)`
//! attention becomes `GroupQueryAttention`, so it is paged too.

mod pool;
mod step;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use oxgen_graph::passes::{Options as PassOptions, Report as PassReport};
use oxgen_graph::{Graph, Index, KvLayout, decides_from_inputs};
use oxgen_runtime::{
    Adapter, AdapterId, Batch, BlockTable, Capabilities, KvDtype, KvUsage, LanguageModel,
    LmContract, OpTime, RuntimeError, SeqId, SeqTable, Session, StepCounters, StepLogits,
    check_context,
};
use oxgen_tensor::Tensor;

use self::pool::Paged;
use self::step::{IoIndex, fresh_kv};
use crate::NativeSession;
use crate::lora::{Loaded, Sites};
use crate::open::{NativeOptions, OpenError, io_specs, keep_first_layers, load_graph};

/// One sequence's KV.
enum SeqKv {
    /// Per layer: key and value. Taken while a step runs.
    Dense(Vec<[Option<Tensor>; 2]>),
    /// Blocks of the pool, and the ids they hold (for the prefix cache).
    Paged { table: BlockTable, ids: Vec<u32> },
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
    /// LoRA adapters: where the graph's projections are (`None`: the model was opened
    /// without room for adapters), the adapters held by id, and each sequence's.
    sites: Option<Sites>,
    adapters: Vec<Option<Arc<Loaded>>>,
    seq_adapters: HashMap<SeqId, Arc<Loaded>>,
}

fn backend_error(msg: String) -> RuntimeError {
    RuntimeError::Backend(msg.into())
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
            keep_projections: options.adapters,
            context_length: options.context_length,
        };
        let (graph, report) = crate::optimize(graph, Some(&contract), &passes);
        let mut session = match &options.pool {
            Some(pool) => NativeSession::with_pool(graph, pool.clone(), options.exec.exact),
            None => NativeSession::new(graph, &options.exec),
        };
        session.set_weight_budget(options.memory.weight_budget, options.memory.expert_cache);
        let io = IoIndex::new(&contract, session.inputs(), session.outputs())?;
        let graph = session.graph();
        let index = Index::new(graph);
        let logits_node = index.row_wise_producer(graph, io.logits);
        let past: Vec<[&str; 2]> = (contract.layers.iter())
            .map(|l| [l.past_key.as_str(), l.past_value.as_str()])
            .collect();
        let layout = index.kv_layout(graph, &past);
        let kv_width = contract.kv_heads * contract.head_size;
        let sites = (options.adapters).then(|| Sites::new(graph, kv_width, logits_node));
        let shared_kv = layout.in_place();
        let layer_of_node = match layout {
            KvLayout::Paged { layer_of_node } => Some(layer_of_node),
            _ => None,
        };
        if let (Some(_), Some(node)) = (&layer_of_node, decides_from_inputs(graph)) {
            return Err(RuntimeError::Contract(format!(
                "{} decides from the step's inputs, which a batched step shares between \
                 sequences; the native backend rewrites only LongRoPE's cache choice (with graph \
                 optimizations on); use --backend ort for this graph",
                node.node_ref()
            )));
        }
        // A KV dtype the graph cannot keep (it is not paged) is refused by the facade, which
        // opens every backend; this one keeps the graph's own then.
        let paged = match layer_of_node {
            Some(layer_of_node) => {
                session.page_kv(&layer_of_node);
                Some(Paged::new(&contract, options)?)
            }
            None => None,
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
            sites,
            adapters: Vec::new(),
            seq_adapters: HashMap::new(),
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

    /// Adapter `id`, when held.
    fn adapter(&self, id: AdapterId) -> Result<&Arc<Loaded>, RuntimeError> {
        self.adapters
            .get(id.0 as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| backend_error(format!("no LoRA adapter {} is loaded", id.0)))
    }

    fn count(&mut self, forwards: u64, tokens: usize) {
        let c = &mut self.counters;
        c.forwards += forwards;
        c.tokens += tokens as u64;
    }
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
        self.start_sequence(ctx_size, &[], None).map(|(seq, _)| seq)
    }

    fn start_sequence(
        &mut self,
        ctx_size: usize,
        prompt: &[u32],
        adapter: Option<AdapterId>,
    ) -> Result<(SeqId, usize), RuntimeError> {
        check_context(ctx_size)?;
        let adapter = match adapter {
            None => None,
            Some(id) => Some(self.adapter(id)?.clone()),
        };
        let Some(p) = &mut self.paged else {
            let kv = fresh_kv(&self.contract, self.shared_kv, ctx_size)?;
            let seq = self.seqs.add(ctx_size, SeqKv::Dense(kv));
            if let Some(a) = adapter {
                self.seq_adapters.insert(seq, a);
            }
            return Ok((seq, 0));
        };
        let mut table = p.pool.reserve(ctx_size)?;
        if let Some(a) = &adapter {
            table.set_root(a.key);
        }
        let cached = if p.prefix_cache {
            p.attach_prefix(&mut table, prompt, prompt.len().saturating_sub(1))
        } else {
            0
        };
        let mut ids = Vec::with_capacity(ctx_size);
        ids.extend_from_slice(&prompt[..cached]);
        let seq = self.seqs.add(ctx_size, SeqKv::Paged { table, ids });
        self.seqs.get_mut(seq).expect("just added").len = cached;
        if let Some(a) = adapter {
            self.seq_adapters.insert(seq, a);
        }
        Ok((seq, cached))
    }

    fn load_adapter(&mut self, adapter: Adapter) -> Result<AdapterId, RuntimeError> {
        let Some(sites) = &self.sites else {
            return Err(backend_error(
                "this model was opened without room for LoRA adapters (its gate and up \
                 projections are fused); open it with adapters allowed (--lora or --max-loras)"
                    .into(),
            ));
        };
        let loaded = Arc::new(sites.place(adapter)?);
        let id = match self.adapters.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                self.adapters.push(None);
                self.adapters.len() - 1
            }
        };
        self.adapters[id] = Some(loaded);
        Ok(AdapterId(id as u32))
    }

    fn unload_adapter(&mut self, adapter: AdapterId) {
        if let Some(slot) = self.adapters.get_mut(adapter.0 as usize) {
            *slot = None;
        }
    }

    fn remove_sequence(&mut self, seq: SeqId) {
        self.seq_adapters.remove(&seq);
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

    fn save_kv(
        &mut self,
        seq: SeqId,
        out: &mut dyn std::io::Write,
    ) -> Result<oxgen_runtime::BlockFormat, RuntimeError> {
        let (Some(p), Some(slot)) = (&mut self.paged, self.seqs.get(seq)) else {
            return Err(backend_error(format!(
                "sequence {} has no paged KV to save (the graph's KV is not paged, or the \
                 sequence is gone)",
                seq.0
            )));
        };
        let SeqKv::Paged { table, .. } = &slot.kv else {
            unreachable!("a paged model holds paged sequences")
        };
        let mut block = vec![0; p.format.block_bytes];
        for &b in &table.blocks[..slot.len.div_ceil(p.format.block_size)] {
            p.store.read_block(b, &mut block);
            out.write_all(&block)
                .map_err(|e| RuntimeError::Backend(Box::new(e)))?;
        }
        Ok(p.format)
    }

    fn load_kv(
        &mut self,
        ctx_size: usize,
        ids: &[u32],
        format: &oxgen_runtime::BlockFormat,
        input: &mut dyn std::io::Read,
    ) -> Result<SeqId, RuntimeError> {
        check_context(ctx_size)?;
        let Some(p) = &mut self.paged else {
            return Err(backend_error(
                "this graph's KV is not paged; a saved KV cannot be loaded into it".into(),
            ));
        };
        if *format != p.format || ids.is_empty() || ids.len() > ctx_size {
            return Err(backend_error(format!(
                "the saved KV ({} positions of {format:?}) does not fit this model's cache \
                 ({:?}, {ctx_size} positions)",
                ids.len(),
                p.format
            )));
        }
        let mut table = p.pool.reserve(ctx_size)?;
        let mut block = vec![0; format.block_bytes];
        let filled = p
            .pool
            .prepare_write(&mut table, 0, ids.len())
            .and_then(|()| {
                for &b in &table.blocks {
                    input
                        .read_exact(&mut block)
                        .map_err(|e| RuntimeError::Backend(Box::new(e)))?;
                    p.store.write_block(b, &block);
                }
                Ok(())
            });
        if let Err(e) = filled {
            p.pool.release(table);
            return Err(e);
        }
        if p.prefix_cache {
            p.settle(&mut table, ids);
        }
        let mut held = Vec::with_capacity(ctx_size);
        held.extend_from_slice(ids);
        let seq = self.seqs.add(ctx_size, SeqKv::Paged { table, ids: held });
        self.seqs.get_mut(seq).expect("just added").len = ids.len();
        Ok(seq)
    }

    fn keep_prefix(&mut self, seq: SeqId) {
        if let (Some(slot), Some(p)) = (self.seqs.get_mut(seq), &mut self.paged)
            && let SeqKv::Paged { table, .. } = &mut slot.kv
        {
            p.pool.keep(table);
        }
    }

    fn kv_disk(&self) -> Option<oxgen_runtime::DiskStats> {
        let disk = self.paged.as_ref()?.disk.as_ref()?;
        Some(disk.stats())
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
