//! GroupQueryAttention and RotaryEmbedding (com.microsoft and ONNX) against onnxruntime 1.32.
//!
//! Every case is one node with its own inputs; all cases of a family share one model, so
//! onnxruntime starts once per family. Data comes from the testkit's seeded `Rng`, in [-1, 1).
//!
//! Tolerance (f32): `|ours - ort| <= 2e-6 + 1e-5 * |ort|`. Both sides compute in f32 but
//! round differently: onnxruntime's MLAS GEMMs use FMA and blocked sums for `q · k` and
//! `p · V` (up to 64 terms of magnitude < 1: a few ulps of a score, which `exp` turns into a
//! few ulps of a weight), and its rotary kernel may fuse multiply-adds. Outputs are convex
//! combinations of values in [-1, 1), so absolute errors stay near f32's ulp at 1 (1.2e-7):
//! the observed maximum (printed with `--nocapture`) was 1.8e-7 for GroupQueryAttention and
//! 1.2e-7 for RotaryEmbedding, ~10x inside the bound, while any semantic slip (a position
//! off by one, a wrong window or head mapping) moves outputs by 1e-2 or more. f16 cases
//! store every value in f16 (ulp 2^-11 near 1), so they use `2e-3 + 2e-3 * |ort|`.
//!
//! Requires `OXGEN_PYTHON` (see `oxgen_testkit::ort_oracle`).

use std::path::Path;

use half::f16;
use oxgen_onnx::proto::AttributeProto;
use oxgen_onnx::writer::{Dim, ModelBuilder, attr};
use oxgen_tensor::{DType, Tensor};
use oxgen_testkit::node_tests::native_session;
use oxgen_testkit::{Rng, ort_oracle};

const F32_TOL: (f64, f64) = (2e-6, 1e-5);
const F16_TOL: (f64, f64) = (2e-3, 2e-3);
/// Rows of the cos/sin caches.
const MAX_POS: usize = 32;

/// A float tensor in f32 or f16.
fn float(dims: &[usize], v: &[f32], half: bool) -> Tensor {
    if half {
        Tensor::from_slice(
            dims,
            &v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>(),
        )
        .unwrap()
    } else {
        Tensor::from_slice(dims, v).unwrap()
    }
}

fn to_f32(t: &Tensor) -> Vec<f32> {
    match t.dtype() {
        DType::F16 => t
            .as_slice::<f16>()
            .unwrap()
            .iter()
            .map(|v| v.to_f32())
            .collect(),
        _ => t.as_slice::<f32>().unwrap().to_vec(),
    }
}

/// RoPE caches `cos/sin(pos * 10000^(-i / half))`, shape (MAX_POS, half).
fn rope_caches(half: usize) -> (Vec<f32>, Vec<f32>) {
    let angle = |k: usize| (k / half) as f32 * 10000f32.powf(-((k % half) as f32) / half as f32);
    (
        (0..MAX_POS * half).map(|k| angle(k).cos()).collect(),
        (0..MAX_POS * half).map(|k| angle(k).sin()).collect(),
    )
}

/// Graph inputs, native and onnxruntime outputs of one model, plus what to compare.
struct Suite {
    builder: ModelBuilder,
    feeds: Vec<(String, Tensor)>,
    /// Per graph output: its case, and an element filter (None compares all).
    checks: Vec<(String, Option<Filter>, (f64, f64))>,
    /// (output, feed, filter): native output elements that must keep the feed's bits (a
    /// cache updated in place keeps its old contents where nothing was written).
    kept: Vec<(usize, usize, Filter)>,
}

type Filter = Box<dyn Fn(usize) -> bool>;

impl Suite {
    fn new(default_opset: i64) -> Suite {
        let mut builder = ModelBuilder::new("oxgen-attention-test");
        builder.opset("", default_opset);
        builder.opset("com.microsoft", 1);
        Suite {
            builder,
            feeds: Vec::new(),
            checks: Vec::new(),
            kept: Vec::new(),
        }
    }

    fn feed(&mut self, name: &str, t: Tensor) -> String {
        let dims: Vec<Dim> = t.dims().iter().map(|&d| Dim::Fixed(d)).collect();
        self.builder.input(name, t.dtype(), &dims);
        self.feeds.push((name.to_string(), t));
        name.to_string()
    }

