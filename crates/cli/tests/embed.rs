//! Encoders: packages imported from Hugging Face folders run on both backends with the same
//! results; an embedding does not depend on its batch or the thread count; inputs are
//! refused with their index; the real all-MiniLM-L6-v2 gives sentence-transformers'
//! embeddings (recorded once, `crates/testkit/thirdparty/embeddings/make_reference.py`); an
//! imported ModernBERT pools transformers' states and its cross-encoder reranks by its logit;
//! and a decoder package embeds from its final hidden states as ONNX Runtime computes them.

#[allow(dead_code)] // run_python is for the other binaries that share it
mod support;

use std::path::Path;
use std::process::Command;

use oxgen::embed::InputError;
use oxgen::{Backend, EmbedInput, EmbedOptions, EmbedTokens, Embedder, EncoderKind, Pooling};
use oxgen_import::EncoderArch;
use oxgen_testkit::encoders::{EncoderFixture, write_package};

fn open(dir: &Path, backend: Backend, threads: usize) -> Embedder {
    let options = EmbedOptions {
        threads,
        backend,
        ..EmbedOptions::default()
    };
    Embedder::open(dir, &options)
        .unwrap_or_else(|e| panic!("{} on {backend:?}: {e}", dir.display()))
}

fn texts() -> Vec<String> {
    [
        "The quick brown fox jumps over the lazy dog.",
        "a man eats food",
        "How many people live in Berlin?",
        "Paris is the capital of France, and Berlin the capital of Germany.",
        "cats",
        "the dog plays music in the city of paris and the horse jumps over the brown cat",
    ]
    .map(String::from)
    .to_vec()
}

fn inputs() -> Vec<EmbedInput> {
    texts().into_iter().map(EmbedInput::Text).collect()
}

fn largest_difference(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    (a.iter().flatten().zip(b.iter().flatten()))
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn fixture(f: EncoderFixture) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_package(dir.path(), &dir.path().join("pkg"), &f);
    dir
}

#[test]
fn imported_encoders_give_onnxruntimes_results_on_the_native_backend() {
    let cases = [
        (EncoderArch::Bert, None, "mean"),
        (EncoderArch::Bert, None, "cls"),
        (EncoderArch::Roberta, None, "max"),
        (EncoderArch::Bert, Some(1), "mean"),
        (EncoderArch::Bert, Some(2), "mean"),
        (EncoderArch::Roberta, Some(1), "mean"),
    ];
    for (arch, labels, pooling) in cases {
        let what = format!("{arch:?} labels {labels:?} pooling {pooling}");
        let dir = fixture(EncoderFixture {
            arch,
            labels,
            pooling,
            ..EncoderFixture::default()
        });
        let pkg = dir.path().join("pkg");
        let mut native = open(&pkg, Backend::Native, 2);
        let mut ort = open(&pkg, Backend::Ort, 2);
        assert_eq!((native.backend(), ort.backend()), ("native", "ort"));
        match labels {
            None => {
                assert_eq!(
                    native.kind(),
                    EncoderKind::Embedding {
                        pooling: Pooling::parse(pooling).unwrap(),
                        normalize: true
                    },
                    "{what}"
                );
                let a = native.embed(&inputs(), false).unwrap();
                let b = ort.embed(&inputs(), false).unwrap();
                assert_eq!(a[0].len(), 64);
                let d = largest_difference(&a, &b);
                assert!(d < 1e-5, "{what}: native and ort differ by {d}");
                // Unit length, and not all the same vector.
                assert!(
                    a.iter()
                        .all(|v| (v.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-5)
                );
                assert_ne!(a[0], a[1]);
            }
            Some(n) => {
                assert_eq!(native.kind(), EncoderKind::Reranker { labels: n }, "{what}");
                let query = "How many people live in Berlin?";
                let a = native.rerank(query, &texts(), false).unwrap();
                let b = ort.rerank(query, &texts(), false).unwrap();
                let d = largest_difference(std::slice::from_ref(&a), &[b]);
                assert!(d < 1e-5, "{what}: native and ort scores differ by {d}");
                assert!(a.iter().all(|s| (0.0..=1.0).contains(s)), "{what}: {a:?}");
                let spread =
                    a.iter().cloned().fold(0f32, f32::max) - a.iter().cloned().fold(1f32, f32::min);
                assert!(
                    spread > 1e-3,
                    "{what}: the documents all score alike: {a:?}"
                );
                // A cross-encoder embeds nothing.
                assert!(native.embed(&inputs(), false).is_err());
            }
        }
    }
}

#[test]
fn an_embedding_does_not_depend_on_its_batch_or_the_thread_count() {
    let dir = fixture(EncoderFixture::default());
    let pkg = dir.path().join("pkg");
    let batched = open(&pkg, Backend::Native, 2)
        .embed(&inputs(), false)
        .unwrap();
    for threads in [1, 2, 3] {
        let mut model = open(&pkg, Backend::Native, threads);
        for (input, want) in inputs().iter().zip(&batched) {
            let alone = model.embed(std::slice::from_ref(input), false).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&alone[0]), bits(want), "{threads} threads: {input:?}");
        }
    }
}

