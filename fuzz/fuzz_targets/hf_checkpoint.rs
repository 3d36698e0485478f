//! `oxgen import` of a Hugging Face causal-LM folder on arbitrary files (untrusted
//! checkpoints): the first byte picks which file the rest is, `config.json` (beside a valid
//! tiny checkpoint) or `model.safetensors` (beside a valid tiny config). Anything may fail;
//! nothing may panic, and a failed import leaves nothing behind.
#![no_main]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// A one-layer Llama the valid files describe (the seeds hold its weights).
const CONFIG: &str = r#"{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1,
  "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1,
  "intermediate_size": 32, "max_position_embeddings": 16, "vocab_size": 8,
  "rms_norm_eps": 1e-5, "tie_word_embeddings": true}"#;

fn scratch() -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "oxgen-fuzz-hf-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let dir = scratch();
    let src = dir.join("hf");
    std::fs::create_dir_all(&src).unwrap();
    let seed_weights = include_bytes!("../seeds/hf_checkpoint/weights");
    let (config, weights) = if which % 2 == 0 {
        (rest, &seed_weights[1..])
    } else {
        (CONFIG.as_bytes(), rest)
    };
    std::fs::write(src.join("config.json"), config).unwrap();
    std::fs::write(src.join("model.safetensors"), weights).unwrap();
    std::fs::write(src.join("tokenizer.json"), b"{}").unwrap();
    let out = dir.join("out");
    for precision in [oxgen_import::Precision::Int4, oxgen_import::Precision::Fp32] {
        let options = oxgen_import::ImportOptions::default();
        if oxgen_import::import_hf(&src, &out, precision, &options).is_ok() {
            std::fs::remove_dir_all(&out).unwrap();
        }
    }
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left, ["hf"], "a failed import left files");
    std::fs::remove_dir_all(&dir).unwrap();
});