    fn output(
        &mut self,
        name: &str,
        dtype: DType,
        filter: Option<Box<dyn Fn(usize) -> bool>>,
        tol: (f64, f64),
    ) {
        self.builder.output(name, dtype, &[]);
        self.checks.push((name.to_string(), filter, tol));
    }

    /// Runs both backends; returns the worst `|diff|` seen in f32 and in f16 outputs, failing
    /// on any value out of tolerance.
    fn compare(&self, path: &Path) -> [f64; 2] {
        self.builder.save(path, None).unwrap();
        let ort = ort_oracle::run(path, &self.feeds).unwrap();
        let ours = native_session(path)
            .unwrap()
            .run(self.feeds.clone())
            .unwrap();
        assert_eq!(ort.len(), self.checks.len());
        let mut worst = [0f64; 2];
        let mut failures = Vec::new();
        for ((name, filter, (atol, rtol)), (e, (_, a))) in
            self.checks.iter().zip(ort.iter().zip(&ours))
        {
            if a.dims() != e.dims() {
                failures.push(format!(
                    "{name}: shape {} != onnxruntime {}",
                    a.shape(),
                    e.shape()
                ));
                continue;
            }
            let slot = (a.dtype() == DType::F16) as usize;
            let (a, e) = (to_f32(a), to_f32(e));
            let mut bad = None;
            for (i, (&x, &y)) in a.iter().zip(&e).enumerate() {
                if filter.as_ref().is_some_and(|f| !f(i)) {
                    continue;
                }
                let d = (x as f64 - y as f64).abs();
                worst[slot] = worst[slot].max(d);
                // NaN never passes.
                let ok = d <= atol + rtol * (y as f64).abs();
                if !ok && bad.is_none() {
                    bad = Some(format!("{name}[{i}]: {x} vs onnxruntime {y}"));
                }
            }
            failures.extend(bad);
        }
        for (out, feed, filter) in &self.kept {
            let (a, e) = (to_f32(&ours[*out].1), to_f32(&self.feeds[*feed].1));
            if let Some(i) = (0..a.len()).find(|&i| filter(i) && a[i].to_bits() != e[i].to_bits()) {
                failures.push(format!(
                    "{}[{i}] = {} lost the past value {}",
                    self.checks[*out].0, a[i], e[i]
                ));
            }
        }
        assert!(
            failures.is_empty(),
            "{} mismatches:\n{}",
            failures.len(),
            failures.join("\n")
        );
        worst
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// First prompt, no past inputs.
    Prompt,
    /// First prompt with zero-length past tensors.
    PromptEmptyPast,
    /// First prompt into a max-length shared buffer.
    PromptShared,
    /// One token after a past of exactly the cached length (present = concat).
    Decode,
    /// One token into a max-length shared buffer.
    DecodeShared,
    /// Three more prompt tokens after cached ones (batch 1), concat.
    Chunk,
    /// Three more prompt tokens into a shared buffer.
    ChunkShared,
}

#[derive(Debug, Clone)]
struct Gqa {
    step: Step,
    batch: usize,
    heads: usize,
    kv_heads: usize,
    head_size: usize,
    /// `rotary_dim / 2` and interleaved, when rotating.
    rotary: Option<(usize, bool)>,
    window: i64,
    softcap: f32,
    scale: Option<f32>,
    packed: bool,
    half: bool,
    /// Feed `head_sink` (one logit per head, in [-3, 3)).
    sink: bool,
    /// Add a second node on the same inputs: the first must then update a copy of the past
    /// (the second still reads it), the second gets the past handed over.
    twice: bool,
}

impl Gqa {
    /// (sequence length, seqlens_k, total_sequence_length, past length).
    fn lengths(&self) -> (usize, Vec<usize>, usize, Option<usize>) {
        let two = self.batch == 2;
        match self.step {
            Step::Prompt => (5, if two { vec![4, 2] } else { vec![4] }, 5, None),
            Step::PromptEmptyPast => (4, vec![3; self.batch], 4, Some(0)),
            Step::PromptShared => (5, if two { vec![4, 3] } else { vec![4] }, 5, Some(12)),
            Step::Decode => (1, if two { vec![6, 3] } else { vec![6] }, 7, Some(6)),
            // Batch 2 uses a buffer of exactly total_sequence_length positions (the boundary).
            Step::DecodeShared => (
                1,
                if two { vec![6, 3] } else { vec![6] },
                7,
                Some(if two { 7 } else { 10 }),
            ),
            Step::Chunk => (3, vec![6], 7, Some(4)),
            Step::ChunkShared => (3, vec![6], 7, Some(10)),
        }
    }

