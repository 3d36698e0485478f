//! Speculative decoding in the facade: which proposer a model opens (`--speculative`), and
//! each step's proposals for the sequences that speculate. Verification is in
//! `sequence.rs`; the proposers and the adaptive choice of how many ids to verify are
//! `oxgen_generate`'s.

use std::path::{Path, PathBuf};

use oxgen_generate::{
    Adaptive, DraftModel, PromptLookup, ProposalRequest, Proposer, SpecStats, Tokenizer,
    running_mean,
};
use oxgen_runtime::{Capabilities, LanguageModel};

use crate::{Error, Model, ModelOptions, Sequence, backend};

/// How speculative decoding proposes ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Speculative {
    /// Continue the latest earlier match of the last n ids (no extra model).
    PromptLookup(PromptLookup),
    /// A smaller package with the same tokenizer, run greedily on the same threads.
    Draft(PathBuf),
    /// The model's own first `layers` layers and output head.
    SelfDraft { layers: usize },
}

/// Proposed ids per step when no one says otherwise: a verified span of up to 8 rows is one
/// pass over the weights on the native backend.
pub const DEFAULT_SPEC_TOKENS: usize = 6;
/// The most ids a step may propose (`--spec-tokens`).
pub const MAX_SPEC_TOKENS: usize = 32;
/// What a step verifying k proposals costs in plain decode steps before it was measured:
/// `1 + VERIFY_FIXED + VERIFY_ROW · k`. Fitted on the default model (native, 2 threads, an
/// Intel Xeon slice): a second row costs 0.56 of a step, each further row 0.11
/// (docs/PERFORMANCE.md, "Speculative decoding"). Once a
/// model has timed its own steps alone, its measured ratios replace these; a proposer's own
/// cost (a draft model's forwards) is measured as it runs and added.
const VERIFY_FIXED: f32 = 0.45;
const VERIFY_ROW: f32 = 0.11;

/// What a step verifying `k` proposals costs, in plain decode steps, before it was measured.
pub(crate) fn prior_cost(k: usize) -> f32 {
    1.0 + VERIFY_FIXED + VERIFY_ROW * k as f32
}

/// Batches of more sequences than this run without speculation: their decode rows already
/// share each pass over the weights, so verified rows add compute instead of saving passes.
/// Measured with prompt lookup on the edit workload (default model, 2 threads): 1.36x at
/// batch 2, 1.37x at 4, 1.08x at 8, 0.74x at 16 (docs/PERFORMANCE.md).
pub const SPEC_MAX_BATCH: usize = 4;

impl std::str::FromStr for Speculative {
    type Err = String;

    /// `prompt-lookup`, `prompt-lookup:N` or `prompt-lookup:MIN-MAX` (n-gram sizes),
    /// `draft:PATH`, `self:LAYERS`.
    fn from_str(s: &str) -> Result<Speculative, String> {
        let usage = "give prompt-lookup[:N or :MIN-MAX], draft:PATH or self:LAYERS";
        let (kind, arg) = s.split_once(':').unwrap_or((s, ""));
        let number = |v: &str| {
            v.trim()
                .parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("'{v}' in '{s}' is not a positive whole number; {usage}"))
        };
        match kind {
            "prompt-lookup" if arg.is_empty() => {
                Ok(Speculative::PromptLookup(PromptLookup::default()))
            }
            "prompt-lookup" => {
                let (min_n, max_n) = match arg.split_once('-') {
                    Some((a, b)) => (number(a)?, number(b)?),
                    None => (number(arg)?, number(arg)?),
                };
                if min_n > max_n || max_n > 64 {
                    return Err(format!(
                        "n-gram sizes {min_n}-{max_n} in '{s}': the first may not exceed the \
                         second, which is at most 64"
                    ));
                }
                Ok(Speculative::PromptLookup(PromptLookup { min_n, max_n }))
            }
            "draft" if !arg.is_empty() => Ok(Speculative::Draft(PathBuf::from(arg))),
            "self" => Ok(Speculative::SelfDraft {
                layers: number(arg)?,
            }),
            _ => Err(format!("unknown speculative mode '{s}'; {usage}")),
        }
    }
}

