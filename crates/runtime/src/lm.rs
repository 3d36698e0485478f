//! The language-model seam: the I/O contract read from a graph, and `step` over a batch.
//!
//! A backend owns each sequence's KV cache, sized to the context asked for when the sequence
//! is added; callers hold [`SeqId`]s. One `step` runs token spans of one or more sequences
//! (prefill chunks or single decode tokens) and returns the logits rows asked for.

use oxgen_tensor::{DType, Tensor};

use crate::{Dim, IoSpec, KvDtype, KvUsage, RuntimeError};

/// The names of one layer's KV inputs and outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvNames {
    pub past_key: String,
    pub past_value: String,
    pub present_key: String,
    pub present_value: String,
}

/// How to feed a decoder-only language model graph, read from its declared inputs/outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LmContract {
    pub input_ids: String,
    pub input_ids_dtype: DType,
    pub attention_mask: Option<(String, DType)>,
    pub position_ids: Option<(String, DType)>,
    pub logits: String,
    /// One entry per layer, in layer order.
    pub layers: Vec<KvNames>,
    pub kv_heads: usize,
    pub head_size: usize,
    pub kv_dtype: DType,
    /// Vocabulary size when the logits output declares it.
    pub vocab_size: Option<usize>,
}

/// Names a layered input or output: `template` holds `%d` where the layer index goes
/// (onnxruntime-genai's `genai_config.json` convention).
fn layer_name(template: &str, layer: usize) -> String {
    template.replace("%d", &layer.to_string())
}

/// The templates of KV names, as onnxruntime-genai packages and optimum exports spell them.
#[derive(Debug, Clone)]
pub struct KvTemplates {
    pub past_key: String,
    pub past_value: String,
    pub present_key: String,
    pub present_value: String,
    /// KV heads and head size from the package's config, used where the graph declares them
    /// symbolically (onnxruntime-genai's builder names the head size `kv_cache_dim`).
    pub kv_heads: Option<usize>,
    pub head_size: Option<usize>,
}

impl Default for KvTemplates {
    fn default() -> Self {
        KvTemplates {
            past_key: "past_key_values.%d.key".into(),
            past_value: "past_key_values.%d.value".into(),
            present_key: "present.%d.key".into(),
            present_value: "present.%d.value".into(),
            kv_heads: None,
            head_size: None,
        }
    }
}

impl LmContract {
    /// Bytes of KV that `positions` positions of one sequence hold across every layer in a
    /// cache of `kv` (saturating).
    pub fn kv_bytes(&self, kv: KvDtype, positions: usize) -> usize {
        [2, self.kv_heads, positions, kv.head_bytes(self.head_size)]
            .iter()
            .fold(self.layers.len(), |n, &f| n.saturating_mul(f))
    }

    /// The graph's own KV dtype (checked by [`LmContract::from_io`]: a float).
    pub fn graph_kv_dtype(&self) -> KvDtype {
        KvDtype::of(self.kv_dtype).expect("the contract holds a float KV dtype")
    }

