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
