//! LoRA adapters against their oracles (`crates/testkit/thirdparty/lora/`, made by
//! `make_lora.py`): two random adapters over the Llama 3 family fixture, as PEFT folders and
//! as onnxruntime `.onnx_adapter` files, with transformers+peft's greedy ids on the fp32
//! checkpoint and onnxruntime-genai's (Adapters API) on builder packages that take LoRA
//! inputs.
//!
//! - `.onnx_adapter` files on the builder's LoRA packages (q, k, v unpacked; empty LoRA
//!   branches by default): onnxruntime-genai's ids, fp32 exactly, int4 (int8 activations)
//!   exactly or by the families test's rule.
//! - PEFT folders on packages without LoRA inputs, whose weights came from the same
//!   checkpoint: the builder's fp32 package (Q, K and V packed into one product, so `q_proj`
//!   adds to its slice) and `oxgen import`'s (`layers.0.q` names): transformers+peft's ids;
//!   the builder's int4 package: onnxruntime-genai's int4 ids.
//! - A batch mixing both adapters and the base gives each sequence the bits it has alone.
//! - The prefix cache keeps the base's blocks and each adapter's apart.
//! - Bad adapters are refused naming the module; an unknown adapter name is an error.

use std::path::{Path, PathBuf};

use oxgen::{Error, GenerateOptions, Logprobs, Model, ModelOptions, Prompt, Sequence};

fn thirdparty() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testkit/thirdparty")
}

fn lora_dir() -> PathBuf {
    thirdparty().join("lora")
}

struct Oracle {
    prompt: Vec<u32>,
    new_tokens: usize,
    json: serde_json::Value,
}

impl Oracle {
    fn read() -> Oracle {
        let text = std::fs::read_to_string(lora_dir().join("lora.json")).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        Oracle {
            prompt: ids(&json["prompt"]),
            new_tokens: json["new_tokens"].as_u64().unwrap() as usize,
            json,
        }
    }

    /// The ids `who` (`transformers_peft`, or `genai` then a precision) gives `adapter`.
    fn ids(&self, path: &[&str], adapter: &str) -> Vec<u32> {
        let v = path.iter().fold(&self.json, |v, k| &v[k]);
        ids(&v[adapter])
    }
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    (v.as_array().unwrap().iter())
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn open(package: &Path, lora: &[(&str, PathBuf)], prefix_cache: bool) -> Model {
    let options = ModelOptions {
        threads: 2,
        lora: lora
            .iter()
            .map(|(n, p)| (n.to_string(), p.clone()))
            .collect(),
        memory: oxgen::MemoryOptions {
            prefix_cache,
            ..Default::default()
        },
        ..ModelOptions::default()
    };
    Model::open(package, &options).unwrap_or_else(|e| panic!("{}: {e}", package.display()))
}

fn greedy(oracle: &Oracle, adapter: Option<&str>) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: oracle.new_tokens,
        ignore_eos: true,
        adapter: adapter.map(str::to_string),
        ..GenerateOptions::default()
    }
}

fn alone(model: &mut Model, oracle: &Oracle, adapter: Option<&str>) -> Vec<u32> {
    let prompt = Prompt::Tokens(oracle.prompt.clone());
    (model.generate(&prompt, &greedy(oracle, adapter), |_| {}))
        .unwrap_or_else(|e| panic!("{adapter:?}: {e}"))
        .tokens
}

const ADAPTERS: [Option<&str>; 3] = [None, Some("a"), Some("b")];

fn name(adapter: Option<&str>) -> &str {
    adapter.unwrap_or("base")
}

/// The three sequences (base, a, b) in one batch, one `advance_batch` per step, prompts fed
/// 5 ids at a time; each one's ids and log-probabilities.
fn batched(model: &mut Model, oracle: &Oracle) -> Vec<(Vec<u32>, Vec<Logprobs>)> {
    let mut seqs: Vec<Sequence> = (ADAPTERS.iter())
        .map(|a| {
            model
                .start(&oracle.prompt, &greedy(oracle, *a), Some(2))
                .unwrap()
        })
        .collect();
    let mut out = vec![(Vec::new(), Vec::new()); seqs.len()];
    let mut done = vec![false; seqs.len()];
    while done.iter().any(|d| !d) {
        let which: Vec<usize> = (0..seqs.len()).filter(|&k| !done[k]).collect();
        let mut live: Vec<&mut Sequence> = (seqs.iter_mut())
            .zip(&done)
            .filter(|(_, d)| !**d)
            .map(|(s, _)| s)
            .collect();
        for (k, r) in which.into_iter().zip(model.advance_batch(&mut live, 5)) {
            for step in r.unwrap() {
                out[k].0.push(step.id);
                out[k].1.push(step.logprobs.unwrap());
                done[k] |= step.finish.is_some();
            }
        }
    }
    for s in seqs {
        model.end(s);
    }
    out
}

