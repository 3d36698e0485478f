//! Continuous batching on the default model (DESIGN.md §5.1, batch invariance): a request's
//! greedy ids are the same whether it runs alone, in a fused batch with requests of other
//! lengths that join and leave at other steps, with its prompt prefilled in chunks, or on
//! KV blocks taken from the prefix cache. And the amortization the batch exists for: one
//! forward per step reads the weights once, so bytes per step stay flat and bytes per token
//! fall as 1/N.
//!
//! The model comes from `$OXGEN_DEFAULT_MODEL` (set by `scripts/test.sh`); without it these
//! tests fail and say how to get it.

use oxgen::{Constraint, GenerateOptions, KvDtype, Model, ModelOptions, Prompt, Sequence};
use oxgen_testkit::default_model_dir;

fn open(prefix_cache: bool) -> Model {
    open_with(prefix_cache, None)
}

fn open_with(prefix_cache: bool, kv_dtype: Option<KvDtype>) -> Model {
    let options = ModelOptions {
        threads: 2,
        memory: oxgen::MemoryOptions {
            prefix_cache,
            kv_dtype,
            ..Default::default()
        },
        ..ModelOptions::default()
    };
    Model::open(default_model_dir(), &options).expect("opening the default model")
}

const NEW_TOKENS: usize = 20;

fn options() -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: NEW_TOKENS,
        ignore_eos: true,
        ..GenerateOptions::default()
    }
}

/// Prompts of different lengths; the last is long enough to need several chunks.
fn prompts(model: &Model) -> Vec<Vec<u32>> {
    let long = "Summarize the following notes in one sentence. ".repeat(12);
    [
        "Hi!",
        "What is the capital of France? Answer in one word.",
        "Write a haiku about the sea, then explain its imagery line by line.",
        long.as_str(),
    ]
    .iter()
    .map(|p| model.encode(&Prompt::chat(&[("user", p)])).unwrap())
    .collect()
}

/// One request: its prompt and the step at which it joins.
struct Arrival<'a> {
    ids: &'a [u32],
    join: usize,
    /// Its generation options; `None`: [`options`].
    options: Option<&'a GenerateOptions>,
}

/// Runs requests through a scheduler loop like the server's: every step feeds each running
/// sequence its decode token or next prompt chunk in one `advance_batch`; finished ones
/// leave. Returns each request's generated ids and the prompt ids its KV had cached.
fn run(model: &mut Model, arrivals: &[Arrival], chunk: usize) -> Vec<(Vec<u32>, usize)> {
    let mut out: Vec<(Vec<u32>, usize)> = vec![(Vec::new(), 0); arrivals.len()];
    let mut running: Vec<(usize, Sequence)> = Vec::new();
    let mut step = 0;
    while step < 1000 {
        for (i, a) in arrivals.iter().enumerate().filter(|(_, a)| a.join == step) {
            let plain = options();
            let s = model
                .start(a.ids, a.options.unwrap_or(&plain), None)
                .unwrap();
            out[i].1 = s.cached();
            running.push((i, s));
        }
        if running.is_empty() && arrivals.iter().all(|a| a.join < step) {
            break;
        }
        let mut seqs: Vec<&mut Sequence> = running.iter_mut().map(|(_, s)| s).collect();
        let results = model.advance_batch(&mut seqs, chunk);
        let mut finished = Vec::new();
        for ((i, _), r) in running.iter().zip(results) {
            for token in r.unwrap() {
                out[*i].0.push(token.id);
                if token.finish.is_some() {
                    finished.push(*i);
                }
            }
        }
        for i in finished {
            let at = running.iter().position(|(j, _)| *j == i).unwrap();
            let (_, s) = running.remove(at);
            model.end(s);
        }
        step += 1;
    }
    assert!(running.is_empty(), "every request finished");
    out
}

#[test]
fn greedy_ids_do_not_depend_on_batching_chunking_or_the_prefix_cache() {
    invariant_under_batching(None);
}

/// The same within an int8 KV cache: each token's keys and values are quantized with scales
/// of their own, so a prompt chunked or batched stores the same bytes.
#[test]
fn int8_kv_greedy_ids_do_not_depend_on_batching_chunking_or_the_prefix_cache() {
    invariant_under_batching(Some(KvDtype::Int8));
}

