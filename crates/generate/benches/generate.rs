//! The per-token work around the model: choosing a token from a vocabulary-sized row, the
//! logits processors, and tokenization.
//!
//! - `sampling/{greedy,top_k,top_p,min_p}/vocab=49152`: one [`Sampler::sample`] call (copy of
//!   the row, sanitizing, the chain, the selection) with only that option on (`top_k` 50,
//!   `top_p` 0.9 alone, so a sort of the whole row, `min_p` 0.05; temperature 1 otherwise);
//!   `top_p_after_top_k` is `top_k` 50 then `top_p` 0.9 (top-p sorts the 50 survivors).
//!   Top-k is a partial selection, not a sort. Throughput in bytes of the row.
//! - `logit_processing/seven_processor_chain_per_step`: [`Sampler::process`] with all seven
//!   processors on (logit bias, repetition, frequency and presence penalties over 256 seen
//!   ids, temperature, top-k, top-p, min-p) on a fresh copy of the row.
//! - `tokenization/{encode,decode}` on the default model's tokenizer (SmolLM2, 49152 ids) over
//!   an English text; `decode_stream` pushes the ids one at a time through the streaming
//!   [`Detokenizer`], as generation does. Throughput in bytes of text.
//!
//! - `grammar/mask/{json_schema,regex,lark}/vocab={49152,150000}`: one step of a grammar
//!   constraint, per token of a valid document: the mask for the next token computed and
//!   applied to a logits row, then the token committed. The JSON schema has nested objects
//!   and arrays; 49152 is the default model's tokenizer, 150000 a synthetic byte-level
//!   vocabulary of that size (random words), as large models have. Throughput in tokens.
//!   `tool_call` is a required call (Hermes form, two tools) and `tool_auto_text` free text
//!   under `tool_choice: auto`, whose text branch excludes the call marker.
//!   `grammar/compile/{json_schema,tools}` compile that schema and the two tools' grammar
//!   (no cache), and `grammar/token_trie/vocab=49152` builds the trie a model builds once.
//!
//! The tokenizer comes from `$OXGEN_DEFAULT_MODEL/tokenizer.json`, else from the default
//! model's folder in the oxgen cache (`oxgen pull` puts it there).
//! `cargo bench -p oxgen-generate --bench generate`

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{
    BatchSize, BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main,
};
use oxgen_generate::{Detokenizer, Sampler, SamplingParams, Tokenizer};

const VOCAB: usize = 49152;

/// A logits row shaped like a language model's: mostly small values, a few hundred tokens
/// well above the rest (deterministic: a 64-bit LCG).
fn logits(seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..VOCAB)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            let bump = if (s >> 20).is_multiple_of(200) {
                8.0
            } else {
                0.0
            };
            u * 6.0 - 3.0 + bump
        })
        .collect()
}

fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(600));
    g
}

/// A sampler with `params`, 256 ids of history (a prompt and some generated tokens).
fn sampler(params: SamplingParams) -> Sampler {
    let mut s = Sampler::new(params).expect("valid parameters");
    let prompt: Vec<u32> = (0..192u32).map(|i| i * 257 % VOCAB as u32).collect();
    s.reset(&prompt);
    for i in 0..64u32 {
        s.accept(i * 911 % VOCAB as u32);
    }
    s
}

fn sampling(c: &mut Criterion) {
    let row = logits(1);
    let mut g = group(c, "sampling");
    g.throughput(Throughput::Bytes((VOCAB * 4) as u64));
    let base = SamplingParams::default;
    let cases = [
        (
            "greedy",
            SamplingParams {
                greedy: true,
                ..base()
            },
        ),
        (
            "top_k",
            SamplingParams {
                top_k: 50,
                ..base()
            },
        ),
        (
            "top_p",
            SamplingParams {
                top_p: 0.9,
                ..base()
            },
        ),
        (
            "top_p_after_top_k",
            SamplingParams {
                top_k: 50,
                top_p: 0.9,
                ..base()
            },
        ),
        (
            "min_p",
            SamplingParams {
                min_p: 0.05,
                ..base()
            },
        ),
    ];
    for (name, params) in cases {
        let mut s = sampler(params);
        g.bench_function(format!("{name}/vocab={VOCAB}"), |b| {
            b.iter(|| s.sample(black_box(&row), &[]))
        });
    }
    g.finish();

    let mut g = group(c, "logit_processing");
    g.throughput(Throughput::Bytes((VOCAB * 4) as u64));
    let mut s = sampler(SamplingParams {
        temperature: 0.8,
        top_k: 50,
        top_p: 0.9,
        min_p: 0.05,
        repetition_penalty: 1.1,
        frequency_penalty: 0.5,
        presence_penalty: 0.3,
        logit_bias: vec![(17, 2.0), (4242, -1.5), (30000, f32::NEG_INFINITY)],
        ..base()
    });
    g.bench_function("seven_processor_chain_per_step", |b| {
        b.iter_batched_ref(|| row.clone(), |r| s.process(r), BatchSize::SmallInput)
    });
}

