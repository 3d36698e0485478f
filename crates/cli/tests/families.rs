//! Model families as onnxruntime-genai's builder exports them: each tiny random-weight package
//! under `crates/testkit/thirdparty/families/` (made by `make_families.py`, which recorded
//! onnxruntime-genai's own greedy ids in `families.json`) must give those ids on the native
//! backend, alone and batched beside another sequence, and on the ort backend.
//!
//! fp32 packages must match exactly. int4 ones (the builder's `accuracy_level` 4: activations
//! quantized to int8, where oxgen's and onnxruntime's rounding of a near tie may differ) match
//! exactly or, from the first id that differs, agree on at least 95% of the next ids when both
//! are fed onnxruntime-genai's ids one step at a time (teacher-forced top-1).
//!
//! Where llama.cpp's converter maps the family to an architecture oxgen imports (Mistral and
//! Llama 3 as `llama`, with their Q/K rows permuted and Llama 3's scaling as `rope_freqs`; Qwen2; Qwen3; Granite with its multipliers; Phi-3.5
//! with fused projections and LongRoPE, which the importer writes as the builder does, and
//! Phi-4-mini, which rotates 3/4 of each head; Gemma 2
//! with its extra norms, softcaps and alternating window; Gemma 3 with Q/K norms, a layer
//! pattern and a rotary base for its windowed layers; SmolLM3 without rotary on every fourth
//! layer),
//! `make_families.py` also wrote the same checkpoint as an F32 GGUF: imported (f32
//! activations), it must give the builder package's ids too, on both backends.
//!
//! gpt-oss: mixture of experts (`MoE` in fp32, `QMoE` in int4), attention sinks and windowed
//! layers; like Gemma's, its ids must not depend on prompt chunks or the prefix cache.
//!
//! Each required family's Hugging Face checkpoint (`<name>-hf/`, rebuilt from its fp32
//! package by `make_families.py --hf-from-packages`: sharded for Llama 3, transformers 4's
//! config spelling for Phi-4-mini, MXFP4 experts for gpt-oss) must import with `oxgen import`
//! to the builder's ids: at fp32 exactly, on both backends; at int4 with the builder's very
//! quantized bytes (compared weight by weight), hence its ids by the rule above; at fp16 (f16
//! throughout) agreeing with the fp32 ids on at least 90% of the steps teacher-forced.
//!
//! Phi-3.5 / Phi-4-mini (LongRoPE): the prompt starts below `original_max_position_embeddings`
//! and decoding crosses it, so the switch from the short to the long rotary caches is checked,
//! alone and in a batch where the other sequence stays short (per-sequence choice).

use std::path::PathBuf;

use oxgen::{Backend, ExpertCache, GenerateOptions, Model, ModelOptions, Prompt, Sequence};
use oxgen_import::{ImportOptions, Precision, import_gguf, import_hf};

fn families_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testkit/thirdparty/families")
}

struct Case {
    package: String,
    prompt: Vec<u32>,
    genai: Vec<u32>,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(families_dir().join("families.json")).unwrap();
    let manifest: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let mut cases = Vec::new();
    for family in manifest.as_object().unwrap().values() {
        for (package, p) in family["packages"].as_object().unwrap() {
            cases.push(Case {
                package: package.clone(),
                prompt: ids(&family["prompt"]),
                genai: ids(&p["genai"]),
            });
        }
    }
    assert!(!cases.is_empty());
    cases
}

fn open(case: &Case, backend: Backend) -> Model {
    let options = ModelOptions {
        threads: 2,
        backend,
        ..ModelOptions::default()
    };
    Model::open(families_dir().join(&case.package), &options)
        .unwrap_or_else(|e| panic!("{} on {backend:?}: {e}", case.package))
}

/// Greedy for at most `n` ids, stopping at EOS as onnxruntime-genai does (its ids end there).
fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: n,
        ..GenerateOptions::default()
    }
}

/// Feeds the prompt, then onnxruntime-genai's ids one step each; returns how many of those
/// ids are also native's top-1 at their step.
fn teacher_forced_agreement(model: &mut Model, case: &Case) -> usize {
    let mut scorer = model.scorer(case.prompt.len() + case.genai.len()).unwrap();
    scorer.feed(&case.prompt).unwrap();
    let mut last = case.prompt.len() - 1;
    let mut agree = 0;
    for &id in &case.genai {
        let row = scorer.row(last);
        let top = (0..row.len())
            .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
            .unwrap();
        agree += usize::from(top == id as usize);
        scorer.feed(&[id]).unwrap();
        last = 0;
    }
    agree
}