    /// Adds this case's node, inputs and outputs to `suite`.
    fn add(&self, id: usize, suite: &mut Suite, rng: &mut Rng) {
        let (b, h, n, kv) = (self.batch, self.head_size, self.heads, self.kv_heads);
        let (s, seqlens, total, past) = self.lengths();
        let first = s == total;
        let starts: Vec<usize> = seqlens
            .iter()
            .map(|&l| if first { 0 } else { l + 1 - s })
            .collect();
        let p = |name: &str| format!("c{id}_{name}");
        let mut ins = vec![String::new(); 9];
        let mut past_feed = None;
        if self.packed {
            ins[0] = suite.feed(
                &p("qkv"),
                float(
                    &[b, s, (n + 2 * kv) * h],
                    &rng.values(b * s * (n + 2 * kv) * h, 1.0),
                    self.half,
                ),
            );
        } else {
            ins[0] = suite.feed(
                &p("q"),
                float(&[b, s, n * h], &rng.values(b * s * n * h, 1.0), self.half),
            );
            ins[1] = suite.feed(
                &p("k"),
                float(&[b, s, kv * h], &rng.values(b * s * kv * h, 1.0), self.half),
            );
            ins[2] = suite.feed(
                &p("v"),
                float(&[b, s, kv * h], &rng.values(b * s * kv * h, 1.0), self.half),
            );
        }
        if let Some(len) = past {
            for (slot, name) in [(3, "past_k"), (4, "past_v")] {
                // Cached positions hold data; the rest holds junk (9) that must never be read,
                // and that a concatenating update must not copy.
                let mut data = vec![9f32; b * kv * len * h];
                let fresh = rng.values(data.len(), 1.0);
                for (i, x) in data.iter_mut().enumerate() {
                    if (i / h) % len < starts[i / (kv * len * h)] {
                        *x = fresh[i];
                    }
                }
                past_feed.get_or_insert(suite.feeds.len());
                ins[slot] = suite.feed(&p(name), float(&[b, kv, len, h], &data, self.half));
            }
        }
        let sl: Vec<i32> = seqlens.iter().map(|&l| l as i32).collect();
        ins[5] = suite.feed(&p("seqlens_k"), Tensor::from_slice([b], &sl).unwrap());
        ins[6] = suite.feed(&p("total"), Tensor::scalar(total as i32));
        let mut attrs = vec![
            attr::int("num_heads", n as i64),
            attr::int("kv_num_heads", kv as i64),
        ];
        if let Some((half, interleaved)) = self.rotary {
            let (cos, sin) = rope_caches(half);
            ins[7] = suite.feed(&p("cos"), float(&[MAX_POS, half], &cos, self.half));
            ins[8] = suite.feed(&p("sin"), float(&[MAX_POS, half], &sin, self.half));
            attrs.push(attr::int("do_rotary", 1));
            attrs.push(attr::int("rotary_interleaved", interleaved as i64));
        }
        if self.window != -1 {
            attrs.push(attr::int("local_window_size", self.window));
        }
        if self.softcap != 0.0 {
            attrs.push(attr::float("softcap", self.softcap));
        }
        if let Some(scale) = self.scale {
            attrs.push(attr::float("scale", scale));
        }
        if self.sink {
            let sinks: Vec<f32> = rng.values(n, 1.0).iter().map(|x| 3.0 * x).collect();
            ins.resize(12, String::new());
            ins[11] = suite.feed(&p("head_sink"), float(&[n], &sinks, self.half));
        }
        while ins.last().is_some_and(String::is_empty) {
            ins.pop();
        }
        let ins_ref: Vec<&str> = ins.iter().map(String::as_str).collect();
        for again in if self.twice {
            &["", "again_"][..]
        } else {
            &[""][..]
        } {
            let outs = [
                p(&format!("{again}out")),
                p(&format!("{again}present_k")),
                p(&format!("{again}present_v")),
            ];
            let outs_ref: Vec<&str> = outs.iter().map(String::as_str).collect();
            let name = p(&format!("{again}gqa"));
            suite.builder.node(
                "GroupQueryAttention",
                "com.microsoft",
                &name,
                &ins_ref,
                &outs_ref,
                attrs.clone(),
            );
            self.outputs(&outs, suite, &seqlens, &starts, past_feed);
        }
    }

