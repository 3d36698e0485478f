//! ModernBERT, a rotary encoder: `oxgen import` of a tiny random checkpoint (committed with
//! transformers' outputs on it, `thirdparty/embeddings/modernbert/make_fixture.py`) gives
//! transformers' `last_hidden_state` on the native backend and on ONNX Runtime, alone and
//! in a right-padded batch, with sequences longer than its local layers' window; and its
//! sequence-classification head gives transformers' logits.

use std::path::{Path, PathBuf};

use oxgen_exec::{ExecOptions, NativeSession};
use oxgen_import::{EncoderArch, EncoderHead, ImportOptions};
use oxgen_runtime::Session;
use oxgen_tensor::Tensor;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("thirdparty/embeddings/modernbert")
}

/// transformers' token ids and their `last_hidden_state` rows.
struct Reference {
    sequences: Vec<Vec<i64>>,
    states: Vec<Vec<f32>>,
    hidden: usize,
}

fn reference() -> Reference {
    let text = std::fs::read_to_string(fixture().join("reference.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let hidden = json["hidden"].as_u64().unwrap() as usize;
    let sequences: Vec<Vec<i64>> = serde_json::from_value(json["sequences"].clone()).unwrap();
    let bytes =
        oxgen_testkit::base64_decode(json["last_hidden_state_f32_base64"].as_str().unwrap());
    let mut values = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()));
    let states = (sequences.iter())
        .map(|s| values.by_ref().take(s.len() * hidden).collect())
        .collect();
    Reference {
        sequences,
        states,
        hidden,
    }
}

/// `input_ids` and `attention_mask` of `batch`, right-padded with 0 and masked.
fn padded(batch: &[&[i64]]) -> Vec<(String, Tensor)> {
    let longest = batch.iter().map(|s| s.len()).max().unwrap();
    let (mut ids, mut mask) = (Vec::new(), Vec::new());
    for s in batch {
        ids.extend(
            s.iter()
                .copied()
                .chain(std::iter::repeat_n(0, longest - s.len())),
        );
        mask.extend((0..longest).map(|i| i64::from(i < s.len())));
    }
    let shape = [batch.len(), longest];
    vec![
        (
            "input_ids".into(),
            Tensor::from_slice(shape.as_slice(), &ids).unwrap(),
        ),
        (
            "attention_mask".into(),
            Tensor::from_slice(shape.as_slice(), &mask).unwrap(),
        ),
    ]
}

/// `last_hidden_state` of `batch` (right-padded with 0 and masked) as rows per sequence.
fn run(session: &mut dyn Session, batch: &[&[i64]], hidden: usize) -> Vec<Vec<f32>> {
    let longest = batch.iter().map(|s| s.len()).max().unwrap();
    let outputs = session.run(padded(batch)).unwrap();
    let states = outputs[0].1.as_slice::<f32>().unwrap();
    (batch.iter().enumerate())
        .map(|(b, s)| states[b * longest * hidden..][..s.len() * hidden].to_vec())
        .collect()
}

/// The package's graph on the native backend (exact, 2 threads) and on ONNX Runtime.
fn sessions(package: &Path) -> (NativeSession, oxgen_ort::OrtSession) {
    let graph = package.join("model.onnx");
    let exec = ExecOptions {
        threads: 2,
        exact: true,
    };
    let native = NativeSession::open(&graph, &exec).unwrap();
    let ort = oxgen_ort::OrtSession::open(&graph, None, 2).unwrap();
    (native, ort)
}

