//! The native backend as a [`LanguageModel`]: KV caches owned per sequence, fed to the graph
//! as its past inputs and taken back from its present outputs.
//!
//! When every past-KV input feeds a `GroupQueryAttention` node, each sequence gets one
//! buffer per layer sized to its context (`[1, kv_heads, max_context, head_size]`); the node
//! writes new entries in place (the executor donates the buffer) and returns the same buffer as
//! `present`, so a step copies nothing. Other graphs (optimum's `Concat(past, new)`) get the
//! exact-length past and keep the grown present.
//!
//! Graphs are optimized first ([`crate::optimize`]): an optimum export's `Concat(past, new)`
//! attention becomes `GroupQueryAttention`, so it gets the in-place buffers too.
//!
//! Sequences in a batch run one after another through the same graph, so a sequence's logits
//! never depend on what it is batched with.

use oxgen_graph::passes::{Options as PassOptions, Report as PassReport};
use oxgen_graph::{Graph, Op, ValueId};
use oxgen_runtime::{
    Batch, IoSpec, KvTemplates, LanguageModel, LmContract, LogitsWanted, RuntimeError, SeqId,
    SeqStep, SeqTable, Session, StepLogits, check_context,
};
use oxgen_tensor::{DType, Tensor, bf16, f16};

use crate::{ExecError, ExecOptions, NativeSession};

/// A language model on the native backend.
pub struct NativeLm {
    session: NativeSession,
    contract: LmContract,
    shared_kv: bool,
    passes: PassReport,
    /// Per sequence and layer: key and value. Taken while a step runs.
    seqs: SeqTable<Vec<[Option<Tensor>; 2]>>,
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
    /// Wraps a graph that fits the language-model contract (KV names per `kv`), optimized
    /// with the default passes (no rotary caches: see [`NativeLm::with_passes`]).
    pub fn new(
        graph: Graph,
        options: &ExecOptions,
        kv: &KvTemplates,
    ) -> Result<NativeLm, RuntimeError> {
        Self::with_passes(graph, options, kv, &PassOptions::default())
    }

    /// Like [`NativeLm::new`], choosing the passes: `passes.max_positions` should be the
    /// package's context length, so rotary embeddings fold into attention.
    pub fn with_passes(
        graph: Graph,
        options: &ExecOptions,
        kv: &KvTemplates,
        passes: &PassOptions,
    ) -> Result<NativeLm, RuntimeError> {
        let spec = |id: &ValueId| {
            let v = graph.value(*id);
            IoSpec {
                name: v.name.clone(),
                dtype: v.dtype,
                dims: v.dims.clone(),
            }
        };
        let inputs: Vec<IoSpec> = graph.inputs.iter().map(spec).collect();
        let outputs: Vec<IoSpec> = graph.outputs.iter().map(spec).collect();
        let contract = LmContract::from_io(&inputs, &outputs, kv)?;
        let (graph, report) = crate::optimize(graph, Some(&contract), passes);
        let session = NativeSession::new(graph, options);
        let shared_kv = kv_is_shared_buffer(session.graph(), &contract);
        let io = IoIndex::new(&contract, session.inputs(), session.outputs())?;
        let logits_node = session.row_wise_producer(io.logits);
        Ok(NativeLm {
            logits_node,
            in_slots: vec![None; session.inputs().len()],
            out_slots: vec![None; session.outputs().len()],
            session,
            contract,
            shared_kv,
            passes: report,
            seqs: SeqTable::default(),
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

    /// Times each op type from now on (see [`NativeSession::set_profiling`]).
    pub fn set_profiling(&mut self, on: bool) {
        self.session.set_profiling(on);
    }

    /// Time per op type since profiling was switched on, most expensive first.
    pub fn op_times(&self) -> Vec<crate::OpTime> {
        self.session.op_times()
    }

    /// Whether KV lives in context-sized buffers updated in place.
    /// Sequences added and not removed.
    pub fn sequence_count(&self) -> usize {
        self.seqs.count()
    }

    pub fn shared_kv(&self) -> bool {
        self.shared_kv
    }

    fn step_one(&mut self, step: &SeqStep, out: &mut StepLogits) -> Result<(), RuntimeError> {
        let seq_err = |msg: String| RuntimeError::Sequence(step.seq.0, msg);
        let end = self.seqs.check(step)?;
        let n = step.tokens.len();
        let state = self.seqs.get_mut(step.seq).expect("checked above");
        // Inputs come from the session's arena and go back to it after the run, so a step
        // that repeats earlier shapes allocates nothing.
        let (c, io, session) = (&self.contract, &self.io, &mut self.session);
        let slots = &mut self.in_slots;
        let mut int_input =
            |index: usize, dtype: DType, len: usize, value: &dyn Fn(usize) -> i64| {
                let mut t = session
                    .alloc_input(dtype, &[1, len])
                    .map_err(|e| backend_error(e.to_string()))?;
                let err = |e: oxgen_tensor::TensorError| backend_error(e.to_string());
                match dtype {
                    DType::I32 => {
                        for (i, v) in t.as_mut_slice::<i32>().map_err(err)?.iter_mut().enumerate() {
                            *v = value(i) as i32;
                        }
                    }
                    _ => {
                        for (i, v) in t.as_mut_slice::<i64>().map_err(err)?.iter_mut().enumerate() {
                            *v = value(i);
                        }
                    }
                }
                slots[index] = Some(t);
                Ok::<(), RuntimeError>(())
            };
        int_input(io.input_ids, c.input_ids_dtype, n, &|i| {
            step.tokens[i] as i64
        })?;
        if let (Some(index), Some((_, dtype))) = (io.attention_mask, &c.attention_mask) {
            int_input(index, *dtype, end, &|_| 1)?;
        }
        if let (Some(index), Some((_, dtype))) = (io.position_ids, &c.position_ids) {
            int_input(index, *dtype, n, &|i| (step.pos + i) as i64)?;
        }
        for (&(ki, vi), kv) in io.past.iter().zip(state.kv.iter_mut()) {
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
            .set_last_row_only(self.logits_node.filter(|_| last_row));
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
            state.kv = fresh_kv(c, self.shared_kv, state.max_context)?;
            return Err(match e {
                ExecError::Runtime(r) => r,
                other => RuntimeError::Backend(Box::new(other)),
            });
        }
        let want = if self.shared_kv {
            state.max_context
        } else {
            end
        };
        for (names, (&(ki, vi), kv)) in c
            .layers
            .iter()
            .zip(io.present.iter().zip(state.kv.iter_mut()))
        {
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
        copied
    }
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
    max_context: usize,
) -> Result<Vec<[Option<Tensor>; 2]>, RuntimeError> {
    let len = if shared { max_context } else { 0 };
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
    fn contract(&self) -> &LmContract {
        &self.contract
    }

    fn add_sequence(&mut self, max_context: usize) -> Result<SeqId, RuntimeError> {
        check_context(max_context)?;
        let kv = fresh_kv(&self.contract, self.shared_kv, max_context)?;
        Ok(self.seqs.add(max_context, kv))
    }

    fn remove_sequence(&mut self, seq: SeqId) {
        self.seqs.remove(seq);
    }

    fn sequence_len(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(seq).map(|s| s.len)
    }

    fn step(&mut self, batch: &Batch, out: &mut StepLogits) -> Result<(), RuntimeError> {
        out.clear();
        for step in batch.steps {
            self.step_one(step, out)?;
        }
        Ok(())
    }
}