    /// Declares one node's outputs with their comparison filters.
    fn outputs(
        &self,
        outs: &[String; 3],
        suite: &mut Suite,
        seqlens: &[usize],
        starts: &[usize],
        past_feed: Option<usize>,
    ) {
        let (h, n, kv) = (self.head_size, self.heads, self.kv_heads);
        let (s, _, total, past) = self.lengths();
        let first = s == total;
        let shared = past.is_some_and(|p| p >= total);
        let cap = past.unwrap_or(0).max(total);
        let (dtype, tol) = if self.half {
            (DType::F16, F16_TOL)
        } else {
            (DType::F32, F32_TOL)
        };
        // Rows past an entry's valid length in a padded first prompt are unspecified.
        // onnxruntime's f32 kernel limits them to the valid keys, as ours does, so they are
        // compared; its f16 kernel differs there once a window applies, so f16 skips them.
        let filter: Option<Box<dyn Fn(usize) -> bool>> = (self.half && first).then(|| {
            let seqlens = seqlens.to_vec();
            Box::new(move |i: usize| (i / (n * h)) % s <= seqlens[i / (s * n * h)]) as _
        });
        suite.output(&outs[0], dtype, filter, tol);
        for (k, name) in outs[1..].iter().enumerate() {
            // A shared buffer keeps its old contents past each entry's valid length, where
            // onnxruntime (distinct buffers) writes zeros: compare the valid positions only,
            // and check the rest still holds the past (it was updated in place).
            let valid = {
                let seqlens = seqlens.to_vec();
                move |i: usize| (i / h) % cap <= seqlens[i / (kv * cap * h)]
            };
            let written = {
                let (seqlens, starts) = (seqlens.to_vec(), starts.to_vec());
                move |i: usize| {
                    let (pos, b) = ((i / h) % cap, i / (kv * cap * h));
                    pos < starts[b] + s || pos <= seqlens[b]
                }
            };
            if shared {
                let feed = past_feed.expect("a shared buffer is a past input") + k;
                suite
                    .kept
                    .push((suite.checks.len(), feed, Box::new(move |i| !written(i))));
            }
            suite.output(name, dtype, shared.then(|| Box::new(valid) as _), tol);
        }
    }
}

/// A covering set: every step kind with head ratios 1, 2 and 3, twice, with head sizes,
/// rotary modes, windows, softcaps, scales, sinks, batch sizes and packing cycled at different
/// periods so each value meets the others; plus two f16 cases.
fn gqa_cases() -> Vec<Gqa> {
    use Step::*;
    let mut cases = Vec::new();
    for round in 0..2 {
        for step in [
            Prompt,
            PromptEmptyPast,
            PromptShared,
            Decode,
            DecodeShared,
            Chunk,
            ChunkShared,
        ] {
            for ratio in [1, 2, 3] {
                let i = cases.len();
                let head_size = [8, 16, 64][(i + round) % 3];
                let kv_heads = 1 + i % 2;
                let rotary = (head_size >= 16 && (i / 3 + round) % 4 != 3).then(|| {
                    let half = if head_size == 64 && i % 2 == 0 {
                        16
                    } else {
                        head_size / 2
                    };
                    (half, (i / 2 + round) % 2 == 1)
                });
                cases.push(Gqa {
                    step,
                    batch: if matches!(step, Chunk | ChunkShared) || (i + round) % 2 == 1 {
                        1
                    } else {
                        2
                    },
                    heads: kv_heads * ratio,
                    kv_heads,
                    head_size,
                    rotary,
                    window: if (i + round) % 3 == 0 { 4 } else { -1 },
                    softcap: if (i / 2 + round) % 3 == 1 { 30.0 } else { 0.0 },
                    scale: (i % 5 == 2).then_some(0.3),
                    packed: i % 4 == 3,
                    half: false,
                    sink: (i + round) % 4 == 1,
                    twice: round == 0 && step == DecodeShared && ratio == 2,
                });
            }
        }
    }
    let base = Gqa {
        step: DecodeShared,
        batch: 2,
        heads: 4,
        kv_heads: 2,
        head_size: 16,
        rotary: Some((8, false)),
        window: -1,
        softcap: 0.0,
        scale: None,
        packed: false,
        half: true,
        sink: false,
        twice: false,
    };
    cases.push(base.clone());
    cases.push(Gqa {
        step: Prompt,
        rotary: Some((8, true)),
        window: 4,
        sink: true,
        ..base
    });
    cases
}

#[test]
fn group_query_attention_matches_onnxruntime() {
    let cases = gqa_cases();
    // The covering set really covers: each option value and rotary mode occurs with each step
    // kind's two families (prompt and continuation).
    for (what, ok) in [
        (
            "rotary half / interleaved",
            [(false, false), (false, true), (true, false), (true, true)]
                .iter()
                .all(|&(partial, il)| {
                    cases.iter().any(|c| {
                        c.rotary
                            .is_some_and(|(half, i)| (2 * half < c.head_size) == partial && i == il)
                    })
                }),
        ),
        (
            "window and softcap together",
            cases.iter().any(|c| c.window == 4 && c.softcap > 0.0),
        ),
        (
            "packed with rotary",
            cases.iter().any(|c| c.packed && c.rotary.is_some()),
        ),
        (
            "ratio 3 in a shared decode",
            cases
                .iter()
                .any(|c| c.step == Step::DecodeShared && c.heads == 3 * c.kv_heads),
        ),
        (
            "batch 2 padded prompt",
            cases.iter().any(|c| c.step == Step::Prompt && c.batch == 2),
        ),
        (
            "head size 8 and 64",
            [8, 64]
                .iter()
                .all(|&h| cases.iter().any(|c| c.head_size == h)),
        ),
        ("custom scale", cases.iter().any(|c| c.scale.is_some())),
        (
            "sinks with a window, in a prompt and a decode",
            [Step::Prompt, Step::Decode, Step::DecodeShared]
                .iter()
                .all(|&s| cases.iter().any(|c| c.sink && c.step == s))
                && cases.iter().any(|c| c.sink && c.window == 4),
        ),
    ] {
        assert!(ok, "case set lacks {what}");
    }
    let dir = tempfile::tempdir().unwrap();
    let mut suite = Suite::new(21);
    let mut rng = Rng::new(0x2545_f491_4f6c_dd1d);
    for (id, c) in cases.iter().enumerate() {
        c.add(id, &mut suite, &mut rng);
    }
    let [f32_max, f16_max] = suite.compare(&dir.path().join("gqa.onnx"));
    eprintln!(
        "GroupQueryAttention: {} cases, max |native - onnxruntime|: f32 {f32_max:e}, f16 {f16_max:e}",
        cases.len()
    );
}

/// A prompt of 7 tokens and 7 single-token steps through a shared cache give the same
/// outputs and the same cache, bit for bit (the reduction contract at op level, with RoPE).
#[test]
fn prefill_equals_decode_steps_through_a_shared_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (n, kv, h, cap) = (4, 2, 16, 12);
    let mut b = ModelBuilder::new("oxgen-attention-test");
    b.opset("", 21).opset("com.microsoft", 1);
    let q_dims = [Dim::Fixed(1), Dim::from("s"), Dim::Fixed(n * h)];
    let kv_dims = [Dim::Fixed(1), Dim::from("s"), Dim::Fixed(kv * h)];
    let cache = [
        Dim::Fixed(1),
        Dim::Fixed(kv),
        Dim::Fixed(cap),
        Dim::Fixed(h),
    ];
    b.input("q", DType::F32, &q_dims)
        .input("k", DType::F32, &kv_dims)
        .input("v", DType::F32, &kv_dims);
    b.input("pk", DType::F32, &cache)
        .input("pv", DType::F32, &cache);
    b.input("sl", DType::I32, &[Dim::Fixed(1)])
        .input("total", DType::I32, &[]);
    b.input("cos", DType::F32, &[Dim::Fixed(MAX_POS), Dim::Fixed(h / 2)])
        .input("sin", DType::F32, &[Dim::Fixed(MAX_POS), Dim::Fixed(h / 2)]);
    let attrs = vec![
        attr::int("num_heads", n as i64),
        attr::int("kv_num_heads", kv as i64),
        attr::int("do_rotary", 1),
        attr::int("local_window_size", 4),
    ];
    b.node(
        "GroupQueryAttention",
        "com.microsoft",
        "gqa",
        &["q", "k", "v", "pk", "pv", "sl", "total", "cos", "sin"],
        &["out", "k2", "v2"],
        attrs,
    );
    b.output("out", DType::F32, &[])
        .output("k2", DType::F32, &[])
        .output("v2", DType::F32, &[]);
    let path = dir.path().join("chain.onnx");
    b.save(&path, None).unwrap();
    let mut session = native_session(&path).unwrap();
    let mut rng = Rng::new(99);
    let (q, k, v) = (
        rng.values(7 * n * h, 1.0),
        rng.values(7 * kv * h, 1.0),
        rng.values(7 * kv * h, 1.0),
    );
    let (cos, sin) = rope_caches(h / 2);
    let run = |session: &mut Box<dyn oxgen_runtime::Session>,
               t0: usize,
               len: usize,
               pk: Tensor,
               pv: Tensor| {
        let feeds = vec![
            (
                "q".to_string(),
                Tensor::from_slice([1, len, n * h], &q[t0 * n * h..(t0 + len) * n * h]).unwrap(),
            ),
            (
                "k".to_string(),
                Tensor::from_slice([1, len, kv * h], &k[t0 * kv * h..(t0 + len) * kv * h]).unwrap(),
            ),
            (
                "v".to_string(),
                Tensor::from_slice([1, len, kv * h], &v[t0 * kv * h..(t0 + len) * kv * h]).unwrap(),
            ),
            ("pk".to_string(), pk),
            ("pv".to_string(), pv),
            (
                "sl".to_string(),
                Tensor::from_slice([1], &[(t0 + len - 1) as i32]).unwrap(),
            ),
            ("total".to_string(), Tensor::scalar((t0 + len) as i32)),
            (
                "cos".to_string(),
                Tensor::from_slice([MAX_POS, h / 2], &cos).unwrap(),
            ),
            (
                "sin".to_string(),
                Tensor::from_slice([MAX_POS, h / 2], &sin).unwrap(),
            ),
        ];
        let mut out = session.run(feeds).unwrap().into_iter().map(|(_, t)| t);
        (
            out.next().unwrap(),
            out.next().unwrap(),
            out.next().unwrap(),
        )
    };
    let empty = || Tensor::zeros(DType::F32, [1, kv, cap, h]).unwrap();
    let (prefill, pk_all, pv_all) = run(&mut session, 0, 7, empty(), empty());
    let (mut pk, mut pv) = (empty(), empty());
    for t in 0..7 {
        let (out, k2, v2) = run(&mut session, t, 1, pk, pv);
        let want = &prefill.as_slice::<f32>().unwrap()[t * n * h..(t + 1) * n * h];
        let got = out.as_slice::<f32>().unwrap();
        assert!(
            want.iter()
                .zip(got)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "token {t} differs from the prefill row"
        );
        (pk, pv) = (k2, v2);
    }
    assert_eq!(pk.as_bytes(), pk_all.as_bytes(), "the key caches differ");
    assert_eq!(pv.as_bytes(), pv_all.as_bytes(), "the value caches differ");
}