fn largest_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn an_imported_modernbert_gives_transformers_states_on_both_backends() {
    let work = tempfile::tempdir().unwrap();
    let package = work.path().join("modernbert");
    let imported =
        oxgen_import::import_encoder(&fixture(), &package, &ImportOptions::default()).unwrap();
    let spec = &imported.spec;
    assert_eq!(spec.arch, EncoderArch::ModernBert);
    let modern = spec.modern.as_ref().unwrap();
    assert_eq!(modern.local, [false, true, true, false]);
    assert_eq!(
        (modern.window, modern.global_theta, modern.local_theta),
        (8, 160_000.0, 10_000.0)
    );
    let (mut native, mut ort) = sessions(&package);
    let reference = reference();
    let hidden = reference.hidden;
    for (name, session) in [
        ("native", &mut native as &mut dyn Session),
        ("onnxruntime", &mut ort),
    ] {
        for (ids, want) in reference.sequences.iter().zip(&reference.states) {
            let got = run(session, &[ids], hidden);
            let d = largest_difference(&got[0], want);
            assert!(d < 1e-4, "{name}: {} tokens: off by {d}", ids.len());
        }
        // Right-padded together: the padding changes nothing of the tokens' rows.
        let batch: Vec<&[i64]> = reference.sequences.iter().map(Vec::as_slice).collect();
        for (i, got) in run(session, &batch, hidden).iter().enumerate() {
            let d = largest_difference(got, &reference.states[i]);
            assert!(
                d < 1e-4,
                "{name}: sequence {i} in a padded batch: off by {d}"
            );
        }
    }
}

/// `logits` (`[batch, labels]`) of `batch`, right-padded with 0 and masked.
fn logits(session: &mut dyn Session, batch: &[&[i64]]) -> Vec<f32> {
    let outputs = session.run(padded(batch)).unwrap();
    let (name, logits) = &outputs[0];
    assert_eq!(name, "logits");
    assert_eq!(logits.shape().dims(), [batch.len(), 1]);
    logits.as_slice::<f32>().unwrap().to_vec()
}

/// A `ModernBertForSequenceClassification` (the tiny checkpoint with a random head,
/// `make_classifier.py`) gives transformers' logits with its head over the tokens' mean and,
/// with `classifier_pooling` rewritten, over the first token, alone and right-padded.
#[test]
fn an_imported_modernbert_classifier_gives_transformers_logits() {
    let fixture = fixture().join("classifier");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("reference.json")).unwrap())
            .unwrap();
    let sequences: Vec<Vec<i64>> = serde_json::from_value(json["sequences"].clone()).unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("hf");
    std::fs::create_dir_all(&src).unwrap();
    for file in ["model.safetensors", "tokenizer.json"] {
        std::fs::copy(fixture.join(file), src.join(file)).unwrap();
    }
    let config = std::fs::read_to_string(fixture.join("config.json")).unwrap();
    for pooling in ["mean", "cls"] {
        let rewritten = config.replace(
            "\"classifier_pooling\": \"mean\"",
            &format!("\"classifier_pooling\": \"{pooling}\""),
        );
        std::fs::write(src.join("config.json"), rewritten).unwrap();
        let package = work.path().join(pooling);
        let imported =
            oxgen_import::import_encoder(&src, &package, &ImportOptions::default()).unwrap();
        assert_eq!(imported.spec.head, EncoderHead::Classifier { labels: 1 });
        let modern = imported.spec.modern.as_ref().unwrap();
        assert_eq!(modern.classifier.mean, pooling == "mean");
        let want: Vec<f32> =
            serde_json::from_value(json[format!("logits_{pooling}")].clone()).unwrap();
        let (mut native, mut ort) = sessions(&package);
        for (name, session) in [
            ("native", &mut native as &mut dyn Session),
            ("onnxruntime", &mut ort),
        ] {
            for (ids, want) in sequences.iter().zip(&want) {
                let got = logits(session, &[ids])[0];
                assert!(
                    (got - want).abs() < 1e-4,
                    "{name}, {pooling} pooling, {} tokens: {got} against {want}",
                    ids.len()
                );
            }
            let batch: Vec<&[i64]> = sequences.iter().map(Vec::as_slice).collect();
            let d = largest_difference(&logits(session, &batch), &want);
            assert!(d < 1e-4, "{name}, {pooling} pooling, padded: off by {d}");
        }
    }
}