fn invariant_under_batching(kv_dtype: Option<KvDtype>) {
    let mut model = open_with(true, kv_dtype);
    assert!(
        model.capabilities().fused_decode,
        "the default model runs a batch as one forward"
    );
    let prompts = prompts(&model);
    assert!(
        prompts[3].len() > 3 * 24,
        "the long prompt spans several chunks"
    );
    // Alone, one at a time, whole prompts.
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            run(
                &mut model,
                &[Arrival {
                    ids: p,
                    join: 0,
                    options: None,
                }],
                usize::MAX,
            )[0]
            .0
            .clone()
        })
        .collect();
    for ids in &alone {
        assert_eq!(ids.len(), NEW_TOKENS);
    }
    let baseline = model.kv_usage().unwrap();
    assert_eq!(baseline.used, 0, "ended sequences hold no blocks");

    // All together from the first step, then staggered joins with chunked prefill (a long
    // prompt prefilled 24 ids per step while the others decode), on a model whose cache
    // still holds the prompts' blocks (so later requests start on cached KV).
    let together: Vec<Arrival> = prompts
        .iter()
        .map(|p| Arrival {
            ids: p,
            join: 0,
            options: None,
        })
        .collect();
    let staggered: Vec<Arrival> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| Arrival {
            ids: p,
            join: [3, 0, 7, 1][i],
            options: None,
        })
        .collect();
    for (what, arrivals, chunk) in [
        ("together, whole prompts", &together, usize::MAX),
        ("staggered, chunks of 24", &staggered, 24),
        ("together, chunks of 5", &together, 5),
    ] {
        let got = run(&mut model, arrivals, chunk);
        for (i, (ids, _)) in got.iter().enumerate() {
            assert_eq!(ids, &alone[i], "prompt {i}, {what}");
        }
    }

    // The prefix cache: a request after one with the same prompt reuses its full blocks.
    let again = run(
        &mut model,
        &[Arrival {
            ids: &prompts[3],
            join: 0,
            options: None,
        }],
        24,
    );
    assert!(
        again[0].1 >= prompts[3].len() / 16 * 16 - 16,
        "{} of {} prompt ids cached",
        again[0].1,
        prompts[3].len()
    );
    assert_eq!(again[0].0, alone[3], "ids on cached KV");
    let usage = model.kv_usage().unwrap();
    assert!(usage.prefix_hits > 0 && usage.cached > 0, "{usage:?}");
    assert_eq!(
        (usage.used, usage.reserved),
        (0, 0),
        "every block came back"
    );

    // A fresh model without a prefix cache gives the same ids batched (nothing cached).
    let mut cold = open_with(false, kv_dtype);
    let got = run(&mut cold, &together, 16);
    for (i, (ids, cached)) in got.iter().enumerate() {
        assert_eq!(*cached, 0);
        assert_eq!(ids, &alone[i], "prompt {i} without a prefix cache");
    }
}

/// Invariance holds for constrained sequences too, mixed with unconstrained ones in a batch:
/// a grammar masks a row by what the sequence generated, never by its neighbours.
#[test]
fn constrained_greedy_ids_do_not_depend_on_batching_or_chunking() {
    let mut model = open(true);
    let prompts = prompts(&model);
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": 30}, "sure": {"type": "boolean"}},
        "required": ["answer", "sure"],
        "additionalProperties": false
    });
    let constrained = GenerateOptions {
        constraint: Some(model.compile(&Constraint::JsonSchema(schema)).unwrap()),
        ..options()
    };
    let which = |i: usize| i.is_multiple_of(2).then_some(&constrained);
    let alone: Vec<Vec<u32>> = (prompts.iter().enumerate())
        .map(|(i, p)| {
            let a = Arrival {
                ids: p,
                join: 0,
                options: which(i),
            };
            run(&mut model, &[a], usize::MAX)[0].0.clone()
        })
        .collect();
    let text = model.tokenizer().decode(&alone[0], true).unwrap();
    assert!(
        text.trim_start().starts_with('{'),
        "constrained output: {text:?}"
    );
    assert_ne!(alone[0].len(), 0);
    let staggered: Vec<Arrival> = (prompts.iter().enumerate())
        .map(|(i, p)| Arrival {
            ids: p,
            join: [2, 0, 5, 1][i],
            options: which(i),
        })
        .collect();
    for chunk in [usize::MAX, 7] {
        let got = run(&mut model, &staggered, chunk);
        for (i, (ids, _)) in got.iter().enumerate() {
            assert_eq!(ids, &alone[i], "prompt {i}, chunks of {chunk}");
        }
    }
}

#[test]
fn a_step_reads_the_weights_once_per_eight_rows_whatever_the_batch() {
    let mut model = open(false);
    let prompt = model
        .encode(&Prompt::chat(&[("user", "Count to ten.")]))
        .unwrap();
    let mut per_step = Vec::new();
    let mut per_token = Vec::new();
    for n in [1usize, 2, 4, 8, 16] {
        let mut seqs: Vec<Sequence> = (0..n)
            .map(|_| model.start(&prompt, &options(), None).unwrap())
            .collect();
        let mut refs: Vec<&mut Sequence> = seqs.iter_mut().collect();
        // Prefill, then measure decode steps only.
        for r in model.advance_batch(&mut refs, usize::MAX) {
            assert_eq!(r.unwrap().len(), 1);
        }
        let before = model.counters();
        let steps = 8;
        for _ in 0..steps {
            for r in model.advance_batch(&mut refs, usize::MAX) {
                assert_eq!(r.unwrap().len(), 1);
            }
        }
        let after = model.counters();
        let (bytes, tokens) = (
            after.weight_bytes - before.weight_bytes,
            after.tokens - before.tokens,
        );
        assert_eq!(after.steps - before.steps, steps);
        assert_eq!(
            after.forwards - before.forwards,
            steps,
            "one forward per step"
        );
        assert_eq!(tokens, steps * n as u64);
        per_step.push(bytes / steps);
        per_token.push(bytes as f64 / tokens as f64);
        for s in seqs {
            model.end(s);
        }
    }
    assert!(
        per_step[0] > 50 << 20,
        "the default model streams its ~60+ MB of matrices"
    );
    // Measured by the kernels: up to eight rows share one pass over the weights; sixteen
    // rows are two row blocks, each streaming every tile (the second mostly from cache).
    assert!(
        per_step[..4].iter().all(|&b| b == per_step[0]),
        "bytes per step at batch 1, 2, 4, 8: {per_step:?}"
    );
    assert_eq!(per_step[4], 2 * per_step[0], "batch 16: two passes");
    for (i, n) in [1.0, 2.0, 4.0, 8.0].iter().enumerate() {
        let want = per_token[0] / n;
        assert!(
            (per_token[i] - want).abs() < 1e-6 * want,
            "bytes per token at batch {n}: {} vs {want}",
            per_token[i]
        );
    }
}