#[derive(Debug, Clone, Copy)]
struct RotaryCase {
    onnx: bool,
    four_d: bool,
    interleaved: bool,
    /// rotary_embedding_dim attribute (0: whole head).
    rot_dim: usize,
    /// Set num_heads (required for 3-D ONNX input and partial contrib rotation).
    num_heads_attr: bool,
    /// Position ids: None (ONNX: caches per token), Some(false) offset/[B,S] ids, Some(true) a
    /// single offset (contrib only).
    ids: Option<bool>,
    half: bool,
}

fn add_rotary(c: &RotaryCase, id: usize, suite: &mut Suite, rng: &mut Rng) {
    let (b, s, n, h) = (2, 3, 2, 16);
    let rot = if c.rot_dim > 0 { c.rot_dim } else { h };
    let p = |name: &str| format!("r{id}_{name}");
    let dims = if c.four_d {
        vec![b, n, s, h]
    } else {
        vec![b, s, n * h]
    };
    let x = suite.feed(
        &p("x"),
        float(&dims, &rng.values(b * s * n * h, 1.0), c.half),
    );
    let (cos, sin) = rope_caches(rot / 2);
    let (cos, sin) = match c.ids {
        Some(_) => (
            float(&[MAX_POS, rot / 2], &cos, c.half),
            float(&[MAX_POS, rot / 2], &sin, c.half),
        ),
        None => {
            // Caches gathered per token: (batch, seq, rot / 2) rows at positions 5 + 2 * t.
            let pick = |v: &[f32]| {
                (0..b * s)
                    .flat_map(|t| v[(5 + 2 * t) * rot / 2..][..rot / 2].to_vec())
                    .collect::<Vec<_>>()
            };
            (
                float(&[b, s, rot / 2], &pick(&cos), c.half),
                float(&[b, s, rot / 2], &pick(&sin), c.half),
            )
        }
    };
    let (cos, sin) = (suite.feed(&p("cos"), cos), suite.feed(&p("sin"), sin));
    let ids = c.ids.map(|single| {
        let t = if single {
            Tensor::from_slice([1], &[4i64]).unwrap()
        } else {
            Tensor::from_slice([b, s], &[0i64, 1, 2, 7, 9, 30]).unwrap()
        };
        suite.feed(&p("pos"), t)
    });
    let mut attrs: Vec<AttributeProto> = vec![attr::int("interleaved", c.interleaved as i64)];
    if c.rot_dim > 0 {
        attrs.push(attr::int("rotary_embedding_dim", c.rot_dim as i64));
    }
    if c.num_heads_attr {
        attrs.push(attr::int("num_heads", n as i64));
    }
    let y = p("y");
    let (domain, ins) = if c.onnx {
        let mut ins = vec![x.clone(), cos, sin];
        ins.extend(ids);
        ("", ins)
    } else {
        (
            "com.microsoft",
            vec![
                x.clone(),
                ids.expect("contrib RotaryEmbedding takes position_ids"),
                cos,
                sin,
            ],
        )
    };
    let ins: Vec<&str> = ins.iter().map(String::as_str).collect();
    suite
        .builder
        .node("RotaryEmbedding", domain, &p("rope"), &ins, &[&y], attrs);
    let (dtype, tol) = if c.half {
        (DType::F16, F16_TOL)
    } else {
        (DType::F32, F32_TOL)
    };
    suite.output(&y, dtype, None, tol);
}

