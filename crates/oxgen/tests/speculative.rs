//! Speculative decoding keeps the output: greedy ids and text are the plain decoder's byte for
//! byte with every proposer (prompt lookup, a draft package, the model's own first layers),
//! at 1 and 2 threads, alone and inside a continuous batch, under a grammar, and seeded
//! sampling draws the same ids as the plain sampler. It also does what it is for: on text
//! that copies the prompt, proposals land and each forward yields several ids.
//!
//! The default model comes from `$OXGEN_DEFAULT_MODEL` (set by `scripts/test.sh`); the
//! sampling-distribution test runs on a small fixture package.

use oxgen::{
    Constraint, GenerateOptions, Model, ModelOptions, Output, Prompt, PromptLookup, Sequence,
    Speculative,
};
use oxgen_testkit::default_model_dir;
use oxgen_testkit::fixtures::{FixtureConfig, write_package};

fn open(dir: &std::path::Path, threads: usize, speculative: Option<Speculative>) -> Model {
    let options = ModelOptions {
        threads,
        speculative,
        memory: oxgen::MemoryOptions {
            prefix_cache: true,
            ..Default::default()
        },
        ..ModelOptions::default()
    };
    Model::open(dir, &options).expect("opening the model")
}

/// Text the answer copies: the model is asked to repeat a paragraph.
fn copy_prompt() -> Prompt {
    Prompt::chat(&[(
        "user",
        "Repeat the following paragraph exactly, word for word:\n\nThe quick brown fox jumps \
         over the lazy dog. The dog, annoyed, gets up and walks to the river, where it drinks \
         cold water and watches the fish swim upstream against the current.",
    )])
}

fn chat_prompt() -> Prompt {
    Prompt::chat(&[(
        "user",
        "Tell me a short story about a robot who learns to paint.",
    )])
}

fn greedy(max_new_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens,
        ..GenerateOptions::default()
    }
}

fn generate(model: &mut Model, prompt: &Prompt, options: &GenerateOptions) -> Output {
    model.reset();
    model.generate(prompt, options, |_| {}).unwrap()
}

#[test]
fn greedy_output_is_byte_identical_with_every_proposer_and_thread_count() {
    let dir = default_model_dir();
    let layers = 30;
    let modes = [
        Speculative::PromptLookup(PromptLookup::default()),
        Speculative::PromptLookup(PromptLookup { min_n: 1, max_n: 2 }),
        Speculative::SelfDraft { layers: layers / 2 },
        Speculative::Draft(dir.clone()),
    ];
    let options = greedy(48);
    for threads in [1, 2] {
        let mut plain = open(&dir, threads, None);
        let want: Vec<Output> = [copy_prompt(), chat_prompt()]
            .iter()
            .map(|p| generate(&mut plain, p, &options))
            .collect();
        drop(plain);
        for mode in &modes {
            let mut model = open(&dir, threads, Some(mode.clone()));
            for (prompt, want) in [copy_prompt(), chat_prompt()].iter().zip(&want) {
                let got = generate(&mut model, prompt, &options);
                assert_eq!(got.tokens, want.tokens, "{mode} at {threads} threads");
                assert_eq!(got.text, want.text, "{mode} at {threads} threads");
                assert_eq!(got.finish_reason, want.finish_reason);
                let spec = got.usage.speculation;
                assert!(spec.accepted <= spec.proposed);
                assert!(got.usage.steps <= got.tokens.len());
            }
            let (name, stats) = model.speculation().unwrap();
            assert!(stats.proposed > 0, "{mode}: nothing was proposed");
            assert!(!name.is_empty());
        }
    }
}

#[test]
fn prompt_lookup_pays_on_text_that_copies_the_prompt() {
    let dir = default_model_dir();
    let lookup = Speculative::PromptLookup(PromptLookup::default());
    let mut model = open(&dir, 2, Some(lookup));
    let out = generate(&mut model, &copy_prompt(), &greedy(48));
    let spec = out.usage.speculation;
    assert!(
        spec.accept_rate() > 0.5,
        "the copy was proposed and confirmed: {spec:?}"
    );
    // Several ids per forward: far fewer steps than tokens.
    assert!(
        out.usage.steps * 2 < out.tokens.len(),
        "{} steps for {} tokens",
        out.usage.steps,
        out.tokens.len()
    );
    // The model itself counts the forwards: one per step.
    let (_, total) = model.speculation().unwrap();
    assert_eq!(total, spec);
    // A generation may turn it off; the output stays the same.
    let off = GenerateOptions {
        spec_tokens: Some(0),
        ..greedy(48)
    };
    let plain = generate(&mut model, &copy_prompt(), &off);
    assert_eq!(plain.tokens, out.tokens);
    assert_eq!(plain.usage.steps, plain.tokens.len());
    assert_eq!(plain.usage.speculation.proposed, 0);
}

