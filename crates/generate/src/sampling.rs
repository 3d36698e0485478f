//! Sampling settings, the one rule that lays a caller's values over a package's defaults, and
//! the seeded token selector.
//!
//! A [`Sampler`] turns one logits row into one token id through a chain of
//! [`LogitsProcessor`]s (`crate::processors`), in this order (the order of Hugging Face
//! transformers' `generate`: processors on raw logits, then warpers):
//!
//! 1. masked ids → −inf, NaN → −inf (a broken row must not panic or win);
//! 2. [`apply_logit_bias`] (OpenAI `logit_bias`);
//! 3. [`apply_repetition_penalty`] (HF `RepetitionPenaltyLogitsProcessor`, over prompt and
//!    generated ids);
//! 4. [`apply_frequency_presence`] (OpenAI `frequency_penalty`/`presence_penalty`, over
//!    generated ids);
//! 5. [`apply_temperature`] (HF `TemperatureLogitsWarper`);
//! 6. [`apply_top_k`] (HF `TopKLogitsWarper`);
//! 7. [`apply_top_p`] (HF `TopPLogitsWarper`);
//! 8. [`apply_min_p`] (HF `MinPLogitsWarper`);
//! 9. selection: argmax when greedy, else one seeded categorical draw.
//!
//! A constraint a caller adds ([`Sampler::push_front`]) runs before step 2. Under greedy
//! selection steps 5–8 are left out: none of them can change the argmax. A processor with its
//! neutral value (temperature 1, top-k 0, top-p 1, min-p 0, penalties 1/0/0, no bias) is not
//! in the chain at all.
//!
//! **Reproducibility.** The RNG is ChaCha8 seeded with `seed_from_u64(seed)`; one draw is
//! `(next_u64() >> 11) · 2⁻⁵³` (uniform in [0, 1), every value exact), and the categorical
//! walk sums `exp(logit − max)` in f64 in index order. So the same seed and logits give the
//! same ids on every platform, up to `f64::exp` itself (libm differences below an ulp can
//! move a draw only when it lands within ~1e-16 of a bucket edge).
//!
//! **Allocation.** The working row, the sort keys and the penalty tables are sized on the
//! first row of a vocabulary and reused: [`Sampler::sample`] and [`Sampler::accept`] allocate
//! nothing afterwards (DESIGN.md invariant 4).
//!
//! **Which values, and greedy or not.** [`SamplingRequest::resolve`] is the one place where
//! values a caller gave (CLI flags, the REPL's `/set`, an HTTP request, a library caller)
//! meet the package's defaults, and where the one rule for turning sampling on lives; the
//! ranges are checked by [`Param::check`] alone.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

use crate::GenerateError;
use crate::processors::{
    FrequencyPresence, History, LogitBias, LogitsProcessor, MAX_TRACKED_ID, MinP, ProcessorState,
    RepetitionPenalty, Temperature, TopK, TopP,
};

/// 2⁻⁵³: scales the top 53 bits of a `u64` to a uniform f64 in [0, 1), every value exact.
const UNIT_53: f64 = 1.0 / (1u64 << 53) as f64;

/// Sampling options. The defaults turn every processor off and sample at temperature 1.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Divides the logits; 0 selects greedily. Finite, >= 0.
    pub temperature: f32,
    /// Keep the `top_k` largest logits (ties with the k-th kept); 0 = off.
    pub top_k: usize,
    /// Nucleus sampling: keep the smallest top set with probability mass >= `top_p`.
    /// In (0, 1]; 1 = off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one. In [0, 1]; 0 = off.
    pub min_p: f32,
    /// HF repetition penalty over the prompt and generated ids. > 0; 1 = off.
    pub repetition_penalty: f32,
    /// OpenAI frequency penalty: minus this per occurrence in the generated ids. In [-2, 2].
    pub frequency_penalty: f32,
    /// OpenAI presence penalty: minus this once for any id generated. In [-2, 2].
    pub presence_penalty: f32,
    /// Added to the raw logit of each id (the first processor). Finite, or −inf to ban it.
    pub logit_bias: Vec<(u32, f32)>,
    /// Seeds the ChaCha8 RNG of categorical selection.
    pub seed: u64,
    /// Always select greedily, whatever the temperature.
    pub greedy: bool,
}

impl Default for SamplingParams {
    fn default() -> SamplingParams {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0,
            greedy: false,
        }
    }
}

