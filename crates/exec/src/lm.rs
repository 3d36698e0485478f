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

use std::collections::HashMap;

use oxgen_graph::passes::{Options as PassOptions, Report as PassReport};
use oxgen_graph::{Graph, Op, ValueId};
use oxgen_runtime::{
    Batch, IoSpec, KvTemplates, LanguageModel, LmContract, LogitsWanted, RuntimeError, SeqId,
    SeqStep, Session, StepLogits,
};
use oxgen_tensor::{DType, Tensor, bf16, f16};

use crate::{ExecOptions, NativeSession};

struct SeqState {
    len: usize,
    max_context: usize,
    /// Per layer: key and value.
    kv: Vec<(Tensor, Tensor)>,
}

/// A language model on the native backend.
pub struct NativeLm {
    session: NativeSession,
    contract: LmContract,
    shared_kv: bool,
    passes: PassReport,
    seqs: HashMap<SeqId, SeqState>,
    next_id: u64,
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

fn int_tensor(
    dtype: DType,
    shape: [usize; 2],
    values: impl Iterator<Item = i64>,
) -> Result<Tensor, RuntimeError> {
    let t = match dtype {
        DType::I32 => Tensor::from_slice(shape, &values.map(|v| v as i32).collect::<Vec<_>>()),
        _ => Tensor::from_slice(shape, &values.collect::<Vec<_>>()),
    };
    t.map_err(|e| backend_error(e.to_string()))
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
        Ok(NativeLm {
            session,
            contract,
            shared_kv,
            passes: report,
            seqs: HashMap::new(),
            next_id: 0,
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
    pub fn shared_kv(&self) -> bool {
        self.shared_kv
    }

    fn step_one(&mut self, step: &SeqStep, out: &mut StepLogits) -> Result<(), RuntimeError> {
        let seq_err = |msg: String| RuntimeError::Sequence(step.seq.0, msg);
        let state = self
            .seqs
            .get_mut(&step.seq)
            .ok_or_else(|| seq_err("no such sequence".into()))?;
        let n = step.tokens.len();
        if n == 0 {
            return Err(seq_err("a step needs at least one token".into()));
        }
        if step.pos > state.len {
            return Err(seq_err(format!(
                "position {} is past the sequence's length {}",
                step.pos, state.len
            )));
        }
        let end = step.pos + n;
        if end > state.max_context {
            return Err(seq_err(format!(
                "{end} positions exceed the context of {} this sequence was added with",
                state.max_context
            )));
        }
        let c = &self.contract;
        let mut inputs = vec![(
            c.input_ids.clone(),
            int_tensor(
                c.input_ids_dtype,
                [1, n],
                step.tokens.iter().map(|&t| t as i64),
            )?,
        )];
        if let Some((name, dtype)) = &c.attention_mask {
            inputs.push((
                name.clone(),
                int_tensor(*dtype, [1, end], std::iter::repeat_n(1, end))?,
            ));
        }
        if let Some((name, dtype)) = &c.position_ids {
            inputs.push((
                name.clone(),
                int_tensor(*dtype, [1, n], (step.pos..end).map(|p| p as i64))?,
            ));
        }
        let kv = std::mem::take(&mut state.kv);
        for (names, (k, v)) in c.layers.iter().zip(kv) {
            let (k, v) = if self.shared_kv {
                (k, v)
            } else {
                (truncate(k, step.pos)?, truncate(v, step.pos)?)
            };
            inputs.push((names.past_key.clone(), k));
            inputs.push((names.past_value.clone(), v));
        }
        let result = self.session.run(inputs);
        let state = self
            .seqs
            .get_mut(&step.seq)
            .expect("the sequence was found above");
        let mut outputs: HashMap<String, Tensor> = match result {
            Ok(o) => o.into_iter().collect(),
            Err(e) => {
                // The KV went into the failed run: start the sequence over rather than keep a
                // cache that may be half written.
                state.len = 0;
                state.kv = fresh_kv(c, self.shared_kv, state.max_context)?;
                return Err(e);
            }
        };
        for names in &c.layers {
            let (Some(k), Some(v)) = (
                outputs.remove(&names.present_key),
                outputs.remove(&names.present_value),
            ) else {
                return Err(backend_error(format!(
                    "the run returned no '{}' / '{}'",
                    names.present_key, names.present_value
                )));
            };
            let want = if self.shared_kv {
                state.max_context
            } else {
                end
            };
            if k.dims().get(2) != Some(&want) || v.dims().get(2) != Some(&want) {
                return Err(backend_error(format!(
                    "'{}' has shape {}, expected {want} positions",
                    names.present_key,
                    k.shape()
                )));
            }
            state.kv.push((k, v));
        }
        state.len = end;
        let logits = outputs
            .get(&c.logits)
            .ok_or_else(|| backend_error(format!("the run returned no '{}'", c.logits)))?;
        let (rows_in_output, vocab) = match logits.dims() {
            [1, s, v] => (*s, *v),
            [1, v] => (1, *v),
            other => {
                return Err(backend_error(format!(
                    "logits have shape {other:?}; expected [1, sequence, vocab]"
                )));
            }
        };
        if out.vocab != 0 && out.vocab != vocab {
            return Err(backend_error(format!(
                "logits width {vocab} differs from this batch's {}",
                out.vocab
            )));
        }
        out.vocab = vocab;
        let rows = match step.logits {
            LogitsWanted::None => 0..0,
            LogitsWanted::Last => rows_in_output - 1..rows_in_output,
            LogitsWanted::All if rows_in_output == n => 0..n,
            LogitsWanted::All => {
                return Err(backend_error(format!(
                    "the graph returns {rows_in_output} logits rows for {n} tokens"
                )));
            }
        };
        let first = out.data.len() / vocab.max(1);
        out.rows.push(first..first + rows.len());
        logits_rows(logits, rows, vocab, &mut out.data)
    }
}

/// An empty cache for every layer: context-sized buffers when shared, zero positions otherwise.
fn fresh_kv(
    c: &LmContract,
    shared: bool,
    max_context: usize,
) -> Result<Vec<(Tensor, Tensor)>, RuntimeError> {
    let len = if shared { max_context } else { 0 };
    let kv = || {
        Tensor::zeros(c.kv_dtype, [1, c.kv_heads, len, c.head_size])
            .map_err(|e| backend_error(e.to_string()))
    };
    c.layers.iter().map(|_| Ok((kv()?, kv()?))).collect()
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
        if max_context == 0 {
            return Err(backend_error(
                "a sequence needs a context of at least one position".into(),
            ));
        }
        let kv = fresh_kv(&self.contract, self.shared_kv, max_context)?;
        let id = SeqId(self.next_id);
        self.next_id += 1;
        self.seqs.insert(
            id,
            SeqState {
                len: 0,
                max_context,
                kv,
            },
        );
        Ok(id)
    }

    fn remove_sequence(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
    }

    fn sequence_len(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(&seq).map(|s| s.len)
    }

    fn step(&mut self, batch: &Batch, out: &mut StepLogits) -> Result<(), RuntimeError> {
        out.vocab = 0;
        out.rows.clear();
        out.data.clear();
        for step in batch.steps {
            self.step_one(step, out)?;
        }
        Ok(())
    }
}