fn tokenizer_path() -> PathBuf {
    let dir = std::env::var_os("OXGEN_DEFAULT_MODEL")
        .map(PathBuf::from)
        .or_else(|| {
            let cache = std::env::var_os("OXGEN_CACHE")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("oxgen"))
                })
                .or_else(|| {
                    std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".cache/oxgen"))
                })?;
            Some(cache.join("models/SmolLM2-135M-Instruct"))
        })
        .unwrap_or_default();
    let path = dir.join("tokenizer.json");
    assert!(
        path.is_file(),
        "{} not found: the tokenization benches need the default model's tokenizer. Run \
         `oxgen pull` (or set OXGEN_DEFAULT_MODEL to an imported package folder)",
        path.display()
    );
    path
}

const TEXT: &str = "The sky looks blue because sunlight is scattered by the molecules of the \
air. Light of shorter wavelengths, toward the blue end of the spectrum, is scattered far more \
than red light: Rayleigh scattering grows as the inverse fourth power of the wavelength. When \
the sun is low, its light crosses much more air, the blue is scattered away before it reaches \
us, and sunsets turn orange and red. In 1871 Lord Rayleigh published the theory; later work \
by Einstein and Smoluchowski tied it to fluctuations in the density of the gas. ";

fn tokenization(c: &mut Criterion) {
    let tok = Tokenizer::from_file(&tokenizer_path()).expect("a valid tokenizer.json");
    let text = TEXT.repeat(8);
    let ids = tok.encode(&text, false).expect("encodes");
    let mut g = group(c, "tokenization");
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function(format!("encode/bytes={}", text.len()), |b| {
        b.iter(|| tok.encode(black_box(&text), false).expect("encodes"))
    });
    g.bench_function(format!("decode/tokens={}", ids.len()), |b| {
        b.iter(|| tok.decode(black_box(&ids), false).expect("decodes"))
    });
    g.bench_function(format!("decode_stream/tokens={}", ids.len()), |b| {
        b.iter(|| {
            let mut d = Detokenizer::new(false);
            let mut n = 0;
            for &id in &ids {
                n += d.push(&tok, id).expect("decodes").len();
            }
            n
        })
    });
}

/// A byte-level BPE `tokenizer.json` of `vocab` ids: the 256 byte tokens, then random words
/// (a leading space half the time, 2-10 letters), as a large model's vocabulary looks to a
/// trie.
fn synthetic_tokenizer(vocab: usize) -> Tokenizer {
    let chars: Vec<char> = (0..=u8::MAX).map(oxgen_generate::byte_level_char).collect();
    let mut words = serde_json::Map::new();
    for (b, c) in chars.iter().enumerate() {
        words.insert(c.to_string(), b.into());
    }
    let mut s = 42u64;
    let mut next = || {
        s = s
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        s >> 33
    };
    while words.len() < vocab {
        let mut w = String::new();
        if next() % 2 == 0 {
            w.push(chars[b' ' as usize]);
        }
        for _ in 0..2 + next() % 9 {
            w.push((b'a' + (next() % 26) as u8) as char);
        }
        let id = words.len();
        words.entry(w).or_insert(id.into());
    }
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": words, "merges": []}
    });
    let dir = std::env::temp_dir().join(format!("oxgen-bench-tokenizer-{vocab}"));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, json.to_string()).expect("writes the tokenizer");
    Tokenizer::from_file(&path).expect("a valid tokenizer.json")
}

fn person_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "address": {"type": "object", "properties": {
                "street": {"type": "string"}, "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"}
            }, "required": ["street", "city", "zip"], "additionalProperties": false},
            "pets": {"type": "array", "maxItems": 5, "items": {"type": "object", "properties": {
                "kind": {"enum": ["cat", "dog", "fish"]}, "name": {"type": "string"}
            }, "required": ["kind", "name"], "additionalProperties": false}}
        },
        "required": ["name", "age", "address", "pets"],
        "additionalProperties": false
    })
}

