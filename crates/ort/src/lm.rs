//! A language model stepped through ONNX Runtime, each sequence's KV bound across steps.

use std::path::Path;

use half::{bf16, f16};
use ort::value::DynTensor;
use oxgen_runtime::{
    Batch, Capabilities, KvTemplates, LanguageModel, LmContract, RuntimeError, SeqId, SeqStep,
    SeqTable, StepLogits, check_context,
};
use oxgen_tensor::DType;

use crate::session::{io_spec, open_session};
use crate::{OrtError, element_type, into_tensor, ort_bytes};

/// A decoder-only language model run by ONNX Runtime.
pub struct OrtLm {
    session: ort::session::Session,
    contract: LmContract,
    shared_kv: bool,
    /// The smallest shared KV buffer onnxruntime takes: the largest window of a layer with a
    /// window-sized cache (`sliding_window_cache = 1`), else 0.
    min_capacity: usize,
    /// Per sequence and layer: key and value. Shared-buffer graphs: `[1, heads, ctx_size, size]`, written in place by the run; otherwise the last run's present (`len` positions).
    seqs: SeqTable<Vec<[DynTensor; 2]>>,
}

fn err(e: impl std::fmt::Display) -> RuntimeError {
    OrtError::Ort(e.to_string()).into()
}

/// How ONNX Runtime opens a language model.
#[derive(Debug, Clone, Default)]
pub struct OrtOptions {
    /// ONNX Runtime's shared library (else `ORT_DYLIB_PATH`, else the Python wheel's).
    pub lib: Option<std::path::PathBuf>,
    /// Intra-op threads; 0 uses every core.
    pub threads: usize,
    /// How the graph names its KV inputs and outputs.
    pub kv_names: KvTemplates,
}

/// Whether every past-KV input is read only by `GroupQueryAttention` nodes, which may share
/// one context-sized buffer between past and present (the rule native applies to its own
/// graph after its passes; ONNX Runtime runs the graph as written).
fn shared_kv(graph: &oxgen_onnx::proto::GraphProto, contract: &LmContract) -> bool {
    let only_gqa = |name: &str| {
        let mut readers = (graph.node.iter())
            .filter(|n| n.input.iter().any(|i| i == name))
            .peekable();
        readers.peek().is_some() && readers.all(|n| n.op_type() == "GroupQueryAttention")
    };
    (contract.layers.iter()).all(|l| only_gqa(&l.past_key) && only_gqa(&l.past_value))
}

/// The largest `local_window_size` of a `GroupQueryAttention` with `sliding_window_cache = 1`
/// (onnxruntime refuses a KV buffer smaller than that window), or 0.
fn window_capacity(graph: &oxgen_onnx::proto::GraphProto) -> usize {
    let attr = |n: &oxgen_onnx::proto::NodeProto, name: &str| {
        (n.attribute.iter())
            .find(|a| a.name() == name)
            .map_or(0, |a| a.i())
    };
    (graph.node.iter())
        .filter(|n| n.op_type() == "GroupQueryAttention" && attr(n, "sliding_window_cache") == 1)
        .map(|n| usize::try_from(attr(n, "local_window_size")).unwrap_or(0))
        .max()
        .unwrap_or(0)
}

impl OrtLm {
    /// Opens the graph at `model`. Past and present KV share one context-sized buffer when
    /// the graph's attention is `GroupQueryAttention` (which updates it in place).
    pub fn open(model: &Path, options: &OrtOptions) -> Result<OrtLm, RuntimeError> {
        let graph = oxgen_onnx::Model::load(model).map_err(|e| {
            RuntimeError::Backend(format!("loading {}: {e}", model.display()).into())
        })?;
        let session = open_session(model, options.lib.as_deref(), options.threads)?;
        let inputs: Vec<_> = session.inputs().iter().map(io_spec).collect();
        let outputs: Vec<_> = session.outputs().iter().map(io_spec).collect();
        let contract = LmContract::from_io(&inputs, &outputs, &options.kv_names)?;
        Ok(OrtLm {
            shared_kv: shared_kv(graph.graph(), &contract),
            min_capacity: window_capacity(graph.graph()),
            session,
            contract,
            seqs: SeqTable::default(),
        })
    }

    /// Whether past and present KV share one buffer per layer.
    pub fn shared_kv(&self) -> bool {
        self.shared_kv
    }

    /// A `[1, heads, positions, size]` KV tensor.
    fn kv_tensor(&self, positions: usize) -> Result<DynTensor, RuntimeError> {
        let c = &self.contract;
        let dims = [1, c.kv_heads as i64, positions as i64, c.head_size as i64];
        DynTensor::new(self.session.allocator(), element_type(c.kv_dtype), dims).map_err(err)
    }