#[test]
fn seeded_sampling_draws_the_same_ids_with_and_without_speculation() {
    let dir = default_model_dir();
    let mut plain = open(&dir, 2, None);
    let lookup = Speculative::PromptLookup(PromptLookup { min_n: 1, max_n: 3 });
    let mut spec = open(&dir, 2, Some(lookup));
    for seed in [1u64, 7, 42] {
        let mut options = greedy(40);
        options.sampling.greedy = false;
        options.sampling.temperature = 0.7;
        options.sampling.top_p = 0.95;
        options.sampling.repetition_penalty = 1.1;
        options.sampling.seed = seed;
        let want = generate(&mut plain, &copy_prompt(), &options);
        let got = generate(&mut spec, &copy_prompt(), &options);
        assert_eq!(got.tokens, want.tokens, "seed {seed}");
        assert_eq!(got.text, want.text, "seed {seed}");
    }
    assert!(spec.speculation().unwrap().1.accepted > 0);
}

#[test]
fn limits_stops_and_grammars_hold_under_speculation() {
    let dir = default_model_dir();
    let mut plain = open(&dir, 2, None);
    let lookup = Speculative::PromptLookup(PromptLookup { min_n: 1, max_n: 3 });
    let mut spec = open(&dir, 2, Some(lookup));
    // max_new_tokens is exact even when a step could confirm more.
    for n in [1, 2, 5, 13] {
        let options = GenerateOptions {
            ignore_eos: true,
            ..greedy(n)
        };
        let want = generate(&mut plain, &copy_prompt(), &options);
        let got = generate(&mut spec, &copy_prompt(), &options);
        assert_eq!(got.tokens.len(), n);
        assert_eq!(got.tokens, want.tokens);
    }
    // A stop string in the middle of a confirmed run ends the text there.
    let stop = GenerateOptions {
        stop: vec!["lazy".into()],
        ..greedy(48)
    };
    let want = generate(&mut plain, &copy_prompt(), &stop);
    let got = generate(&mut spec, &copy_prompt(), &stop);
    assert_eq!(
        (got.text.as_str(), got.finish_reason),
        (want.text.as_str(), want.finish_reason)
    );
    // A grammar: proposals only count where the grammar allows them.
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"animal": {"type": "string"}, "count": {"type": "integer"}},
        "required": ["animal", "count"]
    });
    let grammar = plain
        .compile(&Constraint::JsonSchema(schema.clone()))
        .unwrap();
    let constrained = GenerateOptions {
        constraint: Some(grammar),
        ..greedy(40)
    };
    let want = generate(&mut plain, &copy_prompt(), &constrained);
    let grammar = spec.compile(&Constraint::JsonSchema(schema)).unwrap();
    let constrained = GenerateOptions {
        constraint: Some(grammar),
        ..greedy(40)
    };
    let got = generate(&mut spec, &copy_prompt(), &constrained);
    assert_eq!(got.tokens, want.tokens);
    assert_eq!(got.text, want.text);
    assert!(got.text.starts_with('{'), "{}", got.text);
}

