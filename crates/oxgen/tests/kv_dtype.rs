//! KV caches narrower than the model (`ModelOptions::kv_dtype`) on the default model: how far
//! their logits drift from the f32 cache's over a long text, teacher-forced (the figures
//! docs/PERFORMANCE.md quotes: `cargo test --release -p oxgen --test kv_dtype -- --nocapture`
//! prints them), and what they cost in memory.
//!
//! The model comes from `$OXGEN_DEFAULT_MODEL` (set by `scripts/test.sh`); without it these
//! tests fail and say how to get it.

use oxgen::{KvDtype, Model, ModelOptions, Prompt};
use oxgen_testkit::{argmax, default_model_dir};

fn open(kv_dtype: Option<KvDtype>) -> Model {
    let options = ModelOptions {
        threads: 2,
        memory: oxgen::MemoryOptions {
            kv_dtype,
            ..Default::default()
        },
        ..ModelOptions::default()
    };
    Model::open(default_model_dir(), &options).expect("opening the default model")
}

/// Ids of the text teacher-forced below: the repository's README (prose, commands, tables
/// and code), its first `OXGEN_KV_TEXT_TOKENS` ids (2048 unless set; docs/PERFORMANCE.md
/// quotes 4096).
fn long_text(model: &Model) -> Vec<u32> {
    let len = std::env::var("OXGEN_KV_TEXT_TOKENS").map_or(2048, |v| {
        v.parse()
            .expect("OXGEN_KV_TEXT_TOKENS is a count of ids, at most the README's")
    });
    let text = include_str!("../../../README.md");
    let mut ids = model.encode(&Prompt::Text(text.into())).unwrap();
    assert!(
        ids.len() >= len,
        "the README has {} ids, not {len}",
        ids.len()
    );
    ids.truncate(len);
    ids
}

/// Ids fed per step.
const CHUNK: usize = 256;

/// How one cache's logits compare with the f32 cache's, position by position.
#[derive(Debug, Default)]
struct Drift {
    positions: usize,
    /// Positions whose argmax is the f32 cache's.
    top1_same: usize,
    max_abs: f32,
    sum_abs: f64,
    /// Negative log-likelihood of the text's next id, summed: f32 cache, this cache.
    nll: [f64; 2],
}

impl Drift {
    fn agreement(&self) -> f64 {
        self.top1_same as f64 / self.positions as f64
    }
    fn perplexity(&self, i: usize) -> f64 {
        (self.nll[i] / (self.positions - 1) as f64).exp()
    }
}

/// `-log softmax(row)[id]`.
fn nll(row: &[f32], id: u32) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    max + sum.ln() - row[id as usize] as f64
}

/// `ids` teacher-forced through `reference` (f32 cache) and `model` side by side.
fn drift(reference: &mut Model, model: &mut Model, ids: &[u32]) -> Drift {
    let mut d = Drift::default();
    let (mut a, mut b) = (
        reference.scorer(ids.len()).unwrap(),
        model.scorer(ids.len()).unwrap(),
    );
    for (c, chunk) in ids.chunks(CHUNK).enumerate() {
        a.feed(chunk).unwrap();
        b.feed(chunk).unwrap();
        for i in 0..chunk.len() {
            let (x, y) = (a.row(i), b.row(i));
            d.positions += 1;
            d.top1_same += usize::from(argmax(x) == argmax(y));
            for (p, q) in x.iter().zip(y) {
                let e = (p - q).abs();
                d.max_abs = d.max_abs.max(e);
                d.sum_abs += e as f64;
            }
            if let Some(&next) = ids.get(c * CHUNK + i + 1) {
                d.nll[0] += nll(x, next);
                d.nll[1] += nll(y, next);
            }
        }
    }
    d.sum_abs /= (d.positions * a.vocab()) as f64;
    d
}

/// Teacher-forced over a long text, a narrower cache's logits stay near the f32 cache's.
/// The default model computes its matrix products with int8 activations, where any rounding
/// anywhere (an f16 cache's included) moves some activation across a quantization step: the
/// f16 cache's drift is the floor the others are read against (measured with 4096 ids on an
/// Intel Xeon: top-1 agreement 0.956 f16, 0.957 bf16, 0.948 int8; perplexity 43.980 with the
/// f32 cache, 43.992, 43.937 and 44.010).
#[test]
fn narrow_caches_track_the_f32_cache_over_a_long_text() {
    let mut reference = open(None);
    assert_eq!(
        reference.kv_dtype(),
        KvDtype::F32,
        "the package's own KV dtype"
    );
    let ids = long_text(&reference);
    eprintln!(
        "{} ids | kv dtype | bytes/token | top-1 agreement | max |dlogit| | mean |dlogit| | perplexity (f32 cache's)",
        ids.len()
    );
    let f32_bytes = reference.kv_bytes(1);
    for kv in [KvDtype::F16, KvDtype::BF16, KvDtype::Int8] {
        let mut model = open(Some(kv));
        assert_eq!(model.kv_dtype(), kv);
        let d = drift(&mut reference, &mut model, &ids);
        eprintln!(
            "{kv} | {} ({:.3}x) | {:.4} | {:.3} | {:.4} | {:.3} ({:.3})",
            model.kv_bytes(1),
            model.kv_bytes(1) as f64 / f32_bytes as f64,
            d.agreement(),
            d.max_abs,
            d.sum_abs,
            d.perplexity(1),
            d.perplexity(0),
        );
        assert!(
            d.agreement() >= 0.92,
            "{kv}: top-1 agreement {:.4} over {} positions",
            d.agreement(),
            d.positions
        );
        assert!(d.max_abs > 0.0, "{kv}: the cache rounds, so logits move");
        let ppl = d.perplexity(1) / d.perplexity(0);
        assert!(
            (0.99..1.01).contains(&ppl),
            "{kv}: perplexity ratio {ppl:.4}"
        );
    }
}

#[test]
fn narrow_caches_take_less_memory() {
    let f32 = open(None);
    let int8 = open(Some(KvDtype::Int8));
    let f16 = open(Some(KvDtype::F16));
    // SmolLM2: 30 layers x 2 x 3 KV heads x head size 64.
    assert_eq!(f32.kv_bytes(1), 30 * 2 * 3 * 64 * 4);
    assert_eq!(f16.kv_bytes(1), 30 * 2 * 3 * 64 * 2);
    assert_eq!(int8.kv_bytes(1), 30 * 2 * 3 * (64 + 4));
    assert!(
        int8.kv_bytes(1) * 100 <= f16.kv_bytes(1) * 54,
        "int8 is ~0.53x of f16"
    );
}
