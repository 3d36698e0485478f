//! Package detection: onnxruntime-genai and optimum layouts, what is read from each, and the
//! message for each way a folder can fail to be a package.

use std::path::Path;

use oxgen::{GenerateOptions, Model, ModelOptions, PackageConfig, Prompt};
use oxgen_exec::{NativeLm, NativeOptions};
use oxgen_runtime::LanguageModel;
use oxgen_testkit::fixtures::{FixtureConfig, tokenizer, write_package};
use oxgen_testkit::optimum::write_optimum_package;

fn optimum_fixture() -> (tempfile::TempDir, FixtureConfig) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = FixtureConfig::default();
    write_optimum_package(dir.path(), &cfg).unwrap();
    (dir, cfg)
}

fn read_err(dir: &Path) -> String {
    PackageConfig::read(dir)
        .expect_err("the folder is not a valid package")
        .to_string()
}

/// Rewrites `dir/file` (JSON) with `edit`.
fn edit_json(dir: &Path, file: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join(file);
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
}

/// The native model of a package, for its contract.
fn lm(dir: &Path, config: &PackageConfig) -> NativeLm {
    let options = NativeOptions {
        kv_names: config.kv.clone(),
        ..NativeOptions::default()
    };
    NativeLm::open(&dir.join(&config.model_file), &options).unwrap()
}

#[test]
fn a_genai_package_is_read_from_genai_config() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = FixtureConfig::default();
    write_package(dir.path(), &cfg).unwrap();
    let config = PackageConfig::read(dir.path()).unwrap();
    assert_eq!(config.format, oxgen::PackageFormat::Genai);
    assert_eq!(config.model_file, "model.onnx");
    assert_eq!(config.context_length, cfg.context);
    assert_eq!(config.eos_token_ids, [tokenizer::EOS as u32]);
    assert_eq!(config.bos_token_id, Some(tokenizer::BOS as u32));
    config
        .check_contract(lm(dir.path(), &config).contract())
        .unwrap();
}

#[test]
fn an_optimum_export_is_read_from_config_and_generation_config() {
    let (dir, cfg) = optimum_fixture();
    let config = PackageConfig::read(dir.path()).unwrap();
    assert_eq!(config.format, oxgen::PackageFormat::Optimum);
    assert_eq!(config.model_file, "model.onnx");
    assert_eq!(config.context_length, cfg.context);
    assert_eq!(config.eos_token_ids, [tokenizer::EOS as u32]);
    assert_eq!(config.bos_token_id, Some(tokenizer::BOS as u32));
    assert_eq!(config.kv.past_key, "past_key_values.%d.key");
    assert_eq!(config.kv.present_value, "present.%d.value");
    let lm = lm(dir.path(), &config);
    assert_eq!(lm.contract().layers.len(), cfg.layers);
    assert_eq!(lm.contract().kv_heads, cfg.kv_heads);
    assert_eq!(lm.contract().head_size, cfg.head_size());
    config.check_contract(lm.contract()).unwrap();
}

#[test]
fn eos_ids_come_from_generation_config_first_as_int_or_list() {
    let (dir, _) = optimum_fixture();
    edit_json(dir.path(), "generation_config.json", |v| {
        v["eos_token_id"] = serde_json::json!([2, 1]);
    });
    assert_eq!(
        PackageConfig::read(dir.path()).unwrap().eos_token_ids,
        [2, 1]
    );
    // Without generation_config.json, config.json's single id.
    std::fs::remove_file(dir.path().join("generation_config.json")).unwrap();
    edit_json(dir.path(), "config.json", |v| {
        v["eos_token_id"] = serde_json::json!(1);
    });
    assert_eq!(PackageConfig::read(dir.path()).unwrap().eos_token_ids, [1]);
}

#[test]
fn a_folder_with_neither_config_names_both() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("model.onnx"), b"").unwrap();
    let e = read_err(dir.path());
    assert!(
        e.contains("genai_config.json") && e.contains("config.json") && e.contains("optimum"),
        "{e}"
    );
}

#[test]
fn a_split_optimum_export_says_how_to_re_export() {
    let (dir, _) = optimum_fixture();
    std::fs::rename(
        dir.path().join("model.onnx"),
        dir.path().join("decoder_model_merged.onnx"),
    )
    .unwrap();
    let e = read_err(dir.path());
    assert!(e.contains("decoder_model_merged.onnx"), "{e}");
    assert!(e.contains("--task text-generation-with-past"), "{e}");
    assert!(e.contains("model.onnx"), "{e}");
    std::fs::remove_file(dir.path().join("decoder_model_merged.onnx")).unwrap();
    let e = read_err(dir.path());
    assert!(e.contains("needs model.onnx next to config.json"), "{e}");
}