/// Sequences that join at different steps, stepped together as the server does: each one's
/// ids are its ids alone without speculation.
#[test]
fn speculation_inside_a_continuous_batch_keeps_each_sequences_ids() {
    let dir = default_model_dir();
    let mut plain = open(&dir, 2, None);
    let prompts: Vec<Vec<u32>> = [
        copy_prompt(),
        chat_prompt(),
        Prompt::chat(&[("user", "Hi!")]),
    ]
    .iter()
    .map(|p| plain.encode(p).unwrap())
    .collect();
    let options = GenerateOptions {
        ignore_eos: true,
        ..greedy(24)
    };
    let want: Vec<Vec<u32>> = (prompts.iter())
        .map(|ids| generate(&mut plain, &Prompt::Tokens(ids.clone()), &options).tokens)
        .collect();
    let lookup = Speculative::PromptLookup(PromptLookup { min_n: 1, max_n: 3 });
    for mode in [lookup, Speculative::SelfDraft { layers: 10 }] {
        let mut model = open(&dir, 2, Some(mode.clone()));
        let mut got = vec![Vec::new(); prompts.len()];
        let mut running: Vec<(usize, Sequence)> = Vec::new();
        for step in 0..200 {
            if step < prompts.len() {
                running.push((step, model.start(&prompts[step], &options, None).unwrap()));
            }
            if running.is_empty() {
                break;
            }
            let mut seqs: Vec<&mut Sequence> = running.iter_mut().map(|(_, s)| s).collect();
            let results = model.advance_batch(&mut seqs, 16);
            let mut finished = Vec::new();
            for ((i, _), r) in running.iter().zip(results) {
                for token in r.unwrap() {
                    got[*i].push(token.id);
                    if token.finish.is_some() {
                        finished.push(*i);
                    }
                }
            }
            for i in finished {
                let at = running.iter().position(|(j, _)| *j == i).unwrap();
                model.end(running.remove(at).1);
            }
        }
        assert_eq!(got, want, "{mode}");
        assert!(model.speculation().unwrap().1.accepted > 0, "{mode}");
        assert_eq!(model.live_sequences(), 0);
    }
}

#[test]
fn a_draft_must_share_the_tokenizer_and_modes_must_fit_the_model() {
    let target = tempfile::tempdir().unwrap();
    write_package(target.path(), &FixtureConfig::default()).unwrap();
    let other = tempfile::tempdir().unwrap();
    write_package(other.path(), &FixtureConfig::default()).unwrap();
    // Another tokenizer: one token renamed.
    let path = other.path().join("tokenizer.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let vocab = json["model"]["vocab"].as_object_mut().unwrap();
    let (name, id) = vocab
        .iter()
        .find(|(_, id)| id.as_u64() == Some(40))
        .unwrap();
    let (name, id) = (name.clone(), id.clone());
    vocab.remove(&name);
    vocab.insert("zzz-not-there".into(), id);
    std::fs::write(&path, json.to_string()).unwrap();
    let options = ModelOptions {
        speculative: Some(Speculative::Draft(other.path().to_path_buf())),
        ..ModelOptions::default()
    };
    let e = Model::open(target.path(), &options)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("needs the target's tokenizer"), "{e}");
    // The fixture has 2 layers: a self draft keeps 1, not 2.
    for (layers, ok) in [(1, true), (2, false), (3, false)] {
        let options = ModelOptions {
            speculative: Some(Speculative::SelfDraft { layers }),
            ..ModelOptions::default()
        };
        match Model::open(target.path(), &options) {
            Ok(_) => assert!(ok, "self:{layers} opened"),
            Err(e) => {
                assert!(!ok, "self:{layers}: {e}");
                assert!(e.to_string().contains("fewer than the model's 2"), "{e}");
            }
        }
    }
    let options = ModelOptions {
        speculative: Some(Speculative::PromptLookup(PromptLookup::default())),
        spec_tokens: oxgen::MAX_SPEC_TOKENS + 1,
        ..ModelOptions::default()
    };
    let e = Model::open(target.path(), &options)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("--spec-tokens"), "{e}");
}

/// A draft that fails (here: its context is too small for the sequence) costs speed, never
/// the generation: those steps run without proposals and the text is the plain one.
#[test]
fn a_failing_draft_never_fails_the_generation() {
    let target = tempfile::tempdir().unwrap();
    write_package(target.path(), &FixtureConfig::default()).unwrap();
    let draft = tempfile::tempdir().unwrap();
    let small = FixtureConfig {
        context: 16,
        ..FixtureConfig::default()
    };
    write_package(draft.path(), &small).unwrap();
    let options = GenerateOptions {
        ignore_eos: true,
        ..greedy(40)
    };
    let prompt = Prompt::Tokens(vec![40, 41, 42, 40, 41, 42, 40, 41]);
    let mut plain = open(target.path(), 1, None);
    let want = generate(&mut plain, &prompt, &options);
    let mut spec = open(
        target.path(),
        1,
        Some(Speculative::Draft(draft.path().into())),
    );
    let got = generate(&mut spec, &prompt, &options);
    assert_eq!(got.tokens, want.tokens);
    let (_, stats) = spec.speculation().unwrap();
    assert!(stats.proposer_errors > 0, "{stats:?}");
}