    /// Reads the contract from a graph's declared inputs and outputs. `input_ids`,
    /// `attention_mask`, `position_ids` and `logits` are the names used; KV names follow
    /// `kv`. Fails naming what is missing.
    pub fn from_io(
        inputs: &[IoSpec],
        outputs: &[IoSpec],
        kv: &KvTemplates,
    ) -> Result<LmContract, RuntimeError> {
        let find_in = |name: &str| inputs.iter().find(|s| s.name == name);
        let find_out = |name: &str| outputs.iter().find(|s| s.name == name);
        let missing = |what: &str| {
            let names: Vec<&str> = inputs.iter().map(|s| s.name.as_str()).collect();
            RuntimeError::Contract(format!(
                "the graph has no {what} (its inputs are: {})",
                names.join(", ")
            ))
        };
        let ids = find_in("input_ids").ok_or_else(|| missing("'input_ids' input"))?;
        let input_ids_dtype = ids
            .dtype
            .filter(|d| matches!(d, DType::I64 | DType::I32))
            .ok_or_else(|| {
                RuntimeError::Contract(format!(
                    "input 'input_ids' must be int64 or int32, is {:?}",
                    ids.dtype
                ))
            })?;
        // Optional integer inputs; one of another type is a contract error, not a guess.
        let int_input = |name: &str| -> Result<Option<(String, DType)>, RuntimeError> {
            match find_in(name).map(|s| (s.name.clone(), s.dtype)) {
                None => Ok(None),
                Some((n, Some(d @ (DType::I64 | DType::I32)))) => Ok(Some((n, d))),
                Some((n, d)) => Err(RuntimeError::Contract(format!(
                    "input '{n}' must be int64 or int32, is {d:?}"
                ))),
            }
        };
        let logits = find_out("logits")
            .ok_or_else(|| RuntimeError::Contract("the graph has no 'logits' output".into()))?;
        let vocab_size = match logits.dims.as_deref() {
            Some([.., Dim::Fixed(v)]) => Some(*v),
            _ => None,
        };
        let mut layers = Vec::new();
        let mut kv_shape: Option<(usize, usize, DType)> = None;
        loop {
            let i = layers.len();
            let names = KvNames {
                past_key: layer_name(&kv.past_key, i),
                past_value: layer_name(&kv.past_value, i),
                present_key: layer_name(&kv.present_key, i),
                present_value: layer_name(&kv.present_value, i),
            };
            let Some(past_key) = find_in(&names.past_key) else {
                break;
            };
            for (name, found) in [
                (&names.past_value, find_in(&names.past_value).is_some()),
                (&names.present_key, find_out(&names.present_key).is_some()),
                (
                    &names.present_value,
                    find_out(&names.present_value).is_some(),
                ),
            ] {
                if !found {
                    return Err(RuntimeError::Contract(format!(
                        "layer {i} has '{}' but no '{name}'",
                        names.past_key
                    )));
                }
            }
            // Fixed in the graph, else the config's value.
            let fixed = |d: &Dim, hint: Option<usize>| match d {
                Dim::Fixed(v) => Some(*v),
                _ => hint,
            };
            let shape = match (past_key.dims.as_deref(), past_key.dtype) {
                (Some([_, h, _, d]), Some(dtype)) => fixed(h, kv.kv_heads)
                    .zip(fixed(d, kv.head_size))
                    .map(|(h, d)| (h, d, dtype)),
                _ => None,
            };
            let Some(shape) = shape else {
                return Err(RuntimeError::Contract(format!(
                    "'{}' must be declared [batch, kv_heads, sequence, head_size] with kv_heads \
                     and head_size fixed in the graph or given by the package's config",
                    names.past_key
                )));
            };
            if kv_shape.is_some_and(|s| s != shape) {
                return Err(RuntimeError::Contract(format!(
                    "'{}' differs in shape or dtype from layer 0's KV",
                    names.past_key
                )));
            }
            kv_shape = Some(shape);
            layers.push(names);
        }
        let Some((kv_heads, head_size, kv_dtype)) = kv_shape else {
            return Err(missing(&format!(
                "KV cache inputs named like '{}'",
                kv.past_key
            )));
        };
        if !matches!(kv_dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(RuntimeError::Contract(format!(
                "'{}' is {kv_dtype}; a KV cache input holds float32, float16 or bfloat16",
                layers[0].past_key
            )));
        }
        Ok(LmContract {
            input_ids: ids.name.clone(),
            input_ids_dtype,
            attention_mask: int_input("attention_mask")?,
            position_ids: int_input("position_ids")?,
            logits: logits.name.clone(),
            layers,
            kv_heads,
            head_size,
            kv_dtype,
            vocab_size,
        })
    }
}

/// A sequence whose KV cache lives in a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// Which logits rows a step returns for a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsWanted {
    /// The last token's row (what generation needs).
    Last,
    /// One row per token of the span.
    All,
    None,
}

/// One sequence's part of a step: `tokens` at positions `pos..pos + tokens.len()`. `pos` may be
/// below the sequence's current length (the KV beyond it is overwritten), never above.
#[derive(Debug, Clone, Copy)]
pub struct SeqStep<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
    pub pos: usize,
    pub logits: LogitsWanted,
    /// The last `proposed` tokens are speculative proposals under verification: the next step
    /// may overwrite their KV, so the blocks they fill stay out of the prefix cache.
    pub proposed: usize,
}

/// One sequence a backend holds: positions filled, the context it was added with, and the
/// backend's KV for it.
#[derive(Debug)]
pub struct SeqSlot<K> {
    pub len: usize,
    pub ctx_size: usize,
    pub kv: K,
}

/// Fails for a context of zero positions (before a backend allocates KV for it).
pub fn check_context(ctx_size: usize) -> Result<(), RuntimeError> {
    if ctx_size == 0 {
        return Err(RuntimeError::Backend(
            "a sequence needs a context of at least one position".into(),
        ));
    }
    Ok(())
}