impl std::fmt::Display for Speculative {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Speculative::PromptLookup(p) => write!(f, "prompt-lookup:{}-{}", p.min_n, p.max_n),
            Speculative::Draft(path) => write!(f, "draft:{}", path.display()),
            Speculative::SelfDraft { layers } => write!(f, "self:{layers}"),
        }
    }
}

/// A model's proposer and what it did.
pub(crate) struct Speculation {
    proposer: Box<dyn Proposer>,
    /// Proposed ids per step unless a generation says otherwise.
    pub tokens: usize,
    pub stats: SpecStats,
    /// Per sequence of a step: its proposals.
    out: Vec<Vec<u32>>,
    /// Running seconds of a forward of one sequence in decode: index k verified k proposals.
    step_secs: Vec<Option<f64>>,
}

/// Opens the proposer `options.speculative` asks for, beside the `target` model opened as
/// `open` says, whose tokenizer is `tokenizer`.
pub(crate) fn open(
    options: &ModelOptions,
    open: &backend::Open,
    target: &dyn LanguageModel,
    tokenizer: &Tokenizer,
) -> Result<Option<Speculation>, Error> {
    let Some(kind) = &options.speculative else {
        return Ok(None);
    };
    if options.spec_tokens > MAX_SPEC_TOKENS {
        return Err(Error::Package {
            path: "--spec-tokens".into(),
            reason: format!(
                "--spec-tokens {} is more than {MAX_SPEC_TOKENS}; verifying that many ids at \
                 once cannot pay",
                options.spec_tokens
            ),
        });
    }
    let vocab = target.contract().vocab_size.unwrap_or(usize::MAX);
    let proposer: Box<dyn Proposer> = match kind {
        Speculative::PromptLookup(p) => Box::new(*p),
        Speculative::Draft(path) => Box::new(open_draft(options, open, path, tokenizer, vocab)?),
        Speculative::SelfDraft { layers } => {
            if target.backend() != "native" {
                return Err(Error::Package {
                    path: open.model_path.display().to_string(),
                    reason: format!(
                        "self:{layers} runs the model's first layers on the native backend, \
                         and this model runs on {}; use prompt-lookup or draft:PATH",
                        target.backend()
                    ),
                });
            }
            let lm = backend::open_layers(open, *layers)?;
            Box::new(DraftModel::new(lm, "self", vocab))
        }
    };
    Ok(Some(Speculation {
        proposer,
        tokens: options.spec_tokens,
        stats: SpecStats::default(),
        out: Vec::new(),
        step_secs: vec![None; MAX_SPEC_TOKENS + 1],
    }))
}

/// A draft package: its own model on the target's threads, checked to share the target's
/// tokenizer.
fn open_draft(
    options: &ModelOptions,
    target: &backend::Open,
    path: &Path,
    tokenizer: &Tokenizer,
    vocab: usize,
) -> Result<DraftModel, Error> {
    // The target's adapters are its own: the draft proposes as the base model does.
    let draft_options = ModelOptions {
        speculative: None,
        chat_template: None,
        lora: Vec::new(),
        max_loras: 0,
        ..options.clone()
    };
    let draft = Model::open_on(path, &draft_options, target.pool.clone())?;
    if let Err(why) = tokenizer.check_same_vocab(draft.tokenizer()) {
        return Err(Error::Package {
            path: draft.dir().display().to_string(),
            reason: format!(
                "a draft model needs the target's tokenizer, and this one differs: {why}; \
                 pick a draft of the same family (or use prompt-lookup or self:LAYERS)"
            ),
        });
    }
    Ok(DraftModel::new(draft.into_lm(), "draft", vocab))
}

