//! Logits processors and the seeded token selector.
//!
//! A [`Sampler`] turns one logits row into one token id through a fixed chain, in this order
//! (the order of Hugging Face transformers' `generate`: processors on raw logits, then warpers):
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
//! Filtered ids are left at −inf, as HF's `filter_value`. Under greedy selection steps 5–8 are
//! skipped: none of them can change the argmax. Every processor with its neutral value
//! (temperature 1, top-k 0, top-p 1, min-p 0, penalties 1/0/0) is skipped outright.
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
//! References: transformers `src/transformers/generation/logits_process.py`; the OpenAI API
//! reference ("Parameter details" for the frequency and presence penalties).

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

use crate::GenerateError;

/// 2⁻⁵³: scales the top 53 bits of a `u64` to a uniform f64 in [0, 1), every value exact.
const UNIT_53: f64 = 1.0 / (1u64 << 53) as f64;

/// Token ids at or above this are ignored by the penalty tables instead of growing them.
/// The largest vocabularies in use have ~262k ids (Gemma 3); a bogus id near `u32::MAX` must
/// not make the tables gigabytes long. 2²⁴ ids cost at most 80 MiB of tables.
const MAX_TRACKED_ID: u32 = 1 << 24;

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

impl SamplingParams {
    /// Checks every value; the error names the parameter, its value and the allowed range.
    pub fn validate(&self) -> Result<(), GenerateError> {
        let bad = |what: String| Err(GenerateError::Sampling(what));
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return bad(format!(
                "temperature = {t}: must be a finite number >= 0 (0 selects greedily)"
            ));
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return bad(format!("top_p = {p}: must be in (0, 1] (1 turns it off)"));
        }
        let m = self.min_p;
        if !(0.0..=1.0).contains(&m) {
            return bad(format!("min_p = {m}: must be in [0, 1] (0 turns it off)"));
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            return bad(format!(
                "repetition_penalty = {r}: must be a finite number > 0 (1 turns it off)"
            ));
        }
        for (name, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(format!("{name} = {v}: must be in [-2, 2] (0 turns it off)"));
            }
        }
        for &(id, b) in &self.logit_bias {
            if b.is_nan() || b == f32::INFINITY {
                return bad(format!(
                    "logit_bias for token {id} = {b}: must be a finite number, or -inf to ban the token"
                ));
            }
        }
        Ok(())
    }

    /// Greedy selection: `greedy`, temperature 0, or top_k 1.
    pub fn is_greedy(&self) -> bool {
        self.greedy || self.temperature == 0.0 || self.top_k == 1
    }
}

/// Reusable buffers for the processors that sort or normalize the row ([`apply_top_k`],
/// [`apply_top_p`]); they grow to the vocabulary once and are then reused.
#[derive(Debug, Default)]
pub struct Scratch {
    /// Sort keys from [`order_key`]: value in the high half, index in the low half.
    keys: Vec<u64>,
    /// `exp(logit − max)` per id, for a categorical draw.
    weights: Vec<f64>,
}

/// Which ids the penalties see.
#[derive(Debug, Default)]
struct History {
    /// `seen[id]`: `id` is in the prompt or was generated (repetition penalty).
    seen: Vec<bool>,
    /// The ids with `seen` set, each once.
    seen_ids: Vec<u32>,
    /// How often each id was generated (frequency and presence penalties).
    counts: Vec<u32>,
    /// The ids with a nonzero count, each once.
    generated_ids: Vec<u32>,
}

impl History {
    /// Makes the tables cover ids below `len`. The id lists hold at most one entry per id,
    /// so reserving `len` means pushing to them never reallocates.
    fn ensure(&mut self, len: usize) {
        if len <= self.seen.len() {
            return;
        }
        self.seen.resize(len, false);
        self.counts.resize(len, 0);
        self.seen_ids.reserve(len - self.seen_ids.len());
        self.generated_ids.reserve(len - self.generated_ids.len());
    }

    /// Forgets everything, touching only the entries that were set.
    fn clear(&mut self) {
        for &id in &self.seen_ids {
            self.seen[id as usize] = false;
        }
        for &id in &self.generated_ids {
            self.counts[id as usize] = 0;
        }
        self.seen_ids.clear();
        self.generated_ids.clear();
    }