/// The sequences a backend holds, by id.
#[derive(Debug)]
pub struct SeqTable<K> {
    seqs: std::collections::HashMap<SeqId, SeqSlot<K>>,
    next_id: u64,
}

impl<K> Default for SeqTable<K> {
    fn default() -> Self {
        SeqTable {
            seqs: std::collections::HashMap::new(),
            next_id: 0,
        }
    }
}

impl<K> SeqTable<K> {
    /// Adds an empty sequence holding `kv`.
    pub fn add(&mut self, ctx_size: usize, kv: K) -> SeqId {
        let id = SeqId(self.next_id);
        self.next_id += 1;
        self.seqs.insert(
            id,
            SeqSlot {
                len: 0,
                ctx_size,
                kv,
            },
        );
        id
    }

    pub fn remove(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
    }

    /// Removes a sequence and hands back what it held.
    pub fn take(&mut self, seq: SeqId) -> Option<SeqSlot<K>> {
        self.seqs.remove(&seq)
    }

    pub fn get(&self, seq: SeqId) -> Option<&SeqSlot<K>> {
        self.seqs.get(&seq)
    }

    pub fn get_mut(&mut self, seq: SeqId) -> Option<&mut SeqSlot<K>> {
        self.seqs.get_mut(&seq)
    }

    /// Sequences held.
    pub fn count(&self) -> usize {
        self.seqs.len()
    }

    /// Checks `step` against its sequence; returns the position after the span.
    pub fn check(&self, step: &SeqStep) -> Result<usize, RuntimeError> {
        step.check(self.get(step.seq).map(|s| (s.len, s.ctx_size)))
    }
}

impl SeqStep<'_> {
    /// Checks the step against its sequence (`None`: not found), which holds `len`
    /// positions of at most `ctx_size`; returns the position after the span.
    pub fn check(&self, seq: Option<(usize, usize)>) -> Result<usize, RuntimeError> {
        let err = |msg: String| RuntimeError::Sequence(self.seq.0, msg);
        let (len, ctx_size) = seq.ok_or_else(|| err("no such sequence".into()))?;
        if self.tokens.is_empty() {
            return Err(err("a step needs at least one token".into()));
        }
        if self.pos > len {
            return Err(err(format!(
                "position {} is past the sequence's length {len}",
                self.pos
            )));
        }
        let end = self.pos + self.tokens.len();
        if end > ctx_size {
            return Err(err(format!(
                "{end} positions exceed the context of {ctx_size} this sequence was added with"
            )));
        }
        Ok(end)
    }
}

/// One forward over several sequences.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    pub steps: &'a [SeqStep<'a>],
}

/// Logits rows of a step, in batch order, `vocab` floats each.
#[derive(Debug, Clone, Default)]
pub struct StepLogits {
    pub vocab: usize,
    /// For each step of the batch, the range of rows it produced ([`StepLogits::row`]).
    pub rows: Vec<std::ops::Range<usize>>,
    /// The rows a backend copied; empty when it holds its own tensor instead (read rows
    /// through [`StepLogits::row`]).
    pub data: Vec<f32>,
    /// The backend's own f32 logits tensor, when it holds exactly the rows `data` would
    /// (batch order, nothing else): read in place instead of copied (1.5 MB a step at batch
    /// 8 of a 49k vocabulary). The backend takes it back with [`StepLogits::take_held`]
    /// before its next step.
    held: Option<Tensor>,
}

impl StepLogits {
    /// Empties it for the next step (keeping its memory; a held tensor the backend did not
    /// take back is dropped).
    pub fn clear(&mut self) {
        self.vocab = 0;
        self.rows.clear();
        self.data.clear();
        self.held = None;
    }

    /// Reads the rows from `logits` itself (see `held`): an f32 tensor of exactly the rows
    /// recorded so far, `vocab` wide. Gives the tensor back when it is not.
    pub fn hold(&mut self, logits: Tensor) -> Result<(), Tensor> {
        let rows = self.rows.last().map_or(0, |r| r.end);
        if logits.dtype() != DType::F32
            || !self.data.is_empty()
            || logits.numel() != rows * self.vocab
        {
            return Err(logits);
        }
        self.held = Some(logits);
        Ok(())
    }

    /// The tensor [`StepLogits::hold`] took, for its backend to reuse.
    pub fn take_held(&mut self) -> Option<Tensor> {
        self.held.take()
    }