/// Asserts `got` is onnxruntime-genai's ids (see the module doc for int4).
fn check(model: &mut Model, case: &Case, got: &[u32], how: &str) {
    if got == case.genai || !case.package.ends_with("int4") {
        assert_eq!(got, case.genai, "{} {how}", case.package);
        return;
    }
    let first = got
        .iter()
        .zip(&case.genai)
        .take_while(|(a, b)| a == b)
        .count();
    let agree = teacher_forced_agreement(model, case);
    let n = case.genai.len();
    println!(
        "{} {how}: greedy ids agree up to {first} of {n}; teacher-forced top-1 {agree}/{n}",
        case.package
    );
    assert!(
        agree * 100 >= 95 * n,
        "{} {how}: teacher-forced top-1 agreement {agree}/{n} is under 95%",
        case.package
    );
}

fn alone(model: &mut Model, case: &Case) -> Vec<u32> {
    let options = greedy(case.genai.len());
    (model.generate(&Prompt::Tokens(case.prompt.clone()), &options, |_| {}))
        .unwrap_or_else(|e| panic!("{}: {e}", case.package))
        .tokens
}

/// The case's sequence batched with a second one (a short prompt that never reaches the
/// case's length), one `advance_batch` per step, prompts fed 16 ids at a time; returns the
/// case's ids.
fn batched(model: &mut Model, case: &Case) -> Vec<u32> {
    batched_in_chunks(model, case, 16)
}

fn batched_in_chunks(model: &mut Model, case: &Case, chunk: usize) -> Vec<u32> {
    let options = greedy(case.genai.len());
    let other_options = greedy(case.genai.len() / 2);
    let mut seqs: Vec<Sequence> = vec![
        model.start(&case.prompt, &options, None).unwrap(),
        model
            .start(&case.prompt[..3], &other_options, None)
            .unwrap(),
    ];
    let mut ids = Vec::new();
    let mut done = [false; 2];
    while !done[0] {
        let mut live: Vec<&mut Sequence> = (seqs.iter_mut())
            .zip(done)
            .filter(|(_, d)| !d)
            .map(|(s, _)| s)
            .collect();
        let which: Vec<usize> = (0..2).filter(|&k| !done[k]).collect();
        for (k, r) in which.into_iter().zip(model.advance_batch(&mut live, chunk)) {
            for token in r.unwrap() {
                if k == 0 {
                    ids.push(token.id);
                }
                done[k] |= token.finish.is_some();
            }
        }
    }
    for s in seqs {
        model.end(s);
    }
    ids
}

#[test]
fn every_family_gives_onnxruntime_genais_ids_on_native_alone_and_batched() {
    for case in cases() {
        let mut model = open(&case, Backend::Native);
        assert_eq!(model.backend(), "native", "{}", case.package);
        let ids = alone(&mut model, &case);
        check(&mut model, &case, &ids, "alone");
        // Batching never changes a sequence's ids, whatever they are.
        assert_eq!(batched(&mut model, &case), ids, "{} batched", case.package);
    }
}

/// Windowed models (Gemma 2 and 3, gpt-oss, window 8): the ids do not depend on how the prompt is cut
/// into chunks (across the window's edge or not) nor on the prefix cache, which hands a second
/// sequence with the same prompt the first one's blocks.
#[test]
fn windowed_families_do_not_depend_on_chunks_or_the_prefix_cache() {
    for case in (cases().iter())
        .filter(|c| c.package.starts_with("gemma") || c.package.starts_with("gpt-oss"))
    {
        let mut model = open(case, Backend::Native);
        let want = alone(&mut model, case);
        for chunk in [1, 3, 5, 8] {
            let got = batched_in_chunks(&mut model, case, chunk);
            assert_eq!(got, want, "{} in chunks of {chunk}", case.package);
        }
        let options = ModelOptions {
            threads: 2,
            backend: Backend::Native,
            memory: oxgen::MemoryOptions {
                prefix_cache: true,
                ..Default::default()
            },
            ..ModelOptions::default()
        };
        let mut cached = Model::open(families_dir().join(&case.package), &options).unwrap();
        // A prompt of whole blocks and more: the case's prompt and the ids it continues with.
        let prompt: Vec<u32> = case.prompt.iter().chain(&want[..20]).copied().collect();
        let (first, reused) = run_one(&mut cached, &prompt, 4);
        assert_eq!(reused, 0, "{}: nothing cached yet", case.package);
        let (second, reused) = run_one(&mut cached, &prompt, 4);
        assert!(
            reused > 0,
            "{}: the prefix cache gave no blocks",
            case.package
        );
        assert_eq!(first, want[20..24], "{} after the prompt", case.package);
        assert_eq!(second, first, "{} with {reused} cached ids", case.package);
    }
}

