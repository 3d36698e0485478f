//! The library path end to end on a fixture package: chat prompt -> template -> tokens ->
//! greedy decoding with KV in place -> streamed text.

use oxgen::{
    Cancel, Chat, FinishReason, GenerateOptions, KvBudget, Model, ModelOptions, Prompt,
    SamplingParams,
};
use oxgen_testkit::fixtures::{FixtureConfig, write_package};

#[test]
fn generates_the_same_greedy_tokens_as_stepping_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    write_package(dir.path(), &FixtureConfig::default()).unwrap();
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
    let prompt = Prompt::chat(&[("user", "the cat and the dog")]);
    let ids = model.encode(&prompt).unwrap();
    assert_eq!(
        &ids[..1],
        &[1],
        "the ChatML template opens with <|im_start|>"
    );
    let mut text = String::new();
    let opts = GenerateOptions {
        max_new_tokens: 12,
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    let out = model
        .generate(&prompt, &opts, |piece| text.push_str(piece))
        .unwrap();
    assert_eq!(out.tokens.len(), 12);
    assert_eq!(out.finish_reason, FinishReason::Length);
    assert_eq!(text, model.tokenizer().decode(&out.tokens, true).unwrap());
    // Greedy is deterministic: a second run from a fresh sequence gives the same ids.
    let again = model.generate(&prompt, &opts, |_| {}).unwrap();
    assert_eq!(again.tokens, out.tokens);
    // Raw token prompts skip the template.
    let raw = model
        .generate(&Prompt::Tokens(ids.clone()), &opts, |_| {})
        .unwrap();
    assert_eq!(raw.tokens, out.tokens);
    // By hand: no KV kept between steps; the whole sequence so far goes through the model
    // each time, and the next token is the argmax of its last row.
    let mut seq = ids;
    for _ in 0..opts.max_new_tokens {
        let (logits, vocab) = model.logits(&seq).unwrap();
        let last = &logits[logits.len() - vocab..];
        let best = (0..vocab).fold(0, |b, i| if last[i] > last[b] { i } else { b });
        seq.push(best as u32);
    }
    assert_eq!(seq[seq.len() - out.tokens.len()..], out.tokens[..]);
}

#[test]
fn a_folder_without_genai_config_says_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let e = Model::open(dir.path(), &ModelOptions::default())
        .err()
        .expect("no package there");
    assert!(e.to_string().contains("genai_config.json"), "{e}");
}

fn fixture_model(ctx_size: Option<usize>) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().unwrap();
    write_package(dir.path(), &FixtureConfig::default()).unwrap();
    let model = Model::open(
        dir.path(),
        &ModelOptions {
            threads: 1,
            memory: oxgen::MemoryOptions {
                ctx_size,
                ..Default::default()
            },
            exact: false,
            ..ModelOptions::default()
        },
    )
    .unwrap();
    (dir, model)
}

/// The default KV pool holds two sequences of `--ctx-size` when one is set, else of the whole
/// context (past the floor of 1024 blocks of 16 positions, so many sequences are asked for).
#[test]
fn the_kv_pool_counts_sequences_of_the_ctx_size() {
    let blocks = |ctx_size: Option<usize>| {
        let dir = tempfile::tempdir().unwrap();
        write_package(dir.path(), &FixtureConfig::default()).unwrap();
        let options = ModelOptions {
            threads: 1,
            memory: oxgen::MemoryOptions {
                ctx_size,
                kv: KvBudget::Sequences(300),
                ..Default::default()
            },
            ..ModelOptions::default()
        };
        let model = Model::open(dir.path(), &options).unwrap();
        model.kv_usage().expect("a paged pool").total
    };
    // The fixture's context is 128 positions: 8 blocks a sequence, 2 at a ctx_size of 32.
    assert_eq!(blocks(None), 300 * 8);
    assert_eq!(blocks(Some(32)), 1024);
    assert_eq!(blocks(Some(80)), 300 * 5);
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: n,
        ignore_eos: true,
        ..GenerateOptions::default()
    }
}