/// A float sampling parameter, with its one range check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    Temperature,
    TopP,
    MinP,
    RepetitionPenalty,
    FrequencyPenalty,
    PresencePenalty,
}

impl Param {
    /// Its name, as the CLI flag (with `-`) and the HTTP field spell it.
    pub fn name(self) -> &'static str {
        match self {
            Param::Temperature => "temperature",
            Param::TopP => "top_p",
            Param::MinP => "min_p",
            Param::RepetitionPenalty => "repetition_penalty",
            Param::FrequencyPenalty => "frequency_penalty",
            Param::PresencePenalty => "presence_penalty",
        }
    }

    /// `v` if it is in range; else what is allowed, and which value turns it off.
    pub fn check(self, v: f32) -> Result<f32, String> {
        let ok = match self {
            Param::Temperature => v.is_finite() && v >= 0.0,
            Param::TopP => v > 0.0 && v <= 1.0,
            Param::MinP => (0.0..=1.0).contains(&v),
            Param::RepetitionPenalty => v.is_finite() && v > 0.0,
            Param::FrequencyPenalty | Param::PresencePenalty => (-2.0..=2.0).contains(&v),
        };
        if ok {
            return Ok(v);
        }
        let allowed = match self {
            Param::Temperature => "must be a finite number >= 0 (0 selects greedily)",
            Param::TopP => "must be in (0, 1] (1 turns it off)",
            Param::MinP => "must be in [0, 1] (0 turns it off)",
            Param::RepetitionPenalty => "must be a finite number > 0 (1 turns it off)",
            Param::FrequencyPenalty | Param::PresencePenalty => {
                "must be in [-2, 2] (0 turns it off)"
            }
        };
        Err(format!("{} = {v}: {allowed}", self.name()))
    }
}

impl SamplingParams {
    /// Checks every value; the error names the parameter, its value and the allowed range.
    pub fn validate(&self) -> Result<(), GenerateError> {
        for (param, v) in [
            (Param::Temperature, self.temperature),
            (Param::TopP, self.top_p),
            (Param::MinP, self.min_p),
            (Param::RepetitionPenalty, self.repetition_penalty),
            (Param::FrequencyPenalty, self.frequency_penalty),
            (Param::PresencePenalty, self.presence_penalty),
        ] {
            param.check(v).map_err(GenerateError::Sampling)?;
        }
        for &(id, b) in &self.logit_bias {
            if b.is_nan() || b == f32::INFINITY {
                return Err(GenerateError::Sampling(format!(
                    "logit_bias for token {id} = {b}: must be a finite number, or -inf to ban the token"
                )));
            }
        }
        Ok(())
    }

    /// Greedy selection: `greedy`, temperature 0, or top_k 1.
    pub fn is_greedy(&self) -> bool {
        self.greedy || self.temperature == 0.0 || self.top_k == 1
    }
}

/// Sampling values a caller gave (CLI flags, the REPL's `/set`, an HTTP request), each
/// `None` when not given, to lay over a package's defaults with [`SamplingRequest::resolve`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingRequest {
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    /// Added to the package's bias, if it has one.
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: Option<u64>,
    /// Generations asked for of one prompt (an HTTP request's `n`; 0 counts as 1).
    pub choices: usize,
    /// Always select greedily (`--greedy`).
    pub greedy: bool,
}

impl SamplingRequest {
    /// Whether the values given turn sampling on: any of temperature > 0, top_k, top_p,
    /// min_p, seed, or more than one choice.
    pub fn asks_to_sample(&self) -> bool {
        self.temperature.is_some_and(|t| t > 0.0)
            || self.top_k.is_some()
            || self.top_p.is_some()
            || self.min_p.is_some()
            || self.seed.is_some()
            || self.choices > 1
    }