fn grammar(c: &mut Criterion) {
    use oxgen_generate::{
        Constraint, Grammars, LogitsProcessor, Tool, ToolChoice, ToolFormat, ToolSet, tool_grammar,
    };
    use std::sync::Arc;

    let document = r#"{"name": "Ada Lovelace", "age": 36, "address": {"street": "12 St James's Square", "city": "London", "zip": "10001"}, "pets": [{"kind": "cat", "name": "Puff"}, {"kind": "dog", "name": "Rex"}]}"#;
    let cases = [
        (
            "json_schema",
            Constraint::JsonSchema(person_schema()),
            document.to_string(),
        ),
        (
            "regex",
            Constraint::Regex(
                r"[A-Z][a-z]+ [A-Z][a-z]+, [0-9]{1,3} years, \+[0-9]{2} [0-9]{3} [0-9]{4}".into(),
            ),
            "Ada Lovelace, 36 years, +44 207 9460".into(),
        ),
        (
            "lark",
            Constraint::Lark(
                r#"start: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: NUMBER | "(" expr ")"
NUMBER: /[0-9]+/"#
                    .into(),
            ),
            "(12+7)*(3-1)/4+100*(2+(3*4))".into(),
        ),
    ];
    let default =
        Arc::new(Tokenizer::from_file(&tokenizer_path()).expect("a valid tokenizer.json"));
    let tools = |choice| ToolSet {
        tools: vec![
            Tool {
                name: "get_weather".into(),
                description: None,
                parameters: serde_json::json!({"type": "object", "properties": {
                    "city": {"type": "string", "maxLength": 40},
                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                    "required": ["city", "unit"], "additionalProperties": false}),
            },
            Tool {
                name: "find_person".into(),
                description: None,
                parameters: person_schema(),
            },
        ],
        choice,
        parallel: true,
        format: ToolFormat::Hermes,
    };
    let required = tool_grammar(&tools(ToolChoice::Required), None, &default).expect("a grammar");
    let auto = tool_grammar(&tools(ToolChoice::Auto), None, &default).expect("a grammar");
    let cases = cases.into_iter().chain([
        (
            "tool_call",
            required,
            format!("<tool_call>\n{{\"name\": \"find_person\", \"arguments\": {document}}}\n</tool_call>"),
        ),
        (
            "tool_auto_text",
            auto,
            "Paris is the capital of France; it lies on the Seine, and its weather is mild.".into(),
        ),
    ]);
    let cases: Vec<_> = cases.collect();
    let mut g = group(c, "grammar");
    g.bench_function(format!("token_trie/vocab={VOCAB}"), |b| {
        b.iter(|| Grammars::new(default.clone(), VOCAB, &[0]).expect("builds"))
    });
    for (vocab, tok) in [
        (VOCAB, default.clone()),
        (150_000, Arc::new(synthetic_tokenizer(150_000))),
    ] {
        let grammars = Grammars::new(tok.clone(), vocab, &[0]).expect("builds");
        let row = vec![0.0f32; vocab];
        for (name, constraint, text) in &cases {
            let grammar = grammars.compile(constraint).expect("compiles");
            let ids = tok.encode(text, false).expect("encodes");
            g.throughput(Throughput::Elements(ids.len() as u64));
            let history = Default::default();
            g.bench_function(format!("mask/{name}/vocab={vocab}"), |b| {
                b.iter_batched_ref(
                    || (grammar.mask(), row.clone()),
                    |(mask, row)| {
                        for &id in &ids {
                            mask.apply(row, &history);
                            mask.accept(id);
                        }
                    },
                    BatchSize::SmallInput,
                )
            });
            // The same document with the sequence's room told before each token: far from
            // the limit (the closing looked for every 16 tokens), and with just the room the
            // rest of the document takes (the closing looked for, and the likeliest tokens
            // checked, at every token: the most closing can cost).
            if vocab != VOCAB {
                continue;
            }
            for (room, slack) in [("far", 4096), ("tight", 2)] {
                g.bench_function(format!("closing_{room}/{name}/vocab={vocab}"), |b| {
                    b.iter_batched_ref(
                        || (grammar.mask(), row.clone()),
                        |(mask, row)| {
                            for (i, &id) in ids.iter().enumerate() {
                                mask.room(ids.len() - i + slack);
                                row[id as usize] = 1.0;
                                mask.apply(row, &history);
                                row.fill(0.0);
                                mask.accept(id);
                            }
                        },
                        BatchSize::SmallInput,
                    )
                });
            }
        }
    }
    g.throughput(Throughput::Elements(1));
    let grammars = Grammars::new(default.clone(), VOCAB, &[0]).expect("builds");
    let mut n = 0u64;
    g.bench_function("compile/json_schema", |b| {
        b.iter_batched(
            || {
                // A schema never seen before, so the cache cannot answer.
                n += 1;
                let mut schema = person_schema();
                schema["properties"]["name"]["maxLength"] = (40 + n).into();
                Constraint::JsonSchema(schema)
            },
            |schema| grammars.compile(&schema).expect("compiles"),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("compile/tools", |b| {
        b.iter_batched(
            || {
                n += 1;
                let mut set = tools(ToolChoice::Required);
                set.tools[0].parameters["properties"]["city"]["maxLength"] = (40 + n).into();
                tool_grammar(&set, None, &default).expect("a grammar")
            },
            |grammar| grammars.compile(&grammar).expect("compiles"),
            BatchSize::SmallInput,
        )
    });
}

criterion_group!(benches, sampling, tokenization, grammar);
criterion_main!(benches);