/// The sampling distribution is the target's: over many seeds, the pairs of ids drawn (the
/// second at a position verified against a proposal) follow the model's own probabilities
/// (chi-square against p(a) · p(b | a) from its logits), and every seed draws what the plain
/// sampler draws.
#[test]
fn sampled_ids_at_verified_positions_follow_the_models_distribution() {
    let dir = tempfile::tempdir().unwrap();
    write_package(dir.path(), &FixtureConfig::default()).unwrap();
    let mut plain = open(dir.path(), 1, None);
    // A draft proposes at every step: the model itself, greedily, so its proposal is the
    // most likely id, accepted only as often as the sampler draws it.
    let mut spec = open(dir.path(), 1, Some(Speculative::Draft(dir.path().into())));
    let prompt: Vec<u32> = [40u32, 41, 42, 40, 41, 42, 40, 41].to_vec();
    // Three ids, so the second step has room to propose one.
    let mut options = GenerateOptions {
        max_new_tokens: 3,
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    options.sampling.greedy = false;
    // Peaked enough that a few hundred pairs hold most of the mass.
    const T: f32 = 0.25;
    options.sampling.temperature = T;
    let seeds = 2000u64;
    let mut counts: std::collections::BTreeMap<(u32, u32), u64> = Default::default();
    for seed in 0..seeds {
        options.sampling.seed = seed;
        let got = generate(&mut spec, &Prompt::Tokens(prompt.clone()), &options);
        let want = generate(&mut plain, &Prompt::Tokens(prompt.clone()), &options);
        assert_eq!(got.tokens, want.tokens, "seed {seed}");
        *counts.entry((got.tokens[0], got.tokens[1])).or_default() += 1;
    }
    let stats = spec.speculation().unwrap().1;
    assert_eq!(stats.proposed, seeds, "{stats:?}");
    assert!(stats.accepted > 0 && stats.accepted < seeds, "{stats:?}");
    let softmax = |row: &[f32]| {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f64> = row
            .iter()
            .map(|&x| (f64::from(x - max) / f64::from(T)).exp())
            .collect();
        let z: f64 = e.iter().sum();
        e.into_iter().map(|x| x / z).collect::<Vec<f64>>()
    };
    let (logits, vocab) = plain.logits(&prompt).unwrap();
    let p_first = softmax(&logits[(prompt.len() - 1) * vocab..]);
    // Expected counts of every pair whose first id was drawn; the rest pooled (cells
    // expected under 5 times, and the pairs of first ids never drawn).
    let (mut chi2, mut cells, mut rest_obs, mut rest_exp) = (0.0, 0usize, 0.0, seeds as f64);
    let firsts: std::collections::BTreeSet<u32> = counts.keys().map(|k| k.0).collect();
    for a in firsts {
        let mut ids = prompt.clone();
        ids.push(a);
        let (logits, _) = plain.logits(&ids).unwrap();
        let p_second = softmax(&logits[prompt.len() * vocab..]);
        for (b, p) in p_second.iter().enumerate() {
            let exp = seeds as f64 * p_first[a as usize] * p;
            let obs = counts.get(&(a, b as u32)).copied().unwrap_or(0) as f64;
            if exp < 5.0 {
                rest_obs += obs;
                continue;
            }
            rest_exp -= exp;
            chi2 += (obs - exp).powi(2) / exp;
            cells += 1;
        }
    }
    assert!(cells >= 10, "only {cells} cells expected 5 or more draws");
    chi2 += (rest_obs - rest_exp).powi(2) / rest_exp.max(1e-9);
    // Above the 99.9th percentile of chi-square with k degrees of freedom (about
    // k + 3.1·√(2k) + 5 for k in the tens to hundreds).
    let dof = cells as f64;
    let bound = dof + 3.1 * (2.0 * dof).sqrt() + 5.0;
    assert!(
        chi2 < bound,
        "chi2 {chi2:.1} over {cells} cells (bound {bound:.1})"
    );
}