#[test]
fn missing_context_or_eos_name_the_key_and_files() {
    let (dir, _) = optimum_fixture();
    edit_json(dir.path(), "config.json", |v| {
        v.as_object_mut().unwrap().remove("max_position_embeddings");
    });
    let e = read_err(dir.path());
    assert!(
        e.contains("config.json") && e.contains("max_position_embeddings"),
        "{e}"
    );

    let (dir, _) = optimum_fixture();
    std::fs::remove_file(dir.path().join("generation_config.json")).unwrap();
    edit_json(dir.path(), "config.json", |v| {
        v.as_object_mut().unwrap().remove("eos_token_id");
    });
    let e = read_err(dir.path());
    assert!(
        e.contains("eos_token_id")
            && e.contains("generation_config.json")
            && e.contains("config.json"),
        "{e}"
    );
}

/// A value of the wrong type, or an impossible one, is an error naming the file and key (it
/// used to load and generate without a word).
#[test]
fn wrong_types_and_impossible_values_name_the_key() {
    let genai: [(&str, serde_json::Value, &str); 5] = [
        (
            "num_hidden_layers",
            serde_json::json!("thirty"),
            "model.decoder.num_hidden_layers",
        ),
        (
            "head_size",
            serde_json::json!(-3),
            "model.decoder.head_size",
        ),
        (
            "context_length",
            serde_json::json!(-5),
            "model.context_length",
        ),
        (
            "context_length",
            serde_json::json!(0),
            "model.context_length is 0",
        ),
        (
            "eos_token_id",
            serde_json::json!(["x"]),
            "model.eos_token_id",
        ),
    ];
    for (key, value, named) in genai {
        let dir = tempfile::tempdir().unwrap();
        write_package(dir.path(), &FixtureConfig::default()).unwrap();
        edit_json(dir.path(), "genai_config.json", |v| {
            let model = &mut v["model"];
            match key {
                "context_length" | "eos_token_id" => model[key] = value.clone(),
                _ => model["decoder"][key] = value.clone(),
            }
        });
        let e = read_err(dir.path());
        assert!(
            e.contains("genai_config.json") && e.contains(named),
            "{key}: {e}"
        );
    }
    let (dir, _) = optimum_fixture();
    edit_json(dir.path(), "config.json", |v| {
        v["num_attention_heads"] = serde_json::json!(4.5);
    });
    let e = read_err(dir.path());
    assert!(
        e.contains("config.json") && e.contains("num_attention_heads"),
        "{e}"
    );
    let (dir, _) = optimum_fixture();
    edit_json(dir.path(), "generation_config.json", |v| {
        v["eos_token_id"] = serde_json::json!("two");
    });
    let e = read_err(dir.path());
    assert!(
        e.contains("generation_config.json") && e.contains("eos_token_id"),
        "{e}"
    );
}

#[test]
fn invalid_json_names_the_file() {
    let (dir, _) = optimum_fixture();
    std::fs::write(dir.path().join("config.json"), "{ not json").unwrap();
    let e = read_err(dir.path());
    assert!(
        e.contains("config.json") && e.contains("invalid JSON"),
        "{e}"
    );
}

#[test]
fn a_config_that_disagrees_with_the_graph_names_both_numbers() {
    let (dir, cfg) = optimum_fixture();
    let config = PackageConfig::read(dir.path()).unwrap();
    let lm = lm(dir.path(), &config);
    let original: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    for (key, wrong, says) in [
        (
            "num_hidden_layers",
            cfg.layers + 1,
            format!("KV inputs for {} layers", cfg.layers),
        ),
        (
            "num_key_value_heads",
            cfg.kv_heads + 1,
            format!("{} KV heads", cfg.kv_heads),
        ),
        (
            "head_dim",
            cfg.head_size() * 2,
            format!("head size {}", cfg.head_size()),
        ),
    ] {
        edit_json(dir.path(), "config.json", |v| v[key] = wrong.into());
        let bad = PackageConfig::read(dir.path()).unwrap();
        let e = bad.check_contract(lm.contract()).unwrap_err().to_string();
        assert!(
            e.contains(&format!("{key} is {wrong}")) && e.contains(&says),
            "{e}"
        );
        edit_json(dir.path(), "config.json", |v| {
            v[key] = original[key].clone()
        });
    }
}

#[test]
fn an_optimum_export_opens_and_generates() {
    let (dir, _) = optimum_fixture();
    let mut model = Model::open(
        dir.path(),
        &ModelOptions {
            threads: 1,
            memory: oxgen::MemoryOptions {
                ctx_size: Some(64),
                ..Default::default()
            },
            exact: false,
            ..ModelOptions::default()
        },
    )
    .unwrap();
    let opts = GenerateOptions {
        max_new_tokens: 8,
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    let prompt = Prompt::chat(&[("user", "the cat and the dog")]);
    let out = model.generate(&prompt, &opts, |_| {}).unwrap();
    assert_eq!(out.tokens.len(), 8);
    let again = model.generate(&prompt, &opts, |_| {}).unwrap();
    assert_eq!(again.tokens, out.tokens);
}