/// One sequence fed `prompt` and `n` greedy ids through `start` and `advance_batch`; returns
/// its ids and how many prompt ids the prefix cache supplied.
fn run_one(model: &mut Model, prompt: &[u32], n: usize) -> (Vec<u32>, usize) {
    let mut seq = model.start(prompt, &greedy(n), None).unwrap();
    let reused = seq.cached();
    let mut ids = Vec::new();
    loop {
        let r = model.advance_batch(&mut [&mut seq], 16).remove(0).unwrap();
        ids.extend(r.iter().map(|t| t.id));
        if r.iter().any(|t| t.finish.is_some()) {
            break;
        }
    }
    model.end(seq);
    (ids, reused)
}

#[test]
fn every_family_gives_onnxruntime_genais_ids_on_the_ort_backend() {
    for case in cases() {
        let mut model = open(&case, Backend::Ort);
        let ids = alone(&mut model, &case);
        check(&mut model, &case, &ids, "on ort");
    }
}

/// A generation shorter than a windowed layer's window (Gemma 2's is 8 here): onnxruntime
/// wants a KV capacity of at least the window, whatever the prompt and `max_new_tokens`.
#[test]
fn a_generation_shorter_than_the_window_runs_on_both_backends() {
    for case in cases() {
        let short = Case {
            prompt: case.prompt[..3].to_vec(),
            genai: Vec::new(),
            package: case.package.clone(),
        };
        let options = greedy(2);
        let mut ids = Vec::new();
        for backend in [Backend::Native, Backend::Ort] {
            let mut model = open(&short, backend);
            let got = (model.generate(&Prompt::Tokens(short.prompt.clone()), &options, |_| {}))
                .unwrap_or_else(|e| panic!("{} on {backend:?}: {e}", case.package))
                .tokens;
            ids.push(got);
        }
        if !case.package.ends_with("int4") {
            assert_eq!(ids[0], ids[1], "{}", case.package);
        }
    }
}

#[test]
fn a_gguf_of_the_same_checkpoint_imports_to_the_same_ids() {
    let text = std::fs::read_to_string(families_dir().join("families.json")).unwrap();
    let manifest: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut checked = 0;
    for (name, family) in manifest.as_object().unwrap() {
        let (Some(gguf), Some(arch)) = (
            family["gguf"]["file"].as_str(),
            family["gguf"]["architecture"].as_str(),
        ) else {
            continue;
        };
        let case = cases()
            .into_iter()
            .find(|c| c.package == format!("{name}-fp32"))
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let package = dir.path().join("package");
        let options = ImportOptions {
            accuracy_level: 0,
            ..ImportOptions::default()
        };
        let imported = import_gguf(&families_dir().join(gguf), &package, &options).unwrap();
        assert_eq!(imported.architecture, arch);
        assert_ids_on_both_backends(&package, &case, name, &format!("{gguf} imported"));
        checked += 1;
    }
    assert!(checked >= 10, "families.json names {checked} GGUFs");
}