    /// Makes room for `step`'s rows of a logits output shaped `[1, rows, vocab]` (or
    /// `[1, vocab]`): checks the shape and the vocabulary against this batch's, records the
    /// step's rows, and returns which output rows to append to `data`.
    pub fn rows_for(
        &mut self,
        step: &SeqStep,
        dims: &[usize],
    ) -> Result<std::ops::Range<usize>, RuntimeError> {
        let backend = |msg: String| RuntimeError::Backend(msg.into());
        let n = step.tokens.len();
        let (rows_in_output, vocab) = match dims {
            [1, s, v] => (*s, *v),
            [1, v] => (1, *v),
            other => {
                return Err(backend(format!(
                    "logits have shape {other:?}; expected [1, sequence, vocab]"
                )));
            }
        };
        if self.vocab != 0 && self.vocab != vocab {
            return Err(backend(format!(
                "logits width {vocab} differs from this batch's {}",
                self.vocab
            )));
        }
        self.vocab = vocab;
        let rows = match step.logits {
            LogitsWanted::None => 0..0,
            LogitsWanted::Last => rows_in_output.saturating_sub(1)..rows_in_output,
            LogitsWanted::All if rows_in_output == n => 0..n,
            LogitsWanted::All => {
                return Err(backend(format!(
                    "the graph returns {rows_in_output} logits rows for {n} tokens"
                )));
            }
        };
        let first = self.data.len() / vocab.max(1);
        self.rows.push(first..first + rows.len());
        Ok(rows)
    }

    /// Row `r` of step `s`.
    pub fn row(&self, s: usize, r: usize) -> &[f32] {
        let row = self.rows[s].start + r;
        let data = match &self.held {
            // `hold` checked the dtype.
            Some(t) => t.as_slice::<f32>().unwrap_or_default(),
            None => &self.data,
        };
        &data[row * self.vocab..(row + 1) * self.vocab]
    }
}

/// What a backend can run in one forward; a driver adapts to what it cannot (a step over
/// several sequences still works everywhere: a backend without fused runs steps them one by
/// one inside [`LanguageModel::step`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Several sequences' decode tokens in one forward (one pass over the weights).
    pub fused_decode: bool,
    /// A multi-token span of a sequence with past KV inside a fused batch of several
    /// sequences (onnxruntime's `GroupQueryAttention` refuses it).
    pub fused_prefill_with_past: bool,
}

/// Time spent in one op type (`domain::op_type` for non-ONNX domains).
#[derive(Debug, Clone, PartialEq)]
pub struct OpTime {
    pub op_type: String,
    pub calls: u64,
    pub total: std::time::Duration,
}