#[test]
fn inputs_are_refused_with_their_index_or_cut_when_asked() {
    let dir = fixture(EncoderFixture::default());
    let mut model = open(&dir.path().join("pkg"), Backend::Native, 2);
    let tokenizer = model.tokenizer().clone();
    let max = tokenizer.max_tokens();
    assert_eq!(max, 39, "sentence_bert_config.json's max_seq_length");
    let long = "the quick brown fox ".repeat(20);
    let refused = |input: EmbedInput| tokenizer.input(3, &input, false).unwrap_err();
    assert!(matches!(
        refused(EmbedInput::Text(long.clone())),
        InputError::TooLong {
            index: 3,
            max: 39,
            ..
        }
    ));
    assert!(matches!(
        refused(EmbedInput::Ids(vec![])),
        InputError::Empty { index: 3 }
    ));
    assert!(matches!(
        refused(EmbedInput::Ids(vec![2, 100_000])),
        InputError::BadId {
            index: 3,
            id: 100_000,
            ..
        }
    ));
    // Truncated: the model's length, ending with [SEP] as transformers' truncation does.
    let cut = tokenizer
        .input(0, &EmbedInput::Text(long.clone()), true)
        .unwrap();
    assert_eq!(cut.ids.len(), max);
    assert_eq!((cut.ids[0], *cut.ids.last().unwrap()), (2, 3));
    let e = model.embed(
        &[EmbedInput::Text("cat".into()), EmbedInput::Text(long)],
        false,
    );
    assert!(
        e.unwrap_err().to_string().contains("input 1 has"),
        "the index is named"
    );
    // Token ids run as given: the same vector as the text they spell.
    let ids = tokenizer
        .input(0, &EmbedInput::Text("a man eats food".into()), false)
        .unwrap()
        .ids;
    let by_ids = model.embed(&[EmbedInput::Ids(ids)], false).unwrap();
    let by_text = model
        .embed(&[EmbedInput::Text("a man eats food".into())], false)
        .unwrap();
    assert_eq!(by_ids, by_text);
}

#[test]
fn oxgen_embed_prints_json_lines_from_arguments_or_stdin() {
    let dir = fixture(EncoderFixture::default());
    let pkg = dir.path().join("pkg");
    let run = |args: &[&str], stdin: Option<&str>| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_oxgen"))
            .arg("embed")
            .arg(&pkg)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
        drop(input);
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .collect::<Vec<_>>()
    };
    let from_args = run(&["a man eats food", "cats"], None);
    let from_stdin = run(&[], Some("a man eats food\ncats\n"));
    assert_eq!(from_args, from_stdin);
    assert_eq!(from_args.len(), 2);
    let want = open(&pkg, Backend::Native, 0)
        .embed(&[EmbedInput::Text("a man eats food".into())], false)
        .unwrap();
    let got: Vec<f32> = serde_json::from_value(from_args[0]["embedding"].clone()).unwrap();
    assert_eq!(
        got, want[0],
        "the printed values are the f32s, shortest round-trip"
    );
    let ranked = run(
        &["--rerank", "berlin people", "people live in berlin", "cats"],
        None,
    );
    let score = |i: usize| ranked[i]["relevance_score"].as_f64().unwrap();
    assert_eq!(ranked.len(), 2);
    assert!((-1.0..=1.0).contains(&score(0)) && score(0) != score(1));
    // --profile: the same lines on stdout, the rate and the time per op type on stderr.
    let out = Command::new(env!("CARGO_BIN_EXE_oxgen"))
        .args(["embed", "--profile", "--backend", "native"])
        .arg(&pkg)
        .args(["a man eats food", "cats"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines, from_args);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("2 sequences in") && stderr.contains("native backend"),
        "{stderr}"
    );
    let matmul = stderr
        .lines()
        .find(|l| l.starts_with("MatMul "))
        .unwrap_or_else(|| panic!("no MatMul row in the op table:\n{stderr}"));
    let calls: usize = matmul.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(calls >= 2, "each sequence runs the products: {matmul}");
}