#[test]
fn a_hugging_face_checkpoint_imports_to_the_builders_ids_and_bytes() {
    let mut checked = Vec::new();
    for case in cases().into_iter().filter(|c| c.package.ends_with("-fp32")) {
        let name = case.package.trim_end_matches("-fp32");
        let hf = families_dir().join(format!("{name}-hf"));
        if !hf.is_dir() {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let fp32 = dir.path().join("fp32");
        let exact = ImportOptions {
            accuracy_level: 0,
            ..ImportOptions::default()
        };
        import_hf(&hf, &fp32, Precision::Fp32, &exact).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_ids_on_both_backends(&fp32, &case, name, &format!("{name}-hf fp32"));

        // fp16 throughout (the builder's `-p fp16` layout; no such package is committed):
        // the fp32 ids teacher-forced, on both backends.
        if name != "gpt-oss" {
            let fp16 = dir.path().join("fp16");
            import_hf(&hf, &fp16, Precision::Fp16, &exact).unwrap();
            for backend in [Backend::Native, Backend::Ort] {
                let options = ModelOptions {
                    threads: 2,
                    backend,
                    ..ModelOptions::default()
                };
                let mut model = Model::open(&fp16, &options).unwrap();
                let agree = teacher_forced_agreement(&mut model, &case);
                let n = case.genai.len();
                println!("{name}-hf fp16 {backend:?}: teacher-forced top-1 {agree}/{n}");
                assert!(
                    agree * 10 >= 9 * n,
                    "{name}-hf fp16 {backend:?}: {agree}/{n}"
                );
            }
        }

        // int4 at the builder's accuracy level: the builder's bytes, so its ids.
        let int4 = dir.path().join("int4");
        import_hf(&hf, &int4, Precision::Int4, &ImportOptions::default()).unwrap();
        let builder = families_dir().join(format!("{name}-int4"));
        let same = same_quantized_weights(&int4, &builder, name);
        let case = cases()
            .into_iter()
            .find(|c| c.package == format!("{name}-int4"))
            .unwrap();
        let mut model = Model::open(
            &int4,
            &ModelOptions {
                threads: 2,
                ..ModelOptions::default()
            },
        )
        .unwrap();
        let got = alone(&mut model, &case);
        if name == "gpt-oss" {
            // The quantizers differ on the experts by design: the import keeps the
            // checkpoint's MXFP4 (exact), the builder requantizes it to int4 blocks; every
            // other weight is the builder's (above). So the ids are compared teacher-forced,
            // with how far the logits moved.
            let mut theirs = open(&case, Backend::Native);
            let agree = teacher_forced_agreement(&mut model, &case);
            let (max_abs, spread) = logit_error(&mut model, &mut theirs, &case);
            let n = case.genai.len();
            println!(
                "gpt-oss-hf int4 vs the builder's int4: teacher-forced top-1 {agree}/{n}, logits \
                 differ by at most {max_abs:.3} (the logits span {spread:.3})"
            );
            assert!(
                agree * 10 >= 9 * n && max_abs < 0.1 * spread,
                "{agree}/{n}, {max_abs}"
            );
            checked.push(format!(
                "{name} ({same} non-expert weights equal the builder's)"
            ));
            continue;
        }
        check(&mut model, &case, &got, &format!("imported from {name}-hf"));
        checked.push(format!(
            "{name} ({same} MatMulNBits weights equal the builder's)"
        ));
    }
    println!("checked: {checked:?}");
    assert!(
        checked.len() >= 12,
        "only {checked:?} have Hugging Face folders"
    );
}

/// Asserts `package` gives the case's ids alone on the native backend and, unless it is
/// gpt-oss's (MXFP4 experts as QMoE fp4, which onnxruntime runs on CUDA only), on ort.
fn assert_ids_on_both_backends(package: &std::path::Path, case: &Case, family: &str, what: &str) {
    let backends: &[Backend] = if family == "gpt-oss" {
        &[Backend::Native]
    } else {
        &[Backend::Native, Backend::Ort]
    };
    for &backend in backends {
        let options = ModelOptions {
            threads: 2,
            backend,
            ..ModelOptions::default()
        };
        let mut model = Model::open(package, &options).unwrap();
        assert_eq!(alone(&mut model, case), case.genai, "{what}, {backend:?}");
    }
}

/// Feeds the prompt and the case's ids to both models; returns the largest difference of
/// their logits at any step and the largest spread (max - min) of a logit row.
fn logit_error(a: &mut Model, b: &mut Model, case: &Case) -> (f32, f32) {
    let len = case.prompt.len() + case.genai.len();
    let (mut sa, mut sb) = (a.scorer(len).unwrap(), b.scorer(len).unwrap());
    let (mut max_abs, mut spread) = (0f32, 0f32);
    let mut feed = |ids: &[u32]| {
        sa.feed(ids).unwrap();
        sb.feed(ids).unwrap();
        let (ra, rb) = (sa.row(ids.len() - 1), sb.row(ids.len() - 1));
        for (x, y) in ra.iter().zip(rb) {
            max_abs = max_abs.max((x - y).abs());
        }
        let (lo, hi) = ra
            .iter()
            .fold((f32::MAX, f32::MIN), |(l, h), &x| (l.min(x), h.max(x)));
        spread = spread.max(hi - lo);
    };
    feed(&case.prompt);
    for &id in &case.genai {
        feed(&[id]);
    }
    (max_abs, spread)
}

/// Asserts every `MatMulNBits` weight of the imported int4 `package` equals the builder's
/// (`builder`, its Q, K and V packed in one product: our q, k and v rows in order) in codes
/// and scales; returns how many were compared. gpt-oss's experts are left out: the import
/// keeps the checkpoint's MXFP4, the builder requantizes them to int4.
fn same_quantized_weights(
    package: &std::path::Path,
    builder: &std::path::Path,
    name: &str,
) -> usize {
    let load = |dir: &std::path::Path| {
        let model = oxgen_onnx::Model::load(dir.join("model.onnx")).unwrap();
        (model.graph().initializer.iter())
            .map(|t| (t.name.clone().unwrap_or_default(), model.tensor(t).unwrap()))
            .collect::<std::collections::HashMap<String, oxgen_tensor::Tensor>>()
    };
    let (ours, theirs) = (load(package), load(builder));
    let bytes = |names: &[String], suffix: &str| -> Vec<u8> {
        names
            .iter()
            .flat_map(|n| ours[&format!("{n}.{suffix}")].as_bytes().to_vec())
            .collect()
    };
    let mut pairs: Vec<(Vec<String>, String)> =
        vec![(vec!["lm_head".into()], "lm_head.MatMul.weight".into())];
    let layers = (0..)
        .take_while(|l| ours.contains_key(&format!("layers.{l}.o.qweight")))
        .count();
    for l in 0..layers {
        let (o, b) = (format!("layers.{l}"), format!("model.layers.{l}"));
        pairs.push((
            ["q", "k", "v"].map(|p| format!("{o}.{p}")).to_vec(),
            format!("{b}.attn.qkv_proj.MatMul.weight"),
        ));
        pairs.push((
            vec![format!("{o}.o")],
            format!("{b}.attn.o_proj.MatMul.weight"),
        ));
        if name == "gpt-oss" {
            pairs.push((
                vec![format!("{o}.router")],
                format!("{b}.moe.router.MatMul.weight"),
            ));
            continue;
        }
        for p in ["gate", "up", "down"] {
            pairs.push((
                vec![format!("{o}.{p}")],
                format!("{b}.mlp.{p}_proj.MatMul.weight"),
            ));
        }
    }
    for (ours_names, theirs_name) in &pairs {
        assert_eq!(
            bytes(ours_names, "qweight"),
            theirs[&format!("{theirs_name}_Q4")].as_bytes(),
            "{name}: {ours_names:?} codes"
        );
        assert_eq!(
            bytes(ours_names, "scales"),
            theirs[&format!("{theirs_name}_scales")].as_bytes(),
            "{name}: {ours_names:?} scales"
        );
    }
    pairs.len()
}

/// gpt-oss's GGUF imported at the default accuracy level: its MXFP4 experts take int8
/// activations, in tiles repacked at load (no budget) or gathered from the file at each use
/// (a budget of 0). Both give the same ids, alone and batched; the logits differ from the
/// f32 import's (int8 activations are in use) but stay close to them.
#[test]
fn imported_mxfp4_experts_take_int8_activations_packed_or_gathered() {
    let case = cases()
        .into_iter()
        .find(|c| c.package == "gpt-oss-fp32")
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gguf = families_dir().join("gpt-oss.gguf");
    // Every prompt position's logits, per level and budget.
    let mut logits: Vec<Vec<f32>> = Vec::new();
    for accuracy_level in [0, 4] {
        let package = dir.path().join(format!("level-{accuracy_level}"));
        let options = ImportOptions {
            accuracy_level,
            ..ImportOptions::default()
        };
        import_gguf(&gguf, &package, &options).unwrap();
        let mut ids = Vec::new();
        for weight_budget in [None, Some(0)] {
            let options = ModelOptions {
                threads: 2,
                backend: Backend::Native,
                memory: oxgen::MemoryOptions {
                    weight_budget,
                    ..Default::default()
                },
                ..ModelOptions::default()
            };
            let mut model = Model::open(&package, &options).unwrap();
            let what = format!("level {accuracy_level}, budget {weight_budget:?}");
            let alone = alone(&mut model, &case);
            assert_eq!(batched(&mut model, &case), alone, "{what}");
            ids.push(alone);
            let mut scorer = model.scorer(case.prompt.len()).unwrap();
            scorer.feed(&case.prompt).unwrap();
            logits.push(
                (0..case.prompt.len())
                    .flat_map(|i| scorer.row(i).to_vec())
                    .collect(),
            );
        }
        assert_eq!(ids[0], ids[1], "level {accuracy_level}");
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&logits[0]),
        bits(&logits[1]),
        "f32, packed or gathered"
    );
    assert_eq!(
        bits(&logits[2]),
        bits(&logits[3]),
        "int8, packed or gathered"
    );
    let (f32s, int8) = (&logits[0], &logits[2]);
    assert_ne!(bits(f32s), bits(int8), "int8 activations change the logits");
    let scale = f32s.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = f32s
        .iter()
        .zip(int8)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        worst <= 0.05 * scale,
        "logits moved by {worst} (largest {scale})"
    );
}