    /// The package's `defaults` with these values laid over them, by one rule (the same for
    /// the CLI, the REPL, the library and the server): a request that
    /// [asks to sample](Self::asks_to_sample) samples, at its own temperature or else the
    /// package's (1 where the package's is 0, its way of saying greedy); `temperature: 0` or
    /// `greedy` always selects greedily; a request that asks for neither decodes as the
    /// package says. Without a seed, `fresh_seed` seeds the draw. Every value is checked.
    pub fn resolve(
        &self,
        defaults: &SamplingParams,
        fresh_seed: u64,
    ) -> Result<SamplingParams, GenerateError> {
        let mut s = defaults.clone();
        if self.asks_to_sample() {
            s.greedy = false;
            if s.temperature == 0.0 {
                s.temperature = 1.0;
            }
        }
        if let Some(t) = self.temperature {
            if t == 0.0 {
                s.greedy = true;
            } else {
                s.temperature = t;
            }
        }
        s.top_k = self.top_k.unwrap_or(s.top_k);
        s.top_p = self.top_p.unwrap_or(s.top_p);
        s.min_p = self.min_p.unwrap_or(s.min_p);
        s.repetition_penalty = self.repetition_penalty.unwrap_or(s.repetition_penalty);
        s.frequency_penalty = self.frequency_penalty.unwrap_or(s.frequency_penalty);
        s.presence_penalty = self.presence_penalty.unwrap_or(s.presence_penalty);
        s.logit_bias.extend_from_slice(&self.logit_bias);
        s.seed = self.seed.unwrap_or(fresh_seed);
        s.greedy |= self.greedy;
        s.validate()?;
        Ok(s)
    }
}

/// A seed nobody chose, different on every call: the clock and a per-process random hash.
pub fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

/// The logits-processor chain and the seeded selection for one sequence. Holds its scratch
/// buffers, so sampling a token allocates nothing once warmed up for a vocabulary size.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    /// In order; built from `params` (see the module doc), plus any pushed in front.
    chain: Vec<Box<dyn LogitsProcessor>>,
    /// The working copy of the logits row that the chain edits.
    row: Vec<f32>,
    /// `exp(logit − max)` per id, for a categorical draw.
    weights: Vec<f64>,
    history: History,
}

/// The chain `params` asks for: its non-neutral processors, without the warpers under greedy
/// selection.
fn chain_of(p: &SamplingParams) -> Vec<Box<dyn LogitsProcessor>> {
    let mut chain: Vec<Box<dyn LogitsProcessor>> = Vec::new();
    if !p.logit_bias.is_empty() {
        chain.push(Box::new(LogitBias(p.logit_bias.clone())));
    }
    if p.repetition_penalty != 1.0 {
        chain.push(Box::new(RepetitionPenalty(p.repetition_penalty)));
    }
    if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
        chain.push(Box::new(FrequencyPresence {
            frequency: p.frequency_penalty,
            presence: p.presence_penalty,
        }));
    }
    if p.is_greedy() {
        return chain;
    }
    if p.temperature != 1.0 {
        chain.push(Box::new(Temperature(p.temperature)));
    }
    if p.top_k > 0 {
        chain.push(Box::new(TopK::new(p.top_k)));
    }
    if p.top_p < 1.0 {
        chain.push(Box::new(TopP::new(p.top_p)));
    }
    if p.min_p > 0.0 {
        chain.push(Box::new(MinP(p.min_p)));
    }
    chain
}

