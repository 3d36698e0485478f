//! A step: one forward over a whole batch on the paged KV cache, or one per sequence on
//! dense KV; and what both share (inputs from the session's arena, logits rows out).

use oxgen_kernels::attention::paged::Segment;
use oxgen_runtime::{Batch, IoSpec, LmContract, LogitsWanted, RuntimeError, SeqStep, StepLogits};
use oxgen_tensor::{DType, Tensor, bf16, f16};

use super::{NativeLm, SeqKv, backend_error};
use crate::kv::PagedStep;
use crate::{ExecError, NativeSession};

impl NativeLm {
    /// One forward over every step of `batch` (see the module doc).
    pub(super) fn step_paged(
        &mut self,
        batch: &Batch,
        out: &mut StepLogits,
    ) -> Result<(), RuntimeError> {
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
        let lora = session.lora_rows();
        lora.clear();
        for (step, segment) in batch.steps.iter().zip(&p.segments) {
            if let Some(a) = self.seq_adapters.get(&step.seq) {
                lora.push(segment.rows.clone(), a);
            }
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
                    p.settle(table, &ids[..settled]);
                }
            }
        }
        self.count(1, tokens);
        Ok(())
    }

    pub(super) fn step_one(
        &mut self,
        step: &SeqStep,
        out: &mut StepLogits,
    ) -> Result<(), RuntimeError> {
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
        let lora = self.session.lora_rows();
        lora.clear();
        if let Some(a) = self.seq_adapters.get(&step.seq) {
            lora.push(0..n, a);
        }
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
pub(super) struct IoIndex {
    pub(super) input_ids: usize,
    pub(super) attention_mask: Option<usize>,
    pub(super) position_ids: Option<usize>,
    /// Per layer: past key and value input positions.
    pub(super) past: Vec<(usize, usize)>,
    /// Per layer: present key and value output positions.
    pub(super) present: Vec<(usize, usize)>,
    pub(super) logits: usize,
}

impl IoIndex {
    pub(super) fn new(
        c: &LmContract,
        inputs: &[IoSpec],
        outputs: &[IoSpec],
    ) -> Result<IoIndex, RuntimeError> {
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
pub(super) fn fresh_kv(
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