/// gpt-oss (2 MoE layers, 2 of 4 experts per token): a decode step of one sequence computes
/// exactly its 2 experts in each layer, and a batch of identical sequences shares them (their
/// tokens route alike), so the experts' weights stream once for all of them.
#[test]
fn a_moe_step_computes_only_the_routed_experts_once_per_batch() {
    for case in cases().iter().filter(|c| c.package.starts_with("gpt-oss")) {
        let mut model = open(case, Backend::Native);
        for n in [1, 3] {
            let mut seqs: Vec<Sequence> = (0..n)
                .map(|_| model.start(&case.prompt, &greedy(4), None).unwrap())
                .collect();
            let mut refs: Vec<&mut Sequence> = seqs.iter_mut().collect();
            for r in model.advance_batch(&mut refs, usize::MAX) {
                r.unwrap();
            }
            let before = model.counters();
            for r in model.advance_batch(&mut refs, usize::MAX) {
                assert_eq!(r.unwrap().len(), 1);
            }
            let after = model.counters();
            let what = format!("{} batch {n}", case.package);
            assert_eq!(after.moe_layers - before.moe_layers, 2, "{what}");
            assert_eq!(after.moe_experts - before.moe_experts, 4, "{what}");
            assert_eq!(after.moe_routes - before.moe_routes, 4 * n as u64, "{what}");
            for s in seqs {
                model.end(s);
            }
        }
    }
}