/// One sequence alone through `advance_batch`: ids and log-probabilities.
fn alone_stepped(
    model: &mut Model,
    oracle: &Oracle,
    adapter: Option<&str>,
) -> (Vec<u32>, Vec<Logprobs>) {
    let mut seq = model
        .start(&oracle.prompt, &greedy(oracle, adapter), Some(2))
        .unwrap();
    let (mut ids, mut logprobs) = (Vec::new(), Vec::new());
    loop {
        let mut live = vec![&mut seq];
        let steps = model.advance_batch(&mut live, 5).pop().unwrap().unwrap();
        let finished = steps.iter().any(|s| s.finish.is_some());
        for step in steps {
            ids.push(step.id);
            logprobs.push(step.logprobs.unwrap());
        }
        if finished {
            break;
        }
    }
    model.end(seq);
    (ids, logprobs)
}

fn onnx_adapters() -> Vec<(&'static str, PathBuf)> {
    vec![
        ("a", lora_dir().join("a.onnx_adapter")),
        ("b", lora_dir().join("b.onnx_adapter")),
    ]
}

fn peft_adapters() -> Vec<(&'static str, PathBuf)> {
    vec![
        ("a", lora_dir().join("a-peft")),
        ("b", lora_dir().join("b-peft")),
    ]
}

/// Asserts each of base, a and b on `package` (with `adapters`) gives `oracle`'s ids at
/// `path` (`transformers_peft`, or `genai` then a precision).
fn assert_ids(package: &Path, adapters: &[(&str, PathBuf)], path: &[&str]) {
    let oracle = Oracle::read();
    let mut model = open(package, adapters, false);
    for adapter in ADAPTERS {
        let want = oracle.ids(path, name(adapter));
        let got = alone(&mut model, &oracle, adapter);
        assert_eq!(got, want, "{} {path:?} {adapter:?}", package.display());
    }
}

#[test]
fn onnx_adapters_on_a_lora_package_give_onnxruntime_genai_ids() {
    let package = lora_dir().join("llama3-lora-fp32");
    assert_ids(&package, &onnx_adapters(), &["genai", "fp32"]);
}

#[test]
fn onnx_adapters_on_an_int4_lora_package_give_onnxruntime_genai_ids() {
    let package = lora_dir().join("llama3-lora-int4");
    assert_ids(&package, &onnx_adapters(), &["genai", "int4"]);
}

#[test]
fn peft_folders_on_a_packed_builder_package_give_transformers_ids() {
    let package = thirdparty().join("families/llama3-fp32");
    assert_ids(&package, &peft_adapters(), &["transformers_peft"]);
}

/// int4, Q, K and V packed, gate and up kept apart from their fused form: the builder's
/// LoRA package quantized the same rows, so onnxruntime-genai's int4 ids.
#[test]
fn peft_folders_on_a_packed_int4_builder_package_give_onnxruntime_genai_ids() {
    let package = thirdparty().join("families/llama3-int4");
    assert_ids(&package, &peft_adapters(), &["genai", "int4"]);
}

#[test]
fn peft_folders_on_an_imported_package_give_transformers_ids() {
    let out = tempfile::tempdir().unwrap();
    let package = out.path().join("llama3");
    let hf = thirdparty().join("families/llama3-hf");
    let (precision, options) = (oxgen_import::Precision::Fp32, Default::default());
    oxgen_import::import_hf(&hf, &package, precision, &options).unwrap();
    assert_ids(&package, &peft_adapters(), &["transformers_peft"]);
}

#[test]
fn a_batch_mixing_adapters_gives_each_sequence_its_bits_alone() {
    let oracle = Oracle::read();
    let mut model = open(
        &lora_dir().join("llama3-lora-fp32"),
        &onnx_adapters(),
        false,
    );
    let together = batched(&mut model, &oracle);
    for (adapter, (ids, logprobs)) in ADAPTERS.iter().zip(together) {
        let (alone_ids, alone_logprobs) = alone_stepped(&mut model, &oracle, *adapter);
        assert_eq!(ids, oracle.ids(&["genai", "fp32"], name(*adapter)));
        assert_eq!(ids, alone_ids, "{adapter:?}");
        for (k, (x, y)) in logprobs.iter().zip(&alone_logprobs).enumerate() {
            assert_eq!(
                x.logprob.to_bits(),
                y.logprob.to_bits(),
                "{adapter:?} step {k}"
            );
            assert_eq!(x.top, y.top, "{adapter:?} step {k}");
        }
    }
}