    /// An integer input `[1, len]`.
    fn int_input(
        &self,
        dtype: DType,
        len: usize,
        value: impl Fn(usize) -> i64,
    ) -> Result<DynTensor, RuntimeError> {
        let mut t = DynTensor::new(
            self.session.allocator(),
            element_type(dtype),
            [1, len as i64],
        )
        .map_err(err)?;
        if len > 0 {
            let ptr = t.data_ptr_mut();
            // SAFETY: the tensor was just allocated with `len` elements of `dtype`.
            unsafe {
                match dtype {
                    DType::I32 => {
                        let s = std::slice::from_raw_parts_mut(ptr.cast::<i32>(), len);
                        s.iter_mut()
                            .enumerate()
                            .for_each(|(i, v)| *v = value(i) as i32);
                    }
                    DType::I64 => {
                        let s = std::slice::from_raw_parts_mut(ptr.cast::<i64>(), len);
                        s.iter_mut().enumerate().for_each(|(i, v)| *v = value(i));
                    }
                    other => {
                        return Err(err(format!(
                            "integer inputs must be int32 or int64, this one is {other}"
                        )));
                    }
                }
            }
        }
        Ok(t)
    }

    /// The first `len` positions of a concatenated-KV tensor (a step that rewinds).
    fn truncate(&self, t: &DynTensor, len: usize) -> Result<DynTensor, RuntimeError> {
        let (dtype, dims, bytes) = ort_bytes(t)?;
        let c = &self.contract;
        let [1, heads, have, size] = dims[..] else {
            return Err(err(format!("a present KV output has shape {dims:?}")));
        };
        if heads != c.kv_heads || size != c.head_size || have < len {
            return Err(err(format!(
                "a present KV output has shape {dims:?}, expected [1, {}, >= {len}, {}]",
                c.kv_heads, c.head_size
            )));
        }
        let width = size * dtype.bits() / 8;
        let mut out = self.kv_tensor(len)?;
        if len * width > 0 {
            // SAFETY: `out` holds heads × len × width bytes, the source heads × have × width.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(out.data_ptr_mut().cast::<u8>(), heads * len * width)
            };
            for h in 0..heads {
                let src = &bytes[h * have * width..][..len * width];
                dst[h * len * width..][..len * width].copy_from_slice(src);
            }
        }
        Ok(out)
    }

    /// KV for a new (or restarted) sequence: a shared buffer of `ctx_size` positions, or of
    /// a window when that is larger (the positions past `ctx_size` are never used).
    fn fresh_kv(&self, ctx_size: usize) -> Result<Vec<[DynTensor; 2]>, RuntimeError> {
        let positions = if self.shared_kv {
            ctx_size.max(self.min_capacity)
        } else {
            0
        };
        (0..self.contract.layers.len())
            .map(|_| Ok([self.kv_tensor(positions)?, self.kv_tensor(positions)?]))
            .collect()
    }

    fn step_one(&mut self, step: &SeqStep, out: &mut StepLogits) -> Result<(), RuntimeError> {
        let end = self.seqs.check(step)?;
        let result = self.run_step(step, end, out);
        if result.is_err() {
            // As on native: the KV went into a failed run, so the sequence starts over rather
            // than keep a cache that may be half written.
            let ctx_size = self.seqs.get(step.seq).expect("checked above").ctx_size;
            let kv = self.fresh_kv(ctx_size)?;
            let slot = self.seqs.get_mut(step.seq).expect("checked above");
            (slot.len, slot.kv) = (0, kv);
        }
        result
    }

    fn run_step(
        &mut self,
        step: &SeqStep,
        end: usize,
        out: &mut StepLogits,
    ) -> Result<(), RuntimeError> {
        let state = self.seqs.get(step.seq).expect("checked above");
        let n = step.tokens.len();
        let c = &self.contract;
        let mut binding = self.session.create_binding().map_err(err)?;
        let ids = self.int_input(c.input_ids_dtype, n, |i| step.tokens[i] as i64)?;
        binding.bind_input(&c.input_ids, &ids).map_err(err)?;
        if let Some((name, dtype)) = &c.attention_mask {
            let mask = self.int_input(*dtype, end, |_| 1)?;
            binding.bind_input(name, &mask).map_err(err)?;
        }
        if let Some((name, dtype)) = &c.position_ids {
            let positions = self.int_input(*dtype, n, |i| (step.pos + i) as i64)?;
            binding.bind_input(name, &positions).map_err(err)?;
        }
        let cpu = ort::memory::MemoryInfo::new(
            ort::memory::AllocationDevice::CPU,
            0,
            ort::memory::AllocatorType::Device,
            ort::memory::MemoryType::Default,
        )
        .map_err(err)?;
        // A rewinding step on concatenated KV starts from a truncated copy.
        if !self.shared_kv && step.pos < state.len {
            let truncated = state
                .kv
                .iter()
                .map(|[k, v]| Ok([self.truncate(k, step.pos)?, self.truncate(v, step.pos)?]))
                .collect::<Result<Vec<_>, RuntimeError>>()?;
            self.seqs.get_mut(step.seq).expect("checked above").kv = truncated;
        }
        let state = self.seqs.get_mut(step.seq).expect("checked above");
        for (names, [k, v]) in c.layers.iter().zip(state.kv.iter_mut()) {
            binding.bind_input(&names.past_key, &*k).map_err(err)?;
            binding.bind_input(&names.past_value, &*v).map_err(err)?;
            if self.shared_kv {
                // Present is the same buffer: the run appends in place.
                binding
                    .bind_output(&names.present_key, &mut *k)
                    .map_err(err)?;
                binding
                    .bind_output(&names.present_value, &mut *v)
                    .map_err(err)?;
            } else {
                binding
                    .bind_output_to_device(&names.present_key, &cpu)
                    .map_err(err)?;
                binding
                    .bind_output_to_device(&names.present_value, &cpu)
                    .map_err(err)?;
            }
        }
        binding
            .bind_output_to_device(&c.logits, &cpu)
            .map_err(err)?;
        let mut outputs = self.session.run_binding(&binding).map_err(err)?;
        let logits = outputs
            .remove(&c.logits)
            .ok_or_else(|| err(format!("the run returned no '{}'", c.logits)))?;
        copy_logits(&into_tensor(logits)?, step, out)?;
        if !self.shared_kv {
            for (names, kv) in c.layers.iter().zip(state.kv.iter_mut()) {
                let mut take = |name: &str| {
                    outputs
                        .remove(name)
                        .ok_or_else(|| err(format!("the run returned no '{name}'")))
                        .and_then(|v| into_tensor(v).map_err(RuntimeError::from))
                };
                *kv = [take(&names.present_key)?, take(&names.present_value)?];
            }
        }
        state.len = end;
        Ok(())
    }
}