#[test]
fn rotary_embedding_matches_onnxruntime_in_both_domains() {
    let mut cases = Vec::new();
    for interleaved in [false, true] {
        for four_d in [false, true] {
            // com.microsoft: whole head (head size from the caches), partial, single offset.
            let contrib = RotaryCase {
                onnx: false,
                four_d,
                interleaved,
                rot_dim: 0,
                num_heads_attr: false,
                ids: Some(false),
                half: false,
            };
            cases.push(contrib);
            cases.push(RotaryCase {
                rot_dim: 8,
                num_heads_attr: true,
                ..contrib
            });
            cases.push(RotaryCase {
                ids: Some(true),
                num_heads_attr: true,
                ..contrib
            });
            // ONNX: with ids, partial, and per-token caches without ids.
            let onnx = RotaryCase {
                onnx: true,
                num_heads_attr: !four_d,
                ..contrib
            };
            cases.push(onnx);
            cases.push(RotaryCase { rot_dim: 8, ..onnx });
            cases.push(RotaryCase { ids: None, ..onnx });
        }
    }
    cases.push(RotaryCase {
        onnx: true,
        four_d: false,
        interleaved: true,
        rot_dim: 8,
        num_heads_attr: true,
        ids: Some(false),
        half: true,
    });
    let dir = tempfile::tempdir().unwrap();
    let mut suite = Suite::new(23);
    let mut rng = Rng::new(0x1234_5678_9abc_def1);
    for (id, c) in cases.iter().enumerate() {
        add_rotary(c, id, &mut suite, &mut rng);
    }
    let [f32_max, f16_max] = suite.compare(&dir.path().join("rope.onnx"));
    eprintln!(
        "RotaryEmbedding: {} cases, max |native - onnxruntime|: f32 {f32_max:e}, f16 {f16_max:e}",
        cases.len()
    );
}

#[path = "attention_ops/errors.rs"]
mod errors;
