//! Packages made by other tools load and generate on both backends with the same greedy ids:
//! onnxruntime-genai's model builder (int4 and fp32) and optimum's ONNX export of a tiny
//! random-weight Llama, committed under `crates/testkit/thirdparty/` with the script that made
//! them (`make_packages.py`; tool versions in its README). The expected ids are what
//! transformers (fp32, optimum) and onnxruntime-genai (int4) produced when the packages were
//! made.

use std::path::PathBuf;

use oxgen::{Backend, GenerateOptions, Model, ModelOptions, Prompt};

/// The prompt `make_packages.py` checked, and the greedy ids it recorded.
const PROMPT: [u32; 5] = [0, 75, 104, 263, 290];
const FP32_IDS: [u32; 9] = [130, 66, 199, 105, 171, 108, 157, 78, 169];
const INT4_IDS: [u32; 9] = [130, 66, 47, 157, 85, 130, 157, 255, 62];

fn package(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../testkit/thirdparty")
        .join(name)
}

fn greedy_ids(name: &str, backend: Backend) -> Vec<u32> {
    let options = ModelOptions {
        threads: 2,
        backend,
        ..ModelOptions::default()
    };
    let mut model = Model::open(package(name), &options)
        .unwrap_or_else(|e| panic!("{name} on {backend:?}: {e}"));
    assert_eq!(
        model.backend(),
        if backend == Backend::Ort {
            "ort"
        } else {
            "native"
        }
    );
    // The chat template (a chat_template.jinja file in these packages) renders.
    let chat = model.encode(&Prompt::chat(&[("user", "the cat")])).unwrap();
    assert!(chat.len() > 3, "{name}: {chat:?}");
    let generate = GenerateOptions {
        max_new_tokens: 9,
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    model
        .generate(&Prompt::Tokens(PROMPT.to_vec()), &generate, |_| {})
        .unwrap()
        .tokens
}

#[test]
fn onnxruntime_genai_builder_packages_run_on_both_backends() {
    for (name, want) in [("builder-fp32", FP32_IDS), ("builder-int4", INT4_IDS)] {
        assert_eq!(greedy_ids(name, Backend::Native), want, "{name} on native");
        assert_eq!(
            greedy_ids(name, Backend::Ort),
            want,
            "{name} on onnxruntime"
        );
    }
}

#[test]
fn an_optimum_export_runs_on_both_backends() {
    assert_eq!(greedy_ids("optimum", Backend::Native), FP32_IDS);
    assert_eq!(greedy_ids("optimum", Backend::Ort), FP32_IDS);
}

/// A sequence started with `start_scoring_prompt` (what an echoed completion runs) reports
/// each prompt id's log-probability, the prompt fed in chunks as the server feeds it, equal
/// within 1e-4 to the float64 log-softmax of `Model::logits` on the same ids, on both
/// backends; the generated id's entry follows from the prompt's last row.
#[test]
fn prompt_logprobs_are_the_log_softmax_of_the_logits_on_both_backends() {
    let prompt: Vec<u32> = (0..23).map(|i| (i * 37 + 11) % 250).collect();
    let packages = [package("builder-int4"), oxgen_testkit::default_model_dir()];
    for dir in packages {
        for backend in [Backend::Native, Backend::Ort] {
            let what = format!("{} on {backend:?}", dir.display());
            let options = ModelOptions {
                threads: 2,
                backend,
                ..ModelOptions::default()
            };
            let mut model = Model::open(&dir, &options).unwrap_or_else(|e| panic!("{what}: {e}"));
            let (logits, vocab) = model.logits(&prompt).unwrap();
            let log_softmax = |row: usize, id: u32| {
                oxgen_testkit::log_softmax(&logits[row * vocab..(row + 1) * vocab])[id as usize]
            };
            let generate = GenerateOptions {
                max_new_tokens: 2,
                ignore_eos: true,
                ..GenerateOptions::default()
            };
            let mut seq = model
                .start_scoring_prompt(&prompt, &generate, Some(2), 3)
                .unwrap();
            let mut scored = Vec::new();
            let first = loop {
                let mut steps = model.advance_batch(&mut [&mut seq], 5).remove(0).unwrap();
                scored.extend(seq.take_prompt_logprobs());
                if !steps.is_empty() {
                    break steps.remove(0);
                }
            };
            model.end(seq);
            assert_eq!(scored.len(), prompt.len() - 1, "{what}");
            for (i, lp) in scored.iter().enumerate() {
                let want = log_softmax(i, prompt[i + 1]);
                let got = f64::from(lp.logprob);
                assert!(
                    (got - want).abs() < 1e-4,
                    "{what}: id {}: {got} vs {want}",
                    i + 1
                );
                assert_eq!(lp.top.len(), 3);
                let best = log_softmax(i, lp.top[0].0);
                assert!((f64::from(lp.top[0].1) - best).abs() < 1e-4, "{what}");
            }
            let last = prompt.len() - 1;
            let got = f64::from(first.logprobs.unwrap().logprob);
            assert!((got - log_softmax(last, first.id)).abs() < 1e-4, "{what}");
        }
    }
}