#[test]
fn a_chat_turn_prefills_only_what_it_adds_and_matches_a_fresh_run() {
    let (_dir, mut model) = fixture_model(Some(128));
    let options = greedy(6);
    let mut chat = Chat::new(Some("be brief"));
    let first = chat.send(&mut model, "the cat", &options, |_| {}).unwrap();
    assert_eq!(first.usage.prefix_reused, 0);
    let second = chat
        .send(&mut model, "and the dog", &options, |_| {})
        .unwrap();
    // At least the first turn's prompt is shared with the second (the random fixture's reply
    // may tokenize differently once rendered as text, so that part can differ).
    assert!(
        second.usage.prefix_reused >= first.usage.prompt_tokens,
        "reused {} of {} (first prompt {})",
        second.usage.prefix_reused,
        second.usage.prompt_tokens,
        first.usage.prompt_tokens
    );
    // Byte-identical to prefilling the whole conversation from an empty cache.
    model.reset();
    let prompt = {
        let mut replay = Chat::new(Some("be brief"));
        replay
            .send(&mut model, "the cat", &options, |_| {})
            .unwrap();
        model.reset();
        replay
            .send(&mut model, "and the dog", &options, |_| {})
            .unwrap()
    };
    assert_eq!(prompt.usage.prefix_reused, 0);
    assert_eq!(prompt.tokens, second.tokens);
}

#[test]
fn a_diverging_prompt_keeps_the_shared_prefix() {
    let (_dir, mut model) = fixture_model(Some(128));
    let a = model
        .encode(&Prompt::Text("the cat and the dog".into()))
        .unwrap();
    let b = model
        .encode(&Prompt::Text("the cat and a bird".into()))
        .unwrap();
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert!(shared > 0 && shared < b.len());
    model
        .generate(&Prompt::Tokens(a), &greedy(4), |_| {})
        .unwrap();
    let out = model
        .generate(&Prompt::Tokens(b.clone()), &greedy(4), |_| {})
        .unwrap();
    assert_eq!(out.usage.prefix_reused, shared);
    model.reset();
    let fresh = model
        .generate(&Prompt::Tokens(b), &greedy(4), |_| {})
        .unwrap();
    assert_eq!(fresh.tokens, out.tokens);
}

#[test]
fn stop_strings_end_the_text_before_them() {
    let (_dir, mut model) = fixture_model(Some(128));
    let prompt = Prompt::Text("the cat".into());
    let full = model.generate(&prompt, &greedy(24), |_| {}).unwrap();
    // A stop string from the middle of the greedy text: the same run ends just before it.
    let chars: Vec<(usize, char)> = full.text.char_indices().collect();
    assert!(chars.len() > 8, "{:?}", full.text);
    let (at, _) = chars[chars.len() / 2];
    let (end, _) = chars[chars.len() / 2 + 2];
    let stop = full.text[at..end].to_string();
    let first = full.text.find(&stop).unwrap();
    let mut streamed = String::new();
    let options = GenerateOptions {
        stop: vec!["never appears".into(), stop.clone()],
        ..greedy(24)
    };
    let out = model
        .generate(&prompt, &options, |t| streamed.push_str(t))
        .unwrap();
    assert_eq!(out.finish_reason, FinishReason::StopString(1));
    assert_eq!(out.text, full.text[..first], "stop {stop:?}");
    assert_eq!(streamed, out.text);
}

#[test]
fn cancelling_stops_at_the_next_token() {
    let (_dir, mut model) = fixture_model(Some(128));
    let cancel = Cancel::new();
    let options = GenerateOptions {
        cancel: Some(cancel.clone()),
        ..greedy(50)
    };
    let mut pieces = 0;
    let out = model
        .generate(&Prompt::Text("the cat".into()), &options, |_| {
            pieces += 1;
            if pieces == 3 {
                cancel.cancel();
            }
        })
        .unwrap();
    assert_eq!(out.finish_reason, FinishReason::Cancelled);
    assert_eq!(out.tokens.len(), 3);
}

#[test]
fn the_iterator_yields_the_same_tokens_as_the_callback() {
    let (_dir, mut model) = fixture_model(Some(128));
    let prompt = Prompt::Text("the dog".into());
    let called = model.generate(&prompt, &greedy(10), |_| {}).unwrap();
    let mut stream = model.stream(&prompt, &greedy(10)).unwrap();
    let ids: Vec<u32> = (&mut stream).map(|t| t.unwrap().id).collect();
    let out = stream.finish();
    assert_eq!(ids, called.tokens);
    assert_eq!(out.tokens, called.tokens);
    assert_eq!(out.usage.completion_tokens, 10);
    assert!(out.timings.ttft > std::time::Duration::ZERO);
    assert_eq!(out.timings.inter_token.len(), 9);
    // Dropping a stream early: cancelled, and the next prompt still reuses its KV.
    let mut stream = model.stream(&prompt, &greedy(10)).unwrap();
    stream.next().unwrap().unwrap();
    let early = stream.finish();
    assert_eq!(early.finish_reason, FinishReason::Cancelled);
    assert_eq!(early.tokens, called.tokens[..1]);
}