/// sentence-transformers' embeddings of 100 sentences of 12 to 256 tokens, recorded once.
struct Reference {
    sentences: Vec<String>,
    embeddings: Vec<Vec<f32>>,
}

fn reference() -> Reference {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testkit/thirdparty/embeddings/minilm_reference.json");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let dim = json["dim"].as_u64().unwrap() as usize;
    let bytes = oxgen_testkit::base64_decode(json["embeddings_f32_base64"].as_str().unwrap());
    let values: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    Reference {
        sentences: serde_json::from_value(json["sentences"].clone()).unwrap(),
        embeddings: values.chunks(dim).map(<[f32]>::to_vec).collect(),
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

#[test]
fn all_minilm_l6_v2_gives_sentence_transformers_embeddings_on_both_backends() {
    let reference = reference();
    assert_eq!(reference.sentences.len(), 100);
    let dir = oxgen_testkit::embed_model_dir();
    let inputs: Vec<EmbedInput> = (reference.sentences.iter().cloned())
        .map(EmbedInput::Text)
        .collect();
    for backend in [Backend::Native, Backend::Ort] {
        let mut model = open(&dir, backend, 2);
        assert_eq!(model.dim(), 384);
        assert_eq!(model.tokenizer().max_tokens(), 256);
        let batched = model.embed(&inputs, false).unwrap();
        let mut worst = 1f64;
        for (i, (got, want)) in batched.iter().zip(&reference.embeddings).enumerate() {
            let c = cosine(got, want);
            worst = worst.min(c);
            assert!(c >= 0.9999, "{backend:?}: sentence {i}: cosine {c}");
        }
        // Alone, each of a sample: the same bits as in the batch.
        for i in (0..100).step_by(9) {
            let alone = model.embed(&inputs[i..=i], false).unwrap();
            assert_eq!(alone[0], batched[i], "{backend:?}: sentence {i} alone");
        }
        println!("{backend:?}: worst cosine {worst:.7} over 100 sentences");
    }
}

/// all-MiniLM-L6-v2 with onnxruntime's fused encoder ops (`EmbedLayerNormalization`,
/// `SkipLayerNormalization`, `BiasGelu`, `Attention`) gives sentence-transformers'
/// embeddings on both backends, and natively within 1e-5 of the unfused graph's.
#[test]
fn the_fused_minilm_runs_natively_with_sentence_transformers_embeddings() {
    let dir = oxgen_testkit::fused_embed_model_dir();
    let graph = std::fs::read(dir.join("model.onnx")).unwrap();
    for op in [
        "EmbedLayerNormalization",
        "SkipLayerNormalization",
        "BiasGelu",
        "Attention",
    ] {
        assert!(
            graph.windows(op.len()).any(|w| w == op.as_bytes()),
            "{op} missing from the fused graph"
        );
    }
    let reference = reference();
    let inputs: Vec<EmbedInput> = (reference.sentences.iter().cloned())
        .map(EmbedInput::Text)
        .collect();
    let fused = open(&dir, Backend::Native, 2)
        .embed(&inputs, false)
        .unwrap();
    let ort = open(&dir, Backend::Ort, 2).embed(&inputs, false).unwrap();
    for (backend, embeddings) in [("native", &fused), ("onnxruntime", &ort)] {
        for (i, (got, want)) in embeddings.iter().zip(&reference.embeddings).enumerate() {
            let c = cosine(got, want);
            assert!(c >= 0.9999, "{backend}: sentence {i}: cosine {c}");
        }
    }
    let plain = (open(&oxgen_testkit::embed_model_dir(), Backend::Native, 2))
        .embed(&inputs, false)
        .unwrap();
    let worst = largest_difference(&fused, &plain);
    assert!(worst < 1e-5, "fused and plain graphs differ by {worst}");
    println!("fused: largest difference from the plain graph {worst:e}");
}

/// A real cross-encoder (ms-marco-MiniLM-L-12-v2 as onnxruntime's dynamic int8 export:
/// `DynamicQuantizeLinear`, `MatMulInteger`, `DequantizeLinear`) runs natively with
/// onnxruntime's scores, and ranks the passage that answers first.
#[test]
fn the_int8_ms_marco_cross_encoder_runs_natively_with_onnxruntimes_scores() {
    let dir = oxgen_testkit::rerank_model_dir();
    let query = "How many people live in Berlin?";
    let documents: Vec<String> = [
        "Berlin has a population of 3,520,031 registered inhabitants in an area of 891.82 square kilometers.",
        "New York City is famous for the Metropolitan Museum of Art.",
        "The capital of France is Paris.",
        "Berlin is well known for its museums.",
        "In 2014, the city state Berlin had 37,368 live births (+6.6%), a record number since 1991.",
    ]
    .map(String::from)
    .to_vec();
    let mut native = open(&dir, Backend::Native, 2);
    let mut ort = open(&dir, Backend::Ort, 2);
    assert_eq!(native.backend(), "native");
    assert_eq!(native.kind(), EncoderKind::Reranker { labels: 1 });
    let a = native.rerank(query, &documents, false).unwrap();
    let b = ort.rerank(query, &documents, false).unwrap();
    let d = largest_difference(std::slice::from_ref(&a), std::slice::from_ref(&b));
    println!("native {a:?}\nort    {b:?}\nlargest difference {d:e}");
    // onnxruntime fuses the graph (LayerNorm, and DynamicQuantizeLinear + MatMulInteger +
    // scale into DynamicQuantizeMatMul), so its activations differ in the last bits, and an
    // activation on a rounding boundary quantizes one code apart: measured 1.7e-5 on a CPU
    // with VNNI. Without VNNI its u8 x s8 kernel adds pairs of products in saturating 16-bit
    // lanes (onnxruntime's quantization docs warn of it), so its scores are off: 5.0e-4
    // measured on an AVX2-only AMD EPYC. oxgen's sums are exact integers on every ISA.
    let bound = if cpu_has_vnni() { 1e-4 } else { 2e-3 };
    assert!(d < bound, "native and onnxruntime scores differ by {d}");
    let best = (0..a.len()).max_by(|&i, &j| a[i].total_cmp(&a[j])).unwrap();
    assert_eq!(best, 0, "{a:?}");
    assert!(a[0] > 0.9 && a[1] < 0.01 && a[2] < 0.01, "{a:?}");
}

/// Whether the CPU has an 8-bit dot-product instruction (AVX-512 VNNI or AVX-VNNI).
fn cpu_has_vnni() -> bool {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    (info.lines()).filter(|l| l.starts_with("flags")).any(|l| {
        l.split_whitespace()
            .any(|f| f == "avx512_vnni" || f == "avx_vnni")
    })
}

/// A decoder package (the default model, onnxruntime-genai's int4 export) embeds from its
/// final hidden states, cut from the graph natively: last-token pooled by default and mean
/// pooled when asked, as ONNX Runtime computes them from the same graph with the head's
/// input put out (`decoder_reference.py`). That copy, which puts out `hidden_states` as
/// onnxruntime-genai's builder can, runs on both backends; ONNX Runtime refuses the graph
/// without it, naming what to do.
#[test]
fn a_decoder_package_embeds_from_its_final_hidden_states() {
    let package = oxgen_testkit::default_model_dir();
    let mut native = open(&package, Backend::Native, 2);
    assert_eq!(
        native.kind(),
        EncoderKind::Embedding {
            pooling: Pooling::LastToken,
            normalize: true
        }
    );
    assert_eq!(native.dim(), 576);
    let inputs = inputs();
    let ids: Vec<Vec<u32>> = (inputs.iter().enumerate())
        .map(|(i, input)| native.tokenizer().input(i, input, false).unwrap().ids)
        .collect();
    let work = tempfile::tempdir().unwrap();
    let ids_path = work.path().join("ids.json");
    std::fs::write(&ids_path, serde_json::to_string(&ids).unwrap()).unwrap();
    let copy = work.path().join("with-hidden-states");
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testkit/thirdparty/embeddings/decoder_reference.py");
    let out = support::stdout_of(
        Command::new(support::python())
            .arg(&script)
            .args([&package, &copy, &ids_path]),
    );
    let reference: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let vectors =
        |key: &str| -> Vec<Vec<f32>> { serde_json::from_value(reference[key].clone()).unwrap() };
    let check = |what: &str, got: &[Vec<f32>], want: &[Vec<f32>]| {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let c = cosine(g, w);
            assert!(c >= 0.9999, "{what}: text {i}: cosine {c}");
        }
    };
    check(
        "native, last token",
        &native.embed(&inputs, false).unwrap(),
        &vectors("last"),
    );
    let mean = EmbedOptions {
        threads: 2,
        backend: Backend::Native,
        pooling: Some(Pooling::Mean),
        ..EmbedOptions::default()
    };
    let mut native_mean = Embedder::open(&package, &mean).unwrap();
    check(
        "native, mean",
        &native_mean.embed(&inputs, false).unwrap(),
        &vectors("mean"),
    );
    for backend in [Backend::Native, Backend::Ort] {
        let got = open(&copy, backend, 2).embed(&inputs, false).unwrap();
        check(
            &format!("{backend:?}, hidden_states output"),
            &got,
            &vectors("last"),
        );
    }
    let options = EmbedOptions {
        backend: Backend::Ort,
        ..EmbedOptions::default()
    };
    let refused = Embedder::open(&package, &options)
        .err()
        .unwrap()
        .to_string();
    assert!(
        refused.contains("puts out no hidden_states") && refused.contains("native backend"),
        "{refused}"
    );
    // The CLI embeds from the same package.
    let out = support::stdout_of(
        Command::new(env!("CARGO_BIN_EXE_oxgen"))
            .args(["embed", "--threads", "2"])
            .arg(&package)
            .arg(&texts()[0]),
    );
    let line: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let cli: Vec<f32> = serde_json::from_value(line["embedding"].clone()).unwrap();
    check("oxgen embed", &[cli], &vectors("last")[..1]);
}

/// An imported ModernBERT (the committed tiny checkpoint) embeds as its sentence-transformers
/// modules say: the mean of transformers' token states, normalized.
#[test]
fn an_imported_modernbert_embeds_with_its_package_pooling() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../testkit/thirdparty/embeddings/modernbert");
    let work = tempfile::tempdir().unwrap();
    let package = work.path().join("modernbert");
    oxgen_import::import_encoder(&fixture, &package, &Default::default()).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("reference.json")).unwrap())
            .unwrap();
    let sequences: Vec<Vec<u32>> = serde_json::from_value(json["sequences"].clone()).unwrap();
    let bytes =
        oxgen_testkit::base64_decode(json["last_hidden_state_f32_base64"].as_str().unwrap());
    let values: Vec<f32> = (bytes.chunks_exact(4))
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let inputs: Vec<EmbedInput> = sequences.iter().cloned().map(EmbedInput::Ids).collect();
    for backend in [Backend::Native, Backend::Ort] {
        let mut model = open(&package, backend, 2);
        assert_eq!(
            model.kind(),
            EncoderKind::Embedding {
                pooling: Pooling::Mean,
                normalize: true
            }
        );
        let got = model.embed(&inputs, false).unwrap();
        let mut states = values.iter().copied();
        for (ids, embedding) in sequences.iter().zip(&got) {
            let rows: Vec<f32> = states.by_ref().take(ids.len() * 32).collect();
            let mean: Vec<f32> = (0..32)
                .map(|j| rows.chunks(32).map(|r| r[j]).sum::<f32>() / ids.len() as f32)
                .collect();
            let c = cosine(embedding, &mean);
            assert!(c >= 0.9999, "{backend:?}: {} tokens: cosine {c}", ids.len());
        }
    }
}

