//! oxgen-testkit: test support shared by the crates' test suites.
//!
//! - [`node_tests`]: runs one case of the official ONNX backend node tests (`model.onnx` plus
//!   `test_data_set_*/{input,output}_N.pb`) on a [`oxgen_runtime::Session`] and compares the
//!   outputs at the ONNX runner's tolerances.
//! - [`encoders`]: small random-weight BERT and RoBERTa encoders and cross-encoders as
//!   Hugging Face saves them, and the packages `oxgen import` makes of them.
//! - [`fixtures`]: small random-weight language-model packages shaped like onnxruntime-genai's,
//!   and [`Rng`] (`oxgen_kernels::rng`, re-exported), the one seeded generator the tests and
//!   the kernels' own tests draw their data from.
//! - [`spans`]: a language model run span by span on one sequence ([`run_spans`]), and what
//!   the model tests compare on its rows ([`argmax`], bits, largest difference).
//! - [`optimum`]: the same kind of model as optimum exports it (standard ops only, KV grown by
//!   `Concat`), for the graph passes and package detection.
//! - [`compare`]: element-wise comparison with `rtol`/`atol` for every dtype.
//! - [`ort_oracle`]: the same model through onnxruntime (Python wheel), for oracle tests.
//! - [`default_model_dir`]: where the suite's imported default model is; [`embed_model_dir`]
//!   the sentence encoder's, [`rerank_model_dir`] the cross-encoder's.
//! - [`log_softmax`]: a logits row's log-probabilities in float64, the independent
//!   computation served log-probabilities are checked against.
//!
//! This crate is a dev-dependency only: no product crate may depend on it.

pub mod compare;
pub mod encoders;
pub mod fixtures;
pub mod node_tests;
pub mod optimum;
pub mod ort_oracle;
pub mod spans;

pub use fixtures::Rng;
pub use spans::{argmax, run_spans};

/// The imported default model's package folder: `$OXGEN_DEFAULT_MODEL`, which
/// `scripts/test.sh` sets. Panics saying how to get it when it is not set or holds no package.
pub fn default_model_dir() -> std::path::PathBuf {
    let dir = std::env::var_os("OXGEN_DEFAULT_MODEL").unwrap_or_else(|| {
        panic!(
            "OXGEN_DEFAULT_MODEL is not set: these tests need the imported default model. Run \
             the whole suite with scripts/test.sh (it pulls and imports the model into its \
             cache and sets the variable), or run `oxgen pull` and set OXGEN_DEFAULT_MODEL to \
             the folder it prints"
        )
    });
    let dir = std::path::PathBuf::from(dir);
    assert!(
        dir.join("genai_config.json").is_file(),
        "OXGEN_DEFAULT_MODEL={} holds no genai_config.json; run scripts/test.sh (or \
         `oxgen pull`) to import the default model",
        dir.display()
    );
    dir
}

/// The imported all-MiniLM-L6-v2 package (`oxgen pull embed`): `$OXGEN_EMBED_MODEL`, which
/// `scripts/test.sh` sets. Panics saying how to get it when it is not set or holds no graph.
pub fn embed_model_dir() -> std::path::PathBuf {
    let dir = std::env::var_os("OXGEN_EMBED_MODEL").unwrap_or_else(|| {
        panic!(
            "OXGEN_EMBED_MODEL is not set: these tests need all-MiniLM-L6-v2. Run the whole \
             suite with scripts/test.sh (it pulls and imports it), or run `oxgen pull embed` \
             and set OXGEN_EMBED_MODEL to the folder it prints"
        )
    });
    let dir = std::path::PathBuf::from(dir);
    assert!(
        dir.join("model.onnx").is_file(),
        "OXGEN_EMBED_MODEL={} holds no model.onnx; run `oxgen pull embed`",
        dir.display()
    );
    dir
}

/// all-MiniLM-L6-v2 with onnxruntime's fused encoder ops (`EmbedLayerNormalization`,
/// `SkipLayerNormalization`, `BiasGelu`, `Attention`): `$OXGEN_EMBED_FUSED_MODEL`, which
/// `scripts/test.sh` makes with `thirdparty/embeddings/fuse.py` and sets.
pub fn fused_embed_model_dir() -> std::path::PathBuf {
    let dir = std::env::var_os("OXGEN_EMBED_FUSED_MODEL").unwrap_or_else(|| {
        panic!(
            "OXGEN_EMBED_FUSED_MODEL is not set: this test needs all-MiniLM-L6-v2 with \
             onnxruntime's fused ops. Run the whole suite with scripts/test.sh, or run \
             crates/testkit/thirdparty/embeddings/fuse.py OXGEN_EMBED_MODEL DST 12 384 and set \
             OXGEN_EMBED_FUSED_MODEL to DST"
        )
    });
    std::path::PathBuf::from(dir)
}

/// The cross-encoder ms-marco-MiniLM-L-12-v2 in int8 (`oxgen pull rerank`):
/// `$OXGEN_RERANK_MODEL`, which `scripts/test.sh` sets.
pub fn rerank_model_dir() -> std::path::PathBuf {
    let dir = std::env::var_os("OXGEN_RERANK_MODEL").unwrap_or_else(|| {
        panic!(
            "OXGEN_RERANK_MODEL is not set: these tests need ms-marco-MiniLM-L-12-v2. Run the \
             whole suite with scripts/test.sh, or run `oxgen pull rerank` and set \
             OXGEN_RERANK_MODEL to the folder it prints"
        )
    });
    std::path::PathBuf::from(dir)
}

/// The log-softmax of a logits row, computed in float64 (max-shifted): what served
/// log-probabilities are compared with, independently of oxgen's own code.
pub fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row
        .iter()
        .map(|&x| f64::from(x))
        .fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = row.iter().map(|&x| (f64::from(x) - max).exp()).sum();
    let log_z = max + sum.ln();
    row.iter().map(|&x| f64::from(x) - log_z).collect()
}

/// The bytes of standard base64 `text` (padding optional), as reference files store f32s.
pub fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let mut out = Vec::new();
    for chunk in text.as_bytes().chunks(4) {
        let n = chunk
            .iter()
            .take_while(|&&c| c != b'=')
            .enumerate()
            .fold(0u32, |n, (i, &c)| n | u32::from(value(c)) << (18 - 6 * i));
        let len = chunk.iter().filter(|&&c| c != b'=').count() - 1;
        out.extend_from_slice(&n.to_be_bytes()[1..1 + len]);
    }
    out
}