/// A decoder-only language model stepped token span by token span.
pub trait LanguageModel: Send {
    /// The backend's name (`native`, `ort`).
    fn backend(&self) -> &'static str;
    fn contract(&self) -> &LmContract;
    /// What one forward can hold; by default one sequence per forward.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    /// Adds a sequence whose KV holds up to `ctx_size` positions.
    fn add_sequence(&mut self, ctx_size: usize) -> Result<SeqId, RuntimeError>;
    /// Frees a sequence's KV; unknown ids are ignored.
    fn remove_sequence(&mut self, seq: SeqId);
    /// Positions the sequence's KV holds.
    fn sequence_len(&self, seq: SeqId) -> Option<usize>;
    /// Runs one forward over `batch`, replacing `out` with the logits asked for.
    fn step(&mut self, batch: &Batch, out: &mut StepLogits) -> Result<(), RuntimeError>;
    /// Adds a sequence for `prompt` and fills what it can of its KV from a prefix cache;
    /// returns the sequence and the prompt positions already filled (a prefix of at most
    /// `prompt.len() - 1`, so the last prompt id is always fed). By default nothing is cached.
    ///
    /// With `adapter`, the sequence runs under that LoRA adapter
    /// ([`LanguageModel::load_adapter`]), and only blocks cached under it serve its prefix.
    fn start_sequence(
        &mut self,
        ctx_size: usize,
        prompt: &[u32],
        adapter: Option<crate::AdapterId>,
    ) -> Result<(SeqId, usize), RuntimeError> {
        let _ = prompt;
        if adapter.is_some() {
            return Err(no_adapters(self.backend()));
        }
        Ok((self.add_sequence(ctx_size)?, 0))
    }
    /// Holds a LoRA adapter for sequences to run under; the adapter's modules must all name
    /// projections of this model, with their shapes. By default a backend runs none.
    fn load_adapter(&mut self, adapter: crate::Adapter) -> Result<crate::AdapterId, RuntimeError> {
        let _ = adapter;
        Err(no_adapters(self.backend()))
    }
    /// Drops an adapter: sequences running under it keep it until they are removed.
    fn unload_adapter(&mut self, adapter: crate::AdapterId) {
        let _ = adapter;
    }
    /// Writes the KV `seq` holds to `out`, block by block ([`crate::BlockFormat`]'s
    /// `block_bytes` each, the last block whole), and says how it is laid out; a saved
    /// session. By default a backend cannot (its KV is not paged).
    fn save_kv(
        &mut self,
        seq: SeqId,
        out: &mut dyn std::io::Write,
    ) -> Result<crate::BlockFormat, RuntimeError> {
        let _ = (seq, out);
        Err(RuntimeError::Backend(
            format!(
                "the {} backend cannot save a sequence's KV (only paged KV on the native \
                 backend can)",
                self.backend()
            )
            .into(),
        ))
    }
    /// A sequence of `ctx_size` positions holding the KV of `ids` that
    /// [`LanguageModel::save_kv`] wrote in `format`, read from `input`.
    fn load_kv(
        &mut self,
        ctx_size: usize,
        ids: &[u32],
        format: &crate::BlockFormat,
        input: &mut dyn std::io::Read,
    ) -> Result<SeqId, RuntimeError> {
        let _ = (ctx_size, ids, format, input);
        Err(RuntimeError::Backend(
            format!(
                "the {} backend cannot load a saved sequence's KV (only paged KV on the \
                 native backend can)",
                self.backend()
            )
            .into(),
        ))
    }
    /// Marks `seq`'s prefix-cache blocks to be evicted after unmarked ones (a prompt the
    /// client asked to keep). By default there is no prefix cache to mark.
    fn keep_prefix(&mut self, seq: SeqId) {
        let _ = seq;
    }
    /// What the prefix cache's disk tier did, when there is one.
    fn kv_disk(&self) -> Option<crate::DiskStats> {
        None
    }
    /// How full the paged KV pool is, for a backend that pages its KV.
    fn kv_usage(&self) -> Option<KvUsage> {
        None
    }
    /// What the KV cache stores; by default the graph's KV dtype.
    fn kv_dtype(&self) -> KvDtype {
        self.contract().graph_kv_dtype()
    }
    /// What the steps so far cost.
    fn counters(&self) -> StepCounters {
        StepCounters::default()
    }
    /// Sequences added and not removed.
    fn sequence_count(&self) -> usize;
    /// Times each op type from now on, a little slower (a backend that cannot does nothing).
    fn set_profiling(&mut self, on: bool) {
        let _ = on;
    }
    /// Time per op type since profiling was switched on, most expensive first.
    fn op_times(&self) -> Vec<OpTime> {
        Vec::new()
    }
}

fn no_adapters(backend: &str) -> RuntimeError {
    RuntimeError::Backend(
        format!(
            "the {backend} backend runs no LoRA adapters; open the model with the native \
             backend (--backend native)"
        )
        .into(),
    )
}

/// Work done by a backend's steps since it was loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepCounters {
    /// Calls to [`LanguageModel::step`].
    pub steps: u64,
    /// Graph runs (one per step when the batch is fused, one per sequence otherwise).
    pub forwards: u64,
    /// Tokens fed.
    pub tokens: u64,
    /// Bytes of weight matrices the kernels read, as they count them (a repacked matrix
    /// once per pass over its columns; a batch of up to eight rows is one pass). 0 where the
    /// backend does not measure it (ONNX Runtime).
    pub weight_bytes: u64,
    /// Mixture-of-experts layers run (a MoE node per forward; 0 in a dense model or where
    /// the backend does not count).
    pub moe_layers: u64,
    /// Experts those layers computed: each streamed its weights once for all the tokens
    /// routed to it (so `moe_experts / moe_layers` is the distinct experts per layer-step).
    pub moe_experts: u64,
    /// Token-to-expert routes those layers took (`moe_routes / moe_experts` is how many
    /// tokens shared each expert's weights).
    pub moe_routes: u64,
    /// Which experts' weights were resident when used, under the weight budget.
    pub experts: ExpertResidency,
}

/// The weight budget's account of expert weights (native backend; zeros elsewhere): expert
/// uses whose weights were resident (hits) or read anew (misses, and the bytes they read),
/// experts dropped to stay within the budget, resident bytes now and at most, and the budget
/// (0: none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExpertResidency {
    pub hits: u64,
    pub misses: u64,
    pub miss_bytes: u64,
    pub evictions: u64,
    pub resident_bytes: u64,
    pub peak_bytes: u64,
    pub budget: u64,
}