/// An imported ModernBERT cross-encoder (the tiny checkpoint with a random head,
/// `make_classifier.py`) is a reranker whose relevance is the sigmoid of transformers' logit.
#[test]
fn an_imported_modernbert_cross_encoder_reranks_by_transformers_logits() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testkit/thirdparty/embeddings/modernbert/classifier");
    let work = tempfile::tempdir().unwrap();
    let package = work.path().join("reranker");
    oxgen_import::import_encoder(&fixture, &package, &Default::default()).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("reference.json")).unwrap())
            .unwrap();
    let sequences: Vec<Vec<u32>> = serde_json::from_value(json["sequences"].clone()).unwrap();
    let logits: Vec<f32> = serde_json::from_value(json["logits_mean"].clone()).unwrap();
    let tokens: Vec<EmbedTokens> = (sequences.iter())
        .map(|ids| EmbedTokens {
            ids: ids.clone(),
            types: vec![0; ids.len()],
        })
        .collect();
    for backend in [Backend::Native, Backend::Ort] {
        let mut model = open(&package, backend, 2);
        assert_eq!(model.kind(), EncoderKind::Reranker { labels: 1 });
        let scores = model.rerank_tokens(&tokens).unwrap();
        for ((score, logit), ids) in scores.iter().zip(&logits).zip(&sequences) {
            let want = 1.0 / (1.0 + (-logit).exp());
            assert!(
                (score - want).abs() < 1e-5,
                "{backend:?}: {} tokens: {score} against {want}",
                ids.len()
            );
        }
    }
}