impl Sampler {
    /// Validates `params`; the RNG is ChaCha8 seeded with `seed_from_u64(params.seed)`.
    pub fn new(params: SamplingParams) -> Result<Sampler, GenerateError> {
        params.validate()?;
        Ok(Sampler {
            rng: ChaCha8Rng::seed_from_u64(params.seed),
            chain: chain_of(&params),
            params,
            row: Vec::new(),
            weights: Vec::new(),
            history: History::default(),
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Puts `processor` first in the chain, before the bias and penalties (where a grammar
    /// constraint goes: on raw logits, so nothing after it can pick what it forbids).
    pub fn push_front(&mut self, processor: Box<dyn LogitsProcessor>) {
        self.chain.insert(0, processor);
    }

    /// Starts a new sequence: forgets generated-token counts, counts `prompt` ids for the
    /// repetition penalty, resets every processor, and reseeds the RNG, so a reset sampler
    /// draws exactly what a new one would.
    pub fn reset(&mut self, prompt: &[u32]) {
        self.history.reset(prompt);
        for p in &mut self.chain {
            p.reset(prompt);
        }
        self.rng = ChaCha8Rng::seed_from_u64(self.params.seed);
    }

    /// Chooses the next id from one logits row. `masked` ids can never be chosen: their
    /// logit is −inf before the chain (EOS under `ignore_eos`, say). Does not record the
    /// choice (see [`Sampler::accept`]). Greedy selection draws no random number.
    ///
    /// A row where nothing can be chosen (all −inf or NaN, or everything masked) gives the
    /// first unmasked id, or 0; an empty row gives 0.
    pub fn sample(&mut self, logits: &[f32], masked: &[u32]) -> u32 {
        self.history
            .ensure(logits.len().min(MAX_TRACKED_ID as usize));
        let greedy = self.params.is_greedy();
        // Greedy with no processor that could move the argmax: pick it from the row as it
        // is, unless the winner is masked (then the whole chain below decides).
        if greedy
            && self.chain.iter().all(|p| !p.moves_argmax())
            && let Some(i) = argmax(logits).filter(|&i| !masked.contains(&(i as u32)))
        {
            return i as u32;
        }
        self.row.clear();
        self.row.extend_from_slice(logits);
        for &id in masked {
            if let Some(v) = self.row.get_mut(id as usize) {
                *v = f32::NEG_INFINITY;
            }
        }
        sanitize(&mut self.row);
        for p in &mut self.chain {
            p.apply(&mut self.row, &self.history);
        }
        let chosen = if greedy {
            argmax(&self.row)
        } else {
            categorical(&self.row, &mut self.weights, &mut self.rng)
        };
        let chosen = chosen.unwrap_or_else(|| {
            (0..logits.len())
                .find(|&i| !masked.contains(&(i as u32)))
                .unwrap_or(0)
        });
        chosen as u32
    }

    /// The first processor's state that is not [`ProcessorState::Running`]: a constraint
    /// that is complete or failed.
    pub fn state(&self) -> ProcessorState {
        (self.chain.iter())
            .map(|p| p.state())
            .find(|s| *s != ProcessorState::Running)
            .unwrap_or(ProcessorState::Running)
    }

    /// Tells the chain how many ids the sequence may still generate, the coming choice
    /// included.
    pub fn room(&mut self, left: usize) {
        for p in &mut self.chain {
            p.room(left);
        }
    }

    /// Records a generated id (for the penalties, and any processor that keeps state).
    pub fn accept(&mut self, id: u32) {
        self.history.accept(id);
        for p in &mut self.chain {
            p.accept(id);
        }
    }

    /// Applies the chain (bias → repetition → frequency/presence → temperature → top-k →
    /// top-p → min-p) to `logits` in place, NaN becoming −inf and filtered ids −inf. Under
    /// greedy selection it stops after the penalties, as [`Sampler::sample`] does.
    pub fn process(&mut self, logits: &mut [f32]) {
        sanitize(logits);
        for p in &mut self.chain {
            p.apply(logits, &self.history);
        }
    }
}

/// NaN → −inf: a NaN compares false with everything and would otherwise slip through filters.
fn sanitize(row: &mut [f32]) {
    for v in row {
        if v.is_nan() {
            *v = f32::NEG_INFINITY;
        }
    }
}

/// Index of the largest logit above −inf, the first on ties; `None` when there is none.
/// NaN never compares greater, so it is never chosen. The maximum is found sixteen lanes at
/// a time (max is exact in any order), then its first index.
fn argmax(row: &[f32]) -> Option<usize> {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = row.chunks_exact(16);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            if v > *m {
                *m = v;
            }
        }
    }
    let max = lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    if max == f32::NEG_INFINITY {
        return None;
    }
    row.iter().position(|&v| v == max)
}

/// One draw from `softmax(row)`: weights `exp(logit − max)` in f64, a uniform `u` from the
/// top 53 bits of one `next_u64`, then the first index whose running weight sum exceeds
/// `u · total`, walking in index order. `None` when every logit is −inf.
fn categorical(row: &[f32], weights: &mut Vec<f64>, rng: &mut ChaCha8Rng) -> Option<usize> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return None;
    }
    if max == f32::INFINITY {
        return row.iter().position(|&v| v == f32::INFINITY);
    }
    weights.clear();
    weights.extend(row.iter().map(|&v| {
        if v == f32::NEG_INFINITY {
            0.0
        } else {
            (v as f64 - max as f64).exp()
        }
    }));
    let total: f64 = weights.iter().sum();
    let u = (rng.next_u64() >> 11) as f64 * UNIT_53;
    let target = u * total;
    let mut running = 0.0;
    for (i, &w) in weights.iter().enumerate() {
        running += w;
        if running > target {
            return Some(i);
        }
    }
    // `u · total` rounded up to `total`: the draw belongs to the last possible token.
    weights.iter().rposition(|&w| w > 0.0)
}
