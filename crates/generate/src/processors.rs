//! The logits processors of the sampling chain, each one HF or OpenAI rule, and the
//! [`LogitsProcessor`] trait they share: `apply` edits one row, `accept` and `reset` keep
//! per-sequence state. [`crate::Sampler`] builds the chain from `SamplingParams` in the
//! order its module doc gives; a new processor (a grammar constraint, say) is one more type.
//!
//! Filtered ids are left at −inf, as HF's `filter_value`.
//!
//! References: transformers `src/transformers/generation/logits_process.py`; the OpenAI API
//! reference ("Parameter details" for the frequency and presence penalties).

/// Token ids at or above this are ignored by the penalty tables instead of growing them.
/// The largest vocabularies in use have ~262k ids (Gemma 3); a bogus id near `u32::MAX` must
/// not make the tables gigabytes long. 2²⁴ ids cost at most 80 MiB of tables.
pub(crate) const MAX_TRACKED_ID: u32 = 1 << 24;

/// The sort keys [`apply_top_k`] and [`apply_top_p`] reuse: they grow to the vocabulary once.
#[derive(Debug, Default)]
pub struct Scratch {
    /// Sort keys from [`order_key`]: value in the high half, index in the low half.
    keys: Vec<u64>,
}

impl Scratch {
    /// Room for a row of `len` ids (top-p sorts only the finite logits, whose number varies
    /// per row), so that no later row allocates.
    fn reserve(&mut self, len: usize) {
        self.keys.clear();
        self.keys.reserve(len);
    }
}

/// The ids a sequence has seen, as the penalties read them: the prompt's and the generated
/// ones. The chain's owner keeps it ([`History::reset`], [`History::accept`]); processors
/// only read it.
#[derive(Debug, Default)]
pub struct History {
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
    pub(crate) fn ensure(&mut self, len: usize) {
        if len <= self.seen.len() {
            return;
        }
        self.seen.resize(len, false);
        self.counts.resize(len, 0);
        self.seen_ids.reserve(len - self.seen_ids.len());
        self.generated_ids.reserve(len - self.generated_ids.len());
    }

    /// Starts a new sequence whose prompt is `prompt`.
    pub fn reset(&mut self, prompt: &[u32]) {
        self.clear();
        for &id in prompt {
            self.see(id);
        }
    }

    /// Records a generated id.
    pub fn accept(&mut self, id: u32) {
        self.generate(id);
    }

    /// The ids in the prompt or generated, each once.
    pub fn seen_ids(&self) -> &[u32] {
        &self.seen_ids
    }

    /// Each generated id once, with how often it was generated.
    pub fn generated_counts(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        (self.generated_ids.iter()).map(|&id| (id, self.counts[id as usize]))
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

/// One step of the sampling chain, with per-sequence state of its own. The chain runs its
/// processors in order over one logits row (NaN already turned to −inf); a constraint that
/// forbids ids goes first, on raw logits.
pub trait LogitsProcessor: std::fmt::Debug + Send {
    /// Edits the row in place; ids it filters out become −inf. Must not allocate once warmed
    /// up for a vocabulary size (DESIGN.md invariant 4).
    fn apply(&mut self, logits: &mut [f32], history: &History);
    /// Says how many ids the sequence may still generate, the coming choice included
    /// (before each choice; a constraint closes its text within them).
    fn room(&mut self, left: usize) {
        let _ = left;
    }
    /// Records the id the sequence generated.
    fn accept(&mut self, id: u32) {
        let _ = id;
    }
    /// Starts a new sequence whose prompt is `prompt`.
    fn reset(&mut self, prompt: &[u32]) {
        let _ = prompt;
    }
    /// Whether it can change which id has the largest logit. Greedy selection skips those
    /// that cannot (temperature and truncation), and picks straight from the raw row when
    /// no processor can.
    fn moves_argmax(&self) -> bool {
        true
    }
    /// Where a constraint stands: running, complete (the sequence ends), or failed (the
    /// sequence ends with an error). Processors that constrain nothing are always running.
    fn state(&self) -> ProcessorState {
        ProcessorState::Running
    }
}

/// Where a processor that constrains the text stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessorState {
    Running,
    /// The text is complete: nothing may follow, so the sequence ends here.
    Complete,
    /// The text was completed early because the sequence's room ran out: it ends here, and
    /// its finish reason says the limit ended it.
    Closed,
    /// The constraint failed: the sequence ends with this error.
    Failed(String),
}

/// [`apply_logit_bias`].
#[derive(Debug)]
pub struct LogitBias(pub Vec<(u32, f32)>);

impl LogitsProcessor for LogitBias {
    fn apply(&mut self, logits: &mut [f32], _: &History) {
        apply_logit_bias(logits, &self.0);
    }
}

/// [`apply_repetition_penalty`] over the prompt's and the generated ids.
#[derive(Debug)]
pub struct RepetitionPenalty(pub f32);

impl LogitsProcessor for RepetitionPenalty {
    fn apply(&mut self, logits: &mut [f32], history: &History) {
        apply_repetition_penalty(logits, history.seen_ids(), self.0);
    }
}

/// [`apply_frequency_presence`] over the generated ids.
#[derive(Debug)]
pub struct FrequencyPresence {
    pub frequency: f32,
    pub presence: f32,
}

impl LogitsProcessor for FrequencyPresence {
    fn apply(&mut self, logits: &mut [f32], history: &History) {
        let counts = history.generated_counts();
        apply_frequency_presence(logits, counts, self.frequency, self.presence);
    }
}

/// [`apply_temperature`].
#[derive(Debug)]
pub struct Temperature(pub f32);

impl LogitsProcessor for Temperature {
    fn apply(&mut self, logits: &mut [f32], _: &History) {
        apply_temperature(logits, self.0);
    }

    fn moves_argmax(&self) -> bool {
        false
    }
}

/// [`apply_top_k`].
#[derive(Debug)]
pub struct TopK {
    pub k: usize,
    scratch: Scratch,
}

impl TopK {
    pub fn new(k: usize) -> TopK {
        TopK {
            k,
            scratch: Scratch::default(),
        }
    }
}

impl LogitsProcessor for TopK {
    fn apply(&mut self, logits: &mut [f32], _: &History) {
        self.scratch.reserve(logits.len());
        apply_top_k(logits, self.k, &mut self.scratch);
    }

    fn moves_argmax(&self) -> bool {
        false
    }
}

/// [`apply_top_p`].
#[derive(Debug)]
pub struct TopP {
    pub p: f32,
    scratch: Scratch,
}

impl TopP {
    pub fn new(p: f32) -> TopP {
        TopP {
            p,
            scratch: Scratch::default(),
        }
    }
}

impl LogitsProcessor for TopP {
    fn apply(&mut self, logits: &mut [f32], _: &History) {
        self.scratch.reserve(logits.len());
        apply_top_p(logits, self.p, &mut self.scratch);
    }

    fn moves_argmax(&self) -> bool {
        false
    }
}

/// [`apply_min_p`].
#[derive(Debug)]
pub struct MinP(pub f32);

impl LogitsProcessor for MinP {
    fn apply(&mut self, logits: &mut [f32], _: &History) {
        apply_min_p(logits, self.0);
    }

    fn moves_argmax(&self) -> bool {
        false
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