/// The weight budget changes which expert weights stay resident, never the ids: gpt-oss with
/// no bound, with every expert dropped after each use (0), with room for all, and with room
/// for half under each policy.
#[test]
fn the_weight_budget_changes_residency_not_ids() {
    for case in cases().iter().filter(|c| c.package.starts_with("gpt-oss")) {
        let mut all = Vec::new();
        for budget in [None, Some(0), Some(1 << 30)] {
            let options = ModelOptions {
                threads: 2,
                backend: Backend::Native,
                memory: oxgen::MemoryOptions {
                    weight_budget: budget,
                    ..Default::default()
                },
                ..ModelOptions::default()
            };
            let mut model = Model::open(families_dir().join(&case.package), &options).unwrap();
            let ids = alone(&mut model, case);
            let r = model.counters().experts;
            let what = format!("{} budget {budget:?}: {r:?}", case.package);
            assert!(r.misses > 0, "{what}");
            if budget == Some(0) {
                assert_eq!(
                    (r.hits, r.evictions, r.resident_bytes),
                    (0, r.misses, 0),
                    "{what}"
                );
            } else {
                assert_eq!(r.evictions, 0, "{what}");
                assert!(r.hits > 0 && r.peak_bytes == r.resident_bytes, "{what}");
            }
            all.push(ids);
        }
        // Room for half the experts: each policy evicts some, and the ids stay.
        let half = {
            let options = ModelOptions {
                threads: 2,
                memory: oxgen::MemoryOptions {
                    weight_budget: Some(1 << 30),
                    ..Default::default()
                },
                ..ModelOptions::default()
            };
            let mut model = Model::open(families_dir().join(&case.package), &options).unwrap();
            alone(&mut model, case);
            model.counters().experts.peak_bytes / 2
        };
        for expert_cache in [ExpertCache::Lru, ExpertCache::Frequency] {
            let options = ModelOptions {
                threads: 2,
                memory: oxgen::MemoryOptions {
                    weight_budget: Some(half),
                    expert_cache,
                    ..Default::default()
                },
                ..ModelOptions::default()
            };
            let mut model = Model::open(families_dir().join(&case.package), &options).unwrap();
            all.push(alone(&mut model, case));
            let r = model.counters().experts;
            assert!(r.evictions > 0 && r.hits > 0, "{expert_cache:?}: {r:?}");
            assert!(r.resident_bytes <= half, "{expert_cache:?}: {r:?}");
        }
        assert!(
            all.iter().all(|ids| *ids == all[0]),
            "{}: {all:?}",
            case.package
        );
    }
}