    /// Grows the tables to hold `id`; false for an id beyond [`MAX_TRACKED_ID`].
    fn track(&mut self, id: u32) -> bool {
        if id >= MAX_TRACKED_ID {
            return false;
        }
        self.ensure(id as usize + 1);
        true
    }

    fn see(&mut self, id: u32) {
        if self.track(id) && !self.seen[id as usize] {
            self.seen[id as usize] = true;
            self.seen_ids.push(id);
        }
    }

    fn generate(&mut self, id: u32) {
        if !self.track(id) {
            return;
        }
        let count = &mut self.counts[id as usize];
        if *count == 0 {
            self.generated_ids.push(id);
        }
        *count += 1;
        self.see(id);
    }
}

/// The logits-processor chain and the seeded selection for one sequence. Holds its scratch
/// buffers, so sampling a token allocates nothing once warmed up for a vocabulary size.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    /// The working copy of the logits row that the chain edits.
    row: Vec<f32>,
    scratch: Scratch,
    history: History,
}

impl Sampler {
    /// Validates `params`; the RNG is ChaCha8 seeded with `seed_from_u64(params.seed)`.
    pub fn new(params: SamplingParams) -> Result<Sampler, GenerateError> {
        params.validate()?;
        Ok(Sampler {
            rng: ChaCha8Rng::seed_from_u64(params.seed),
            params,
            row: Vec::new(),
            scratch: Scratch::default(),
            history: History::default(),
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Starts a new sequence: forgets generated-token counts, counts `prompt` ids for the
    /// repetition penalty, and reseeds the RNG, so a reset sampler draws exactly what a new
    /// one would.
    pub fn reset(&mut self, prompt: &[u32]) {
        self.history.clear();
        for &id in prompt {
            self.history.see(id);
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
        // Greedy with no processor that could move the argmax: pick it from the row as it
        // is, unless the winner is masked (then the whole chain below decides).
        let p = &self.params;
        let untouched = p.logit_bias.is_empty()
            && p.repetition_penalty == 1.0
            && p.frequency_penalty == 0.0
            && p.presence_penalty == 0.0;
        if p.is_greedy()
            && untouched
            && let Some(i) = argmax(logits).filter(|&i| !masked.contains(&(i as u32)))
        {
            return i as u32;
        }
        // Top-p sorts only the finite logits, whose number varies per row: size for all.
        // (`weights` needs no reserve: every categorical draw fills it with the whole row.)
        self.scratch.keys.clear();
        self.scratch.keys.reserve(logits.len());
        self.row.clear();
        self.row.extend_from_slice(logits);
        for &id in masked {
            if let Some(v) = self.row.get_mut(id as usize) {
                *v = f32::NEG_INFINITY;
            }
        }
        sanitize(&mut self.row);
        run_chain(
            &self.params,
            &self.history,
            &mut self.scratch,
            &mut self.row,
        );
        let chosen = if self.params.is_greedy() {
            argmax(&self.row)
        } else {
            categorical(&self.row, &mut self.scratch.weights, &mut self.rng)
        };
        let chosen = chosen.unwrap_or_else(|| {
            (0..logits.len())
                .find(|&i| !masked.contains(&(i as u32)))
                .unwrap_or(0)
        });
        chosen as u32
    }

    /// Records a generated id (for the repetition, frequency and presence penalties).
    pub fn accept(&mut self, id: u32) {
        self.history.generate(id);
    }

    /// Applies the chain (bias → repetition → frequency/presence → temperature → top-k →
    /// top-p → min-p) to `logits` in place, NaN becoming −inf and filtered ids −inf. Under
    /// greedy selection it stops after the penalties, as [`Sampler::sample`] does.
    pub fn process(&mut self, logits: &mut [f32]) {
        sanitize(logits);
        run_chain(&self.params, &self.history, &mut self.scratch, logits);
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

/// Steps 2–8 of the module doc on a sanitized row.
fn run_chain(p: &SamplingParams, history: &History, scratch: &mut Scratch, row: &mut [f32]) {
    apply_logit_bias(row, &p.logit_bias);
    if p.repetition_penalty != 1.0 {
        apply_repetition_penalty(row, &history.seen_ids, p.repetition_penalty);
    }
    if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
        let counts = history
            .generated_ids
            .iter()
            .map(|&id| (id, history.counts[id as usize]));
        apply_frequency_presence(row, counts, p.frequency_penalty, p.presence_penalty);
    }
    if p.is_greedy() {
        return;
    }
    if p.temperature != 1.0 {
        apply_temperature(row, p.temperature);
    }
    if p.top_k > 0 {
        apply_top_k(row, p.top_k, scratch);
    }
    if p.top_p < 1.0 {
        apply_top_p(row, p.top_p, scratch);
    }
    if p.min_p > 0.0 {
        apply_min_p(row, p.min_p);
    }
}

/// OpenAI `logit_bias`: adds `bias` to the logit of its id; ids outside the row are ignored,
/// an id listed twice gets both. A −inf (masked) logit stays −inf.
pub fn apply_logit_bias(logits: &mut [f32], bias: &[(u32, f32)]) {
    for &(id, b) in bias {
        if let Some(v) = logits.get_mut(id as usize) {
            *v += b;
        }
    }
}

/// HF `RepetitionPenaltyLogitsProcessor`: for each id of `ids`, a logit < 0 is multiplied by
/// `penalty`, any other divided by it, so `penalty > 1` always makes the id less likely.
/// `ids` must list each id once (HF gathers then scatters, so a repeated id is penalized
/// once); ids outside the row are ignored.
pub fn apply_repetition_penalty(logits: &mut [f32], ids: &[u32], penalty: f32) {
    for &id in ids {
        if let Some(v) = logits.get_mut(id as usize) {
            *v = if *v < 0.0 { *v * penalty } else { *v / penalty };
        }
    }
}

/// OpenAI frequency and presence penalties: `logit[j] -= frequency · c[j] + presence · (c[j] > 0)`
/// for each `(j, c[j])` of `counts` (occurrences of `j` among the generated ids; the prompt
/// does not count). Ids outside the row and zero counts are ignored.
pub fn apply_frequency_presence(
    logits: &mut [f32],
    counts: impl IntoIterator<Item = (u32, u32)>,
    frequency: f32,
    presence: f32,
) {
    for (id, count) in counts {
        if count == 0 {
            continue;
        }
        if let Some(v) = logits.get_mut(id as usize) {
            *v -= frequency * count as f32 + presence;
        }
    }
}

/// HF `TemperatureLogitsWarper`: `logits / temperature` (temperature > 0).
pub fn apply_temperature(logits: &mut [f32], temperature: f32) {
    for v in logits {
        *v /= temperature;
    }
}

/// HF `TopKLogitsWarper`: with `k` clamped to [1, len], sets to −inf every logit below the
/// k-th largest; logits equal to it are kept, so ties can keep more than `k`. O(len).
pub fn apply_top_k(logits: &mut [f32], k: usize, scratch: &mut Scratch) {
    let k = k.max(1);
    if k >= logits.len() {
        return;
    }
    let keys = &mut scratch.keys;
    keys.clear();
    keys.extend(logits.iter().enumerate().map(|(i, &v)| order_key(v, i)));
    let (_, kth, _) = keys.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
    let threshold = key_value(*kth);
    for v in logits {
        if *v < threshold {
            *v = f32::NEG_INFINITY;
        }
    }
}

/// HF `TopPLogitsWarper`: sets to −inf every token whose cumulative softmax probability,
/// summed in ascending order, is `<= 1 − top_p` (so a token exactly at the boundary is
/// removed), always keeping the most likely one. Equivalently, from the top down: a token
/// stays while the probability mass of the tokens above it is below `top_p`, which is how it is
/// computed here, so that only the head of the distribution is ever sorted: a partial selection
/// brings the 64 most likely tokens to the front (then 256, 1024, ... when they hold less than
/// `top_p` of the mass), and only those are sorted.
///
/// Equal logits are ordered by index (what a stable ascending sort does), so among ties at the
/// cut the lower ids go first. Probabilities are `exp(logit − max)` in f64 over the f64 total
/// (summed in index order); HF computes the softmax in f32 and the cumulative sum in f64, so
/// the two agree wherever the sums are exact. With +inf logits all mass is on them: everything
/// else is removed.
pub fn apply_top_p(logits: &mut [f32], top_p: f32, scratch: &mut Scratch) {
    if top_p >= 1.0 {
        return;
    }
    let keys = &mut scratch.keys;
    keys.clear();
    // −inf tokens have probability 0: they go whatever the cut.
    keys.extend(
        logits
            .iter()
            .enumerate()
            .filter(|&(_, &v)| v > f32::NEG_INFINITY)
            .map(|(i, &v)| order_key(v, i)),
    );
    let Some(&top) = keys.iter().max() else {
        return;
    };
    let max = key_value(top) as f64;
    if max == f64::INFINITY {
        keep_only_infinite(logits);
        return;
    }
    let weight = |v: f32| (v as f64 - max).exp();
    let total: f64 = logits
        .iter()
        .filter(|&&v| v > f32::NEG_INFINITY)
        .map(|&v| weight(v))
        .sum();
    let keep_mass = top_p as f64 * total;
    let mut head = keys.len().min(64);
    let last_kept = loop {
        if head < keys.len() {
            keys.select_nth_unstable_by(head - 1, |a, b| b.cmp(a));
        }
        keys[..head].sort_unstable_by(|a, b| b.cmp(a));
        let mut above = 0.0;
        let cut = keys[..head].iter().position(|&k| {
            let reached = above >= keep_mass;
            above += weight(key_value(k));
            reached
        });
        match cut {
            // The first token is never cut: nothing is above it.
            Some(n) => break keys[n - 1],
            None if head == keys.len() => return,
            None => head = (head * 4).min(keys.len()),
        }
    };
    for (i, v) in logits.iter_mut().enumerate() {
        if *v > f32::NEG_INFINITY && order_key(*v, i) < last_kept {
            *v = f32::NEG_INFINITY;
        }
    }
}

/// HF `MinPLogitsWarper`: sets to −inf every token whose probability is below
/// `min_p · max probability`; tokens exactly at the threshold are kept, and so is the most
/// likely one. Compared as `exp(logit − max) < min_p` in f64, which is the HF inequality
/// with the softmax denominator cancelled. With +inf logits everything else is removed.
pub fn apply_min_p(logits: &mut [f32], min_p: f32) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return;
    }
    if max == f32::INFINITY {
        keep_only_infinite(logits);
        return;
    }
    let min_p = min_p as f64;
    for v in logits {
        if ((*v as f64) - max as f64).exp() < min_p {
            *v = f32::NEG_INFINITY;
        }
    }
}

/// The softmax limit of a row holding +inf: all mass on the +inf entries.
fn keep_only_infinite(logits: &mut [f32]) {
    for v in logits {
        if *v != f32::INFINITY {
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

/// A `u64` whose unsigned order is the order of `(value, index)`: the value's bits made
/// monotone (negative floats flipped, positive ones offset by the sign bit) in the high half,
/// the index in the low half. −0.0 is folded into +0.0 so that equal values tie on index,
/// as IEEE comparison has them equal. Sorting integers is several times faster than sorting
/// floats with a comparator over a 50k vocabulary.
fn order_key(v: f32, index: usize) -> u64 {
    let bits = (v + 0.0).to_bits();
    let monotone = if bits >> 31 == 1 {
        !bits
    } else {
        bits | 1 << 31
    };
    (monotone as u64) << 32 | index as u64
}

fn key_value(key: u64) -> f32 {
    let monotone = (key >> 32) as u32;
    f32::from_bits(if monotone >> 31 == 1 {
        monotone & !(1 << 31)
    } else {
        !monotone
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_keys_sort_like_values_then_indices_and_round_trip() {
        let values = [
            f32::NEG_INFINITY,
            -3.5,
            -0.0,
            0.0,
            1e-30,
            2.0,
            f32::MAX,
            f32::INFINITY,
        ];
        let keys: Vec<u64> = values
            .iter()
            .enumerate()
            .map(|(i, &v)| order_key(v, i))
            .collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:x?}");
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!((k & 0xFFFF_FFFF) as usize, i, "the index is the low half");
            assert_eq!(key_value(k), values[i]);
        }
        // -0.0 and 0.0 tie on value, so the index decides.
        assert!(order_key(-0.0, 1) > order_key(0.0, 0));
    }
}