#[test]
fn the_prefix_cache_keeps_each_adapters_blocks_apart() {
    let oracle = Oracle::read();
    // A prompt of several 16-position blocks, so that its prefix is cached.
    let prompt: Vec<u32> = (0..40)
        .map(|i| oracle.prompt[i % oracle.prompt.len()])
        .collect();
    let long = Oracle {
        prompt,
        new_tokens: 8,
        json: serde_json::Value::Null,
    };
    let package = lora_dir().join("llama3-lora-fp32");
    let mut cold = open(&package, &onnx_adapters(), false);
    let want: Vec<Vec<u32>> = (ADAPTERS.iter())
        .map(|a| alone(&mut cold, &long, *a))
        .collect();
    assert!(want[0] != want[1] && want[1] != want[2]);
    let mut model = open(&package, &onnx_adapters(), true);
    // Base, a, b, then each again: the second runs find their own adapter's blocks.
    for round in 0..2 {
        for (adapter, want) in ADAPTERS.iter().zip(&want) {
            let before = model.kv_usage().unwrap().prefix_hits;
            let prompt = Prompt::Tokens(long.prompt.clone());
            let out = (model.generate(&prompt, &greedy(&long, *adapter), |_| {})).unwrap();
            assert_eq!(&out.tokens, want, "round {round} {adapter:?}");
            // Another prompt in between, so the next run starts a fresh sequence.
            model.reset();
            let hits = model.kv_usage().unwrap().prefix_hits - before;
            assert_eq!(
                hits > 0,
                round == 1,
                "round {round} {adapter:?}: {hits} hits"
            );
        }
    }
}

/// Writes a PEFT folder whose tensors are `tensors` (name under `base_model.model.`, shape).
fn peft_folder(dir: &Path, tensors: &[(&str, [usize; 2])]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let config = r#"{"peft_type": "LORA", "r": 4, "lora_alpha": 8}"#;
    std::fs::write(dir.join("adapter_config.json"), config).unwrap();
    let names: Vec<String> = (tensors.iter())
        .map(|(n, _)| format!("base_model.model.{n}"))
        .collect();
    let data: Vec<Vec<f32>> = (tensors.iter())
        .map(|(_, s)| vec![0.01; s[0] * s[1]])
        .collect();
    let written: Vec<(&str, &[usize], &[f32])> = (names.iter().zip(tensors).zip(&data))
        .map(|((n, (_, s)), d)| (n.as_str(), &s[..], &d[..]))
        .collect();
    oxgen_import::safetensors::write_f32(&dir.join("adapter_model.safetensors"), &written).unwrap();
    dir.to_path_buf()
}

#[test]
fn bad_adapters_are_refused_naming_the_module() {
    let package = thirdparty().join("families/llama3-fp32");
    let mut model = Model::open(
        &package,
        &ModelOptions {
            threads: 1,
            max_loras: 2,
            ..ModelOptions::default()
        },
    )
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let q = "model.layers.0.self_attn.q_proj";
    let cases = [
        (
            "ranks",
            vec![
                (format!("{q}.lora_A.weight"), [4, 64]),
                (format!("{q}.lora_B.weight"), [64, 8]),
            ],
            "ranks must agree",
        ),
        (
            "missing",
            vec![
                ("model.layers.7.mlp.up_proj.lora_A.weight".into(), [4, 64]),
                ("model.layers.7.mlp.up_proj.lora_B.weight".into(), [128, 4]),
            ],
            "'model.layers.7.mlp.up_proj' names no projection",
        ),
        (
            "shapes",
            vec![
                (format!("{q}.lora_A.weight"), [4, 96]),
                (format!("{q}.lora_B.weight"), [64, 4]),
            ],
            "maps 96 features to 64",
        ),
    ];
    for (label, tensors, message) in cases {
        let tensors: Vec<(&str, [usize; 2])> =
            tensors.iter().map(|(n, s)| (n.as_str(), *s)).collect();
        let dir = peft_folder(&tmp.path().join(label), &tensors);
        let err = model.load_adapter(label, &dir).unwrap_err().to_string();
        assert!(
            err.contains(message) && err.contains(label),
            "{label}: {err}"
        );
    }
    // Two fit (the model holds two); a third is refused until one is unloaded.
    let good = [
        (format!("{q}.lora_A.weight"), [4, 64]),
        (format!("{q}.lora_B.weight"), [64, 4]),
    ];
    let good: Vec<(&str, [usize; 2])> = good.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    let dir = peft_folder(&tmp.path().join("good"), &good);
    model.load_adapter("one", &dir).unwrap();
    model.load_adapter("two", &dir).unwrap();
    let err = model.load_adapter("three", &dir).unwrap_err().to_string();
    assert!(err.contains("unload one first"), "{err}");
    model.unload_adapter("one").unwrap();
    model.load_adapter("three", &dir).unwrap();
    let names: Vec<String> = model.adapters().into_iter().map(|a| a.name).collect();
    assert_eq!(names, ["three", "two"]);
    // A generation naming an adapter not loaded.
    let options = GenerateOptions {
        adapter: Some("one".into()),
        max_new_tokens: 2,
        ..GenerateOptions::default()
    };
    let err = model
        .generate(&Prompt::Tokens(vec![0, 8, 25]), &options, |_| {})
        .unwrap_err();
    assert!(matches!(err, Error::UnknownAdapter { .. }), "{err}");
    assert!(err.to_string().contains("loaded: three, two"), "{err}");
}

#[test]
fn a_model_opened_without_room_for_adapters_says_how_to_make_room() {
    let package = thirdparty().join("families/llama3-fp32");
    let mut model = Model::open(&package, &ModelOptions::default()).unwrap();
    let err = model
        .load_adapter("a", &lora_dir().join("a-peft"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("--max-loras"), "{err}");
}