/// llama.cpp itself on the same GGUFs (`llama_cpp_ids.py` recorded what its
/// `llama-completion` does with them in `llama_cpp.json`): imported at the default accuracy
/// level (gpt-oss's MXFP4 experts then take int8 activations, as llama.cpp's do), each
/// tokenizes the prompt to llama.cpp's ids and generates llama.cpp's bytes greedily, EOS
/// ignored: nine architectures, F32 and MXFP4, checked against an implementation that shares
/// nothing with oxgen or onnxruntime.
#[test]
fn imported_ggufs_generate_what_llama_cpp_generates() {
    let text = std::fs::read_to_string(families_dir().join("llama_cpp.json")).unwrap();
    let refs: serde_json::Value = serde_json::from_str(&text).unwrap();
    let prompt = refs["prompt"].as_str().unwrap();
    let n = refs["new_tokens"].as_u64().unwrap() as usize;
    let mut checked = 0;
    for (name, family) in refs["families"].as_object().unwrap() {
        let dir = tempfile::tempdir().unwrap();
        let package = dir.path().join("package");
        let gguf = families_dir().join(family["gguf"].as_str().unwrap());
        import_gguf(&gguf, &package, &ImportOptions::default()).unwrap();
        let options = ModelOptions {
            threads: 2,
            ..ModelOptions::default()
        };
        let mut model = Model::open(&package, &options).unwrap();
        let ids = model
            .encoder()
            .encode(&Prompt::Text(prompt.into()))
            .unwrap();
        let want: Vec<u64> = (family["prompt_ids"].as_array().unwrap().iter())
            .map(|v| v.as_u64().unwrap())
            .collect();
        let got: Vec<u64> = ids.iter().map(|&i| u64::from(i)).collect();
        assert_eq!(got, want, "{name}: the prompt's ids");
        // llama.cpp's --ignore-eos masks every end-of-generation id it knows.
        let mut options = GenerateOptions {
            max_new_tokens: n,
            ignore_eos: true,
            ..GenerateOptions::default()
        };
        options.sampling.logit_bias = (family["eog_ids"].as_array().unwrap().iter())
            .map(|v| (v.as_u64().unwrap() as u32, f32::NEG_INFINITY))
            .collect();
        let out = model
            .generate(&Prompt::Tokens(ids), &options, |_| {})
            .unwrap();
        assert_eq!(out.tokens.len(), n, "{name}");
        // llama-completion prints no special token's text, and each piece with `%s`, so a NUL
        // byte never reaches its output.
        let tokenizer = model.tokenizer();
        let bytes: Vec<u8> = (out.tokens.iter())
            .filter(|&&id| tokenizer.special_token(id).is_none())
            .flat_map(|&id| tokenizer.token_bytes(id))
            .filter(|&b| b != 0)
            .collect();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, family["generated_hex"].as_str().unwrap(), "{name}");
        checked += 1;
    }
    assert!(checked >= 9, "llama_cpp.json names {checked} GGUFs");
}