#[test]
fn seeded_sampling_repeats_and_seeds_differ() {
    let (_dir, mut model) = fixture_model(Some(128));
    let prompt = Prompt::Text("the cat".into());
    let sample = |seed| GenerateOptions {
        sampling: SamplingParams {
            temperature: 1.5,
            seed,
            ..SamplingParams::default()
        },
        ..greedy(32)
    };
    let a = model.generate(&prompt, &sample(7), |_| {}).unwrap();
    let b = model.generate(&prompt, &sample(7), |_| {}).unwrap();
    let c = model.generate(&prompt, &sample(8), |_| {}).unwrap();
    assert_eq!(a.tokens, b.tokens);
    assert_ne!(a.tokens, c.tokens);
}

#[test]
fn a_prompt_over_the_context_names_both_numbers() {
    let (_dir, mut model) = fixture_model(Some(16));
    let ids: Vec<u32> = (0..20).map(|i| 3 + i % 5).collect();
    let e = model
        .generate(&Prompt::Tokens(ids), &greedy(4), |_| {})
        .expect_err("20 tokens do not fit 16 positions");
    let text = e.to_string();
    assert!(text.contains("20 tokens") && text.contains("16"), "{text}");
}

#[test]
fn package_generation_defaults_fill_the_options() {
    let dir = tempfile::tempdir().unwrap();
    write_package(dir.path(), &FixtureConfig::default()).unwrap();
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"do_sample": true, "temperature": 0.6, "top_p": 0.9, "max_new_tokens": 77}"#,
    )
    .unwrap();
    // genai_config.json's search section (greedy, top_k 1) is what onnxruntime-genai uses:
    // it wins over generation_config.json.
    let model = Model::open(dir.path(), &ModelOptions::default()).unwrap();
    assert!(model.default_options().sampling.greedy);
    // Its top_k of 1 spells greedy out; a request that turns sampling on must not inherit it.
    assert_eq!(model.default_options().sampling.top_k, 0);
    let genai = dir.path().join("genai_config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&genai).unwrap()).unwrap();
    config.as_object_mut().unwrap().remove("search");
    std::fs::write(&genai, config.to_string()).unwrap();
    let model = Model::open(dir.path(), &ModelOptions::default()).unwrap();
    let o = model.default_options();
    assert_eq!(o.max_new_tokens, 77);
    assert!(!o.sampling.greedy);
    assert_eq!(o.sampling.temperature, 0.6);
    assert_eq!(o.sampling.top_p, 0.9);
    // Hugging Face's GenerationConfig defaults top_k to 50 when sampling.
    assert_eq!(o.sampling.top_k, 50);
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"do_sample": true, "top_p": 0}"#,
    )
    .unwrap();
    let e = Model::open(dir.path(), &ModelOptions::default())
        .err()
        .expect("top_p 0 is invalid");
    assert!(e.to_string().contains("top_p"), "{e}");
}

/// `Model::logits` scores every position: each row's argmax is the greedy next id, so the
/// rows of a prompt and its greedy continuation predict that continuation.
#[test]
fn logits_rows_predict_the_greedy_continuation() {
    let dir = tempfile::tempdir().unwrap();
    write_package(dir.path(), &FixtureConfig::default()).unwrap();
    let options = ModelOptions {
        threads: 1,
        ..ModelOptions::default()
    };
    let mut model = Model::open(dir.path(), &options).unwrap();
    let prompt = model.encode(&Prompt::Text("the cat and".into())).unwrap();
    let greedy = GenerateOptions {
        max_new_tokens: 6,
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    let out = model
        .generate(&Prompt::Tokens(prompt.clone()), &greedy, |_| {})
        .unwrap();
    let all: Vec<u32> = prompt.iter().chain(&out.tokens).copied().collect();
    let (rows, vocab) = model.logits(&all).unwrap();
    assert_eq!(rows.len(), all.len() * vocab);
    let argmax = |r: &[f32]| {
        (0..r.len())
            .max_by(|&a, &b| r[a].total_cmp(&r[b]).then(b.cmp(&a)))
            .unwrap() as u32
    };
    let predicted: Vec<u32> = (prompt.len() - 1..all.len() - 1)
        .map(|p| argmax(&rows[p * vocab..(p + 1) * vocab]))
        .collect();
    assert_eq!(predicted, out.tokens);
    assert!(model.logits(&[]).is_err());
    // Generation goes on after scoring.
    assert_eq!(
        model
            .generate(&Prompt::Tokens(prompt), &greedy, |_| {})
            .unwrap()
            .tokens,
        out.tokens
    );
}