/// An imported XLM-RoBERTa (a tiny random checkpoint with a Unigram tokenizer and
/// transformers' outputs, `thirdparty/embeddings/xlm-roberta/make_fixture.py`) tokenizes as
/// the `tokenizers` library does, embeds as the mean of transformers' states (E5's pooling)
/// normalized, and its cross-encoder scores (query, document) pairs by the sigmoid of
/// transformers' logit, on both backends.
#[test]
fn an_imported_xlm_roberta_embeds_and_reranks_as_transformers_does() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../testkit/thirdparty/embeddings/xlm-roberta");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("reference.json")).unwrap())
            .unwrap();
    let work = tempfile::tempdir().unwrap();
    let (embedder, reranker) = (work.path().join("embedder"), work.path().join("reranker"));
    for (folder, package) in [("embedder", &embedder), ("reranker", &reranker)] {
        let spec =
            oxgen_import::import_encoder(&fixture.join(folder), package, &Default::default())
                .unwrap()
                .spec;
        assert_eq!(spec.arch, EncoderArch::Roberta, "{folder}");
    }
    let texts = json["texts"].as_array().unwrap();
    let inputs: Vec<EmbedInput> = (texts.iter())
        .map(|t| EmbedInput::Text(t["text"].as_str().unwrap().to_string()))
        .collect();
    let query = json["query"].as_str().unwrap();
    let pairs = json["pairs"].as_array().unwrap();
    let documents: Vec<String> = (pairs.iter())
        .map(|p| p["document"].as_str().unwrap().to_string())
        .collect();
    let ids =
        |v: &serde_json::Value| -> Vec<u32> { serde_json::from_value(v["ids"].clone()).unwrap() };
    for backend in [Backend::Native, Backend::Ort] {
        let mut model = open(&embedder, backend, 2);
        for (i, (input, t)) in inputs.iter().zip(texts).enumerate() {
            let tokens = model.tokenizer().input(i, input, false).unwrap();
            assert_eq!(tokens.ids, ids(t), "{input:?}");
        }
        for (got, t) in model.embed(&inputs, false).unwrap().iter().zip(texts) {
            let mean: Vec<f32> = serde_json::from_value(t["mean"].clone()).unwrap();
            let norm = mean.iter().map(|x| x * x).sum::<f32>().sqrt();
            let want: Vec<f32> = mean.iter().map(|x| x / norm).collect();
            let d = largest_difference(std::slice::from_ref(got), &[want]);
            assert!(d < 1e-4, "{backend:?}: {}: off by {d}", t["text"]);
        }

        let mut model = open(&reranker, backend, 2);
        assert_eq!(model.kind(), EncoderKind::Reranker { labels: 1 });
        let tokens = model.tokenizer().rerank(query, &documents, false).unwrap();
        for (tokens, p) in tokens.iter().zip(pairs) {
            assert_eq!(tokens.ids, ids(p), "{}", p["document"]);
        }
        let scores = model.rerank(query, &documents, false).unwrap();
        for (score, p) in scores.iter().zip(pairs) {
            let want = 1.0 / (1.0 + (-p["logit"].as_f64().unwrap() as f32).exp());
            assert!(
                (score - want).abs() < 1e-5,
                "{backend:?}: {}: {score} against {want}",
                p["document"]
            );
        }
    }
}