impl Speculation {
    /// Fills each decode-phase sequence's span to verify (its last id, then the proposals)
    /// where it speculates this step. `capabilities` says whether a multi-token span with
    /// past may share a forward with other sequences.
    pub fn propose(&mut self, seqs: &mut [&mut Sequence], capabilities: Capabilities) {
        let batch_ok = crate::sequence::verifies_in_batch(seqs.len(), capabilities);
        let mut asked = Vec::with_capacity(seqs.len());
        let cost = |k: usize| self.verify_cost(k);
        for (i, s) in seqs.iter_mut().enumerate() {
            s.verify.clear();
            // A sequence with a prediction proposes from it instead.
            let predicted = s.prediction.is_some();
            if predicted || !batch_ok || s.pending() != 1 || s.decoding.finish_reason().is_some() {
                continue;
            }
            let room = s.decoding.room().saturating_sub(1);
            let k = s.adaptive.tokens(cost).min(room);
            if k > 0 {
                asked.push((i, k));
            }
        }
        if asked.is_empty() {
            return;
        }
        let requests: Vec<ProposalRequest> = (asked.iter())
            .map(|&(i, k)| ProposalRequest {
                seq: seqs[i].seq,
                ids: seqs[i].decoding.ids(),
                ctx_size: seqs[i].positions,
                max: k,
            })
            .collect();
        self.out
            .resize_with(requests.len().max(self.out.len()), Vec::new);
        let proposed = self
            .proposer
            .propose(&requests, &mut self.out[..requests.len()]);
        drop(requests);
        if proposed.is_err() {
            // A draft that fails (its KV pool full, say) costs speed, never the generation:
            // this step runs without proposals, and the draft starts these sequences afresh.
            self.stats.proposer_errors += 1;
            for &(i, _) in &asked {
                self.proposer.forget(seqs[i].seq);
            }
            return;
        }
        for (&(i, k), proposed) in asked.iter().zip(&self.out) {
            let s = &mut *seqs[i];
            if proposed.is_empty() {
                continue;
            }
            let (_, span) = s.decoding.span();
            s.verify.extend_from_slice(span);
            s.verify.extend(proposed.iter().take(k));
        }
    }

    /// What a step verifying `k` proposals costs, proposing them included, in plain decode
    /// steps: measured where this model timed both, else the prior.
    fn verify_cost(&self, k: usize) -> f32 {
        let prior = prior_cost;
        // A plain step's time: measured, else read back from a timed verification.
        let plain = self.step_secs[0].or_else(|| {
            let (j, v) =
                (self.step_secs.iter().enumerate()).find_map(|(j, v)| v.map(|v| (j, v)))?;
            Some(v / f64::from(prior(j)))
        });
        let verify = match (self.step_secs[0], self.step_secs.get(k).copied().flatten()) {
            (Some(p), Some(v)) if p > 0.0 => (v / p) as f32,
            _ => prior(k),
        };
        let propose = match (plain, self.proposer.secs_per_id()) {
            (Some(p), Some(d)) if p > 0.0 => (d / p) as f32,
            // A draft not timed yet costs at least a verified row per id.
            (_, Some(_)) => VERIFY_ROW,
            _ => 0.0,
        };
        verify + propose * k as f32
    }

    /// Records how long a forward of one sequence in decode took, verifying `proposed` ids.
    pub fn timed_step(&mut self, took: std::time::Duration, proposed: usize) {
        if let Some(slot) = self.step_secs.get_mut(proposed) {
            *slot = Some(running_mean(*slot, took.as_secs_f64()));
        }
    }

    /// Records one sequence's verification.
    pub fn record(&mut self, adaptive: &mut Adaptive, proposed: usize, accepted: usize) {
        adaptive.record(proposed, accepted);
        self.stats.add(&SpecStats {
            verify_steps: u64::from(proposed > 0),
            proposed: proposed as u64,
            accepted: accepted as u64,
            ..SpecStats::default()
        });
    }

    /// The target let `seq` go.
    pub fn forget(&mut self, seq: oxgen_runtime::SeqId) {
        self.proposer.forget(seq);
    }

    pub fn name(&self) -> &'static str {
        self.proposer.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print_back() {
        for (s, want) in [
            ("prompt-lookup", "prompt-lookup:2-4"),
            ("prompt-lookup:3", "prompt-lookup:3-3"),
            ("prompt-lookup:1-5", "prompt-lookup:1-5"),
            ("draft:/models/small", "draft:/models/small"),
            ("self:8", "self:8"),
        ] {
            assert_eq!(s.parse::<Speculative>().unwrap().to_string(), want);
        }
        for bad in [
            "lookup",
            "self",
            "self:0",
            "self:x",
            "draft:",
            "prompt-lookup:4-2",
            "prompt-lookup:0",
            "prompt-lookup:1-100",
        ] {
            let e = bad.parse::<Speculative>().unwrap_err();
            assert!(e.contains("prompt-lookup"), "{bad}: {e}");
        }
    }
}