/// Appends the rows `step` wants from `[1, sequence, vocab]` logits to `out`.
fn copy_logits(
    logits: &DynTensor,
    step: &SeqStep,
    out: &mut StepLogits,
) -> Result<(), RuntimeError> {
    let (dtype, dims, bytes) = ort_bytes(logits)?;
    let rows = out.rows_for(step, &dims)?;
    let vocab = out.vocab;
    let size = dtype.bits() / 8;
    let bytes = &bytes[rows.start * vocab * size..rows.end * vocab * size];
    match dtype {
        DType::F32 => out.data.extend(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        DType::F16 => out.data.extend(
            bytes
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        DType::BF16 => out.data.extend(
            bytes
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        other => {
            return Err(err(format!(
                "logits are {other}; expected float32, float16 or bfloat16"
            )));
        }
    }
    Ok(())
}

impl LanguageModel for OrtLm {
    fn backend(&self) -> &'static str {
        "ort"
    }

    fn contract(&self) -> &LmContract {
        &self.contract
    }

    fn sequence_count(&self) -> usize {
        self.seqs.count()
    }

    fn add_sequence(&mut self, ctx_size: usize) -> Result<SeqId, RuntimeError> {
        check_context(ctx_size)?;
        let kv = self.fresh_kv(ctx_size)?;
        Ok(self.seqs.add(ctx_size, kv))
    }

    fn remove_sequence(&mut self, seq: SeqId) {
        self.seqs.remove(seq);
    }

    fn sequence_len(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(seq).map(|s| s.len)
    }

    /// One sequence per run: onnxruntime's `GroupQueryAttention` refuses a multi-token step
    /// with past KV at batch > 1, and sequences of different lengths would need padding.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fused_decode: false,
            fused_prefill_with_past: false,
        }
    }

    fn step(&mut self, batch: &Batch, out: &mut StepLogits) -> Result<(), RuntimeError> {
        out.clear();
        // See `capabilities`: each sequence runs alone.
        for step in batch.steps {
            self.step_one(step, out)?;
        }
        Ok(())
    }
}
