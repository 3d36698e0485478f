//! The default model (SmolLM2-135M-Instruct) against golden greedy ids from an independent
//! reference (DESIGN.md §7): `goldens/goldens.json`, made by `goldens/make_goldens.py`, a
//! NumPy forward pass over the GGUF's weights that shares no code with oxgen. oxgen's exact
//! path must reproduce the ids exactly, from the stored prompt ids, with EOS masked.
//!
//! The model package comes from `$OXGEN_DEFAULT_MODEL`, which `scripts/test.sh` sets after
//! `oxgen pull`. These tests never skip: without the model they fail and say how to get it.

use std::path::{Path, PathBuf};

use oxgen::{GenerateOptions, Model, ModelOptions, PackageConfig, Prompt, StopReason};
use oxgen_exec::{ExecOptions, NativeLm};
use oxgen_runtime::{Batch, LanguageModel, LogitsWanted, SeqStep, StepLogits};
use serde::Deserialize;

#[derive(Deserialize)]
struct Goldens {
    reference: Reference,
    prompts: Vec<GoldenPrompt>,
}

#[derive(Deserialize)]
struct Reference {
    /// The ids whose logits the reference masked (the GGUF's end-of-sequence ids).
    masked_eos_ids: Vec<u32>,
    new_tokens: usize,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: String,
}

#[derive(Deserialize)]
struct GoldenPrompt {
    messages: Vec<Message>,
    prompt_ids: Vec<u32>,
    reference_ids: Vec<u32>,
    /// Per generated position, the reference's top-1 minus top-2 logit.
    reference_margins: Vec<f64>,
}

impl GoldenPrompt {
    fn prompt(&self) -> Prompt {
        let pairs: Vec<(&str, &str)> = self
            .messages
            .iter()
            .map(|m| (m.role.as_str(), m.content.as_str()))
            .collect();
        Prompt::chat(&pairs)
    }

    fn label(&self) -> String {
        let content = self.messages.last().map_or("", |m| m.content.as_str());
        format!("{content:?}")
    }
}

fn goldens() -> Goldens {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/goldens/goldens.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

fn default_model_dir() -> PathBuf {
    let dir = std::env::var_os("OXGEN_DEFAULT_MODEL").unwrap_or_else(|| {
        panic!(
            "OXGEN_DEFAULT_MODEL is not set: the golden tests need the imported default model. \
             Run the whole suite with scripts/test.sh (it pulls and imports the model into its \
             cache and sets the variable), or run `oxgen pull` and set OXGEN_DEFAULT_MODEL to \
             the folder it prints"
        )
    });
    let dir = PathBuf::from(dir);
    assert!(
        dir.join("genai_config.json").is_file(),
        "OXGEN_DEFAULT_MODEL={} holds no genai_config.json; run scripts/test.sh (or \
         `oxgen pull`) to import the default model",
        dir.display()
    );
    dir
}

/// Room for the longest prompt and the generated tokens.
const CONTEXT: usize = 256;

fn open_default_model() -> Model {
    let options = ModelOptions {
        threads: 0,
        context: Some(CONTEXT),
        exact: true,
    };
    Model::open(default_model_dir(), &options).expect("opening the default model")
}

#[test]
fn prompt_ids_are_oxgens_chat_encoding() {
    let goldens = goldens();
    let model = open_default_model();
    let mut wrong = Vec::new();
    for g in &goldens.prompts {
        let ids = model.encode(&g.prompt()).expect("encoding a golden prompt");
        if ids != g.prompt_ids {
            wrong.push(format!(
                "{}: oxgen encodes it as {ids:?}, goldens.json stores {:?}",
                g.label(),
                g.prompt_ids
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "the chat template or tokenizer changed the golden prompts' ids (the goldens were \
         made from the stored ids, see goldens/README.md):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn greedy_ids_match_the_reference_exactly() {
    let goldens = goldens();
    let n = goldens.reference.new_tokens;
    let mut model = open_default_model();
    assert_eq!(
        model.config().eos_token_ids,
        goldens.reference.masked_eos_ids,
        "the package's EOS ids differ from those the reference masked"
    );
    let options = GenerateOptions {
        max_new_tokens: n,
        ignore_eos: true,
    };
    let mut failures = Vec::new();
    for g in &goldens.prompts {
        assert_eq!(g.reference_ids.len(), n, "{}: golden length", g.label());
        let out = model
            .generate(&Prompt::Tokens(g.prompt_ids.clone()), &options, |_| {})
            .expect("generating");
        assert_eq!(out.stop, StopReason::MaxTokens, "{}", g.label());
        let Some(at) = out
            .tokens
            .iter()
            .zip(&g.reference_ids)
            .position(|(a, b)| a != b)
        else {
            continue;
        };
        let ours = out.tokens[at];
        let golden = g.reference_ids[at];
        let (l_ours, l_golden) = logits_after(&g.prompt_ids, &g.reference_ids[..at], ours, golden);
        let text = |ids: &[u32]| model.tokenizer().decode(ids, false).unwrap_or_default();
        failures.push(format!(
            "{}: first divergence at generated token {at}: oxgen {ours} {:?}, reference \
             {golden} {:?}; oxgen's logits there: {l_ours} vs {l_golden} (margin {}), \
             reference's top-2 margin {}\n  oxgen:     {:?}\n  reference: {:?}",
            g.label(),
            text(&[ours]),
            text(&[golden]),
            l_ours - l_golden,
            g.reference_margins.get(at).copied().unwrap_or(f64::NAN),
            out.tokens,
            g.reference_ids,
        ));
    }
    assert!(
        failures.is_empty(),
        "greedy ids differ from the reference (goldens/goldens.json):\n{}",
        failures.join("\n")
    );
}

/// oxgen's logits of tokens `a` and `b` after `prompt` followed by `generated`, stepping
/// the model directly (a diagnostic for a divergence).
fn logits_after(prompt: &[u32], generated: &[u32], a: u32, b: u32) -> (f32, f32) {
    let dir = default_model_dir();
    let config = PackageConfig::read(&dir).expect("reading genai_config.json");
    let onnx = oxgen_onnx::Model::load(dir.join(&config.model_file)).expect("loading the graph");
    let graph = oxgen_graph::Graph::from_model(&onnx).expect("building the graph");
    let mut lm = NativeLm::new(
        graph,
        &ExecOptions {
            threads: 0,
            exact: true,
        },
        &config.kv,
    )
    .expect("wrapping the graph");
    let seq = lm.add_sequence(CONTEXT).expect("adding a sequence");
    let tokens: Vec<u32> = prompt.iter().chain(generated).copied().collect();
    let step = [SeqStep {
        seq,
        tokens: &tokens,
        pos: 0,
        logits: LogitsWanted::Last,
    }];
    let mut logits = StepLogits::default();
    lm.step(&Batch { steps: &step }, &mut logits)
        .expect("stepping");
    let row = logits.row(0, 0);
    (row[a as usize], row[b as usize])
}
