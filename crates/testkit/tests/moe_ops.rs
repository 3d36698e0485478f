//! com.microsoft::MoE and QMoE against onnxruntime 1.32: every routing variant, activation
//! (SwiGLU in gpt-oss's interleaved and clamped form among them), expert biases, 4- and 8-bit
//! experts with one scale per row or per block, zero points, `router_weights`, up to 128
//! experts. All cases are nodes of one model, so onnxruntime starts once.
//!
//! Weights are graph inputs, not initializers: onnxruntime then dequantizes them and
//! multiplies in f32 (its prepacked paths for initializers may use int8 activations), which is
//! what the native f32 path computes. Both sides sum in f32 in different orders, so outputs
//! agree to `2e-5 + 2e-5 * |ort|` (the worst seen is printed with `--nocapture`); a wrong
//! expert, weight or activation moves them by far more.
//!
//! Requires `OXGEN_PYTHON` (see `oxgen_testkit::ort_oracle`).

use oxgen_onnx::writer::{Dim, ModelBuilder, attr};
use oxgen_tensor::{DType, Tensor};
use oxgen_testkit::node_tests::native_session;
use oxgen_testkit::{Rng, ort_oracle};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Act {
    Relu,
    Gelu,
    Silu,
    Identity,
    /// gpt-oss's: alpha 1.702, beta 1, limit 7 (a limit low enough to clamp here).
    SwiGlu,
}

#[derive(Debug, Clone, Copy)]
struct Case {
    experts: usize,
    k: usize,
    hidden: usize,
    inter: usize,
    tokens: usize,
    act: Act,
    normalize: bool,
    bias: bool,
    /// `(bits, block_size or 0, zero points)` for QMoE.
    quant: Option<(usize, usize, bool)>,
    router_weights: bool,
    /// Input as (1, tokens, hidden) instead of (tokens, hidden).
    three_d: bool,
}

struct Suite {
    builder: ModelBuilder,
    feeds: Vec<(String, Tensor)>,
    outputs: Vec<String>,
}

impl Suite {
    fn feed(&mut self, name: String, t: Tensor) -> String {
        let dims: Vec<Dim> = t.dims().iter().map(|&d| Dim::Fixed(d)).collect();
        self.builder.input(&name, t.dtype(), &dims);
        self.feeds.push((name.clone(), t));
        name
    }

    fn add(&mut self, id: usize, c: &Case, rng: &mut Rng) {
        let p = |s: &str| format!("c{id}_{s}");
        let f = if c.act == Act::SwiGlu { 2 } else { 1 };
        let (e, h, i, t) = (c.experts, c.hidden, c.inter, c.tokens);
        let x_dims = if c.three_d { vec![1, t, h] } else { vec![t, h] };
        let x = self.feed(
            p("x"),
            Tensor::from_slice(&x_dims[..], &rng.values(t * h, 1.0)).unwrap(),
        );
        let logits = self.feed(
            p("router"),
            Tensor::from_slice([t, e], &rng.values(t * e, 2.0)).unwrap(),
        );
        let mut ins = vec![x, logits];
        let mut zps = Vec::new();
        for (fc, n, kk) in [("fc1", i * f, h), ("fc2", h, i)] {
            match c.quant {
                None => {
                    let w = rng.values(e * n * kk, 0.3);
                    ins.push(self.feed(
                        p(&format!("{fc}_w")),
                        Tensor::from_slice([e, n, kk], &w).unwrap(),
                    ));
                }
                Some((bits, block, zp)) => {
                    let per_byte = 8 / bits;
                    let codes = rng.bytes(e * n * kk / per_byte);
                    ins.push(self.feed(
                        p(&format!("{fc}_w")),
                        Tensor::from_slice([e, n, kk / per_byte], &codes).unwrap(),
                    ));
                    // Scales that keep every weight near the f32 case's (|w| <= ~0.3).
                    let unit = 0.3 / (1 << (bits - 1)) as f32;
                    let scales_dims = match kk.checked_div(block) {
                        None => vec![e, n],
                        Some(blocks) => vec![e, n, blocks],
                    };
                    let count: usize = scales_dims.iter().product();
                    let scales: Vec<f32> = rng
                        .values(count, 1.0)
                        .iter()
                        .map(|v| unit * (0.5 + 0.5 * v.abs()))
                        .collect();
                    ins.push(self.feed(
                        p(&format!("{fc}_scales")),
                        Tensor::from_slice(&scales_dims[..], &scales).unwrap(),
                    ));
                    if zp {
                        let per_row = (kk / block).div_ceil(per_byte);
                        zps.push(
                            self.feed(
                                p(&format!("{fc}_zp")),
                                Tensor::from_slice([e, n, per_row], &rng.bytes(e * n * per_row))
                                    .unwrap(),
                            ),
                        );
                    }
                }
            }
            let bias = if c.bias {
                self.feed(
                    p(&format!("{fc}_b")),
                    Tensor::from_slice([e, n], &rng.values(e * n, 0.5)).unwrap(),
                )
            } else {
                String::new()
            };
            ins.push(bias);
        }
        let mut attrs = vec![
            attr::int("k", c.k as i64),
            attr::int("normalize_routing_weights", c.normalize as i64),
            attr::string(
                "activation_type",
                match c.act {
                    Act::Relu => "relu",
                    Act::Gelu => "gelu",
                    Act::Silu => "silu",
                    Act::Identity => "identity",
                    Act::SwiGlu => "swiglu",
                },
            ),
        ];
        if c.act == Act::SwiGlu {
            attrs.extend([
                attr::int("swiglu_fusion", 1),
                attr::float("swiglu_limit", 0.9),
                attr::float("activation_alpha", 1.702),
                attr::float("activation_beta", 1.0),
            ]);
        }
        let op = if let Some((bits, block, _)) = c.quant {
            attrs.push(attr::int("expert_weight_bits", bits as i64));
            if block > 0 {
                attrs.push(attr::int("block_size", block as i64));
            }
            // (input, router, fc1 w, s, b, fc2 w, s, b) -> QMoE's slots 0-7, then 8-10 empty,
            // zero points at 11 and 12, router_weights at 14.
            ins.resize(11, String::new());
            ins.extend(zps.iter().cloned());
            ins.resize(13, String::new());
            if c.router_weights {
                ins.push(String::new());
                let rw: Vec<f32> = rng.values(t * e, 1.0).iter().map(|v| v.abs()).collect();
                ins.push(self.feed(
                    p("router_weights"),
                    Tensor::from_slice([t, e], &rw).unwrap(),
                ));
            }
            "QMoE"
        } else {
            "MoE"
        };
        while ins.last().is_some_and(String::is_empty) {
            ins.pop();
        }
        let ins: Vec<&str> = ins.iter().map(String::as_str).collect();
        let out = p("out");
        self.builder
            .node(op, "com.microsoft", &p("moe"), &ins, &[&out], attrs);
        self.builder.output(&out, DType::F32, &[]);
        self.outputs.push(out);
    }
}

fn cases() -> Vec<Case> {
    let base = Case {
        experts: 4,
        k: 2,
        hidden: 32,
        inter: 32,
        tokens: 5,
        act: Act::SwiGlu,
        normalize: true,
        bias: true,
        quant: None,
        router_weights: false,
        three_d: false,
    };
    let mut cases = vec![
        base,
        Case {
            normalize: false,
            act: Act::Silu,
            k: 3,
            three_d: true,
            ..base
        },
        Case {
            act: Act::Gelu,
            bias: false,
            k: 1,
            ..base
        },
        Case {
            act: Act::Relu,
            experts: 8,
            k: 8,
            ..base
        },
        Case {
            act: Act::Identity,
            normalize: false,
            ..base
        },
        // 128 experts, 4 per token.
        Case {
            experts: 128,
            k: 4,
            hidden: 16,
            inter: 16,
            tokens: 9,
            ..base
        },
    ];
    // QMoE: 4 and 8 bits, per row and per block, zero points, router weights.
    for (n, quant) in [
        (4, 16, false),
        (4, 32, true),
        (8, 16, true),
        (8, 0, false),
        (4, 0, false),
    ]
    .into_iter()
    .enumerate()
    {
        cases.push(Case {
            quant: Some(quant),
            act: [Act::SwiGlu, Act::Silu, Act::SwiGlu, Act::Gelu, Act::Relu][n],
            normalize: n % 2 == 0,
            k: 1 + n % 3,
            hidden: 64,
            inter: if quant.1 == 0 { 32 } else { 64 },
            ..base
        });
    }
    cases.push(Case {
        quant: Some((4, 16, false)),
        router_weights: true,
        normalize: true,
        ..base
    });
    cases.push(Case {
        quant: Some((8, 32, false)),
        router_weights: true,
        normalize: false,
        k: 3,
        three_d: true,
        ..base
    });
    cases
}

#[test]
fn moe_and_qmoe_match_onnxruntime() {
    let mut suite = Suite {
        builder: ModelBuilder::new("oxgen-moe-test"),
        feeds: Vec::new(),
        outputs: Vec::new(),
    };
    suite.builder.opset("", 21);
    suite.builder.opset("com.microsoft", 1);
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let cases = cases();
    for (id, c) in cases.iter().enumerate() {
        suite.add(id, c, &mut rng);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("moe.onnx");
    suite.builder.save(&path, None).unwrap();
    let ort = ort_oracle::run(&path, &suite.feeds).unwrap();
    let ours = native_session(&path)
        .unwrap()
        .run(suite.feeds.clone())
        .unwrap();
    let mut worst = 0f64;
    for ((c, (name, a)), e) in cases.iter().zip(&ours).zip(&ort) {
        assert_eq!(a.dims(), e.dims(), "{name}: shape");
        let (a, e) = (a.as_slice::<f32>().unwrap(), e.as_slice::<f32>().unwrap());
        for (i, (&x, &y)) in a.iter().zip(e).enumerate() {
            let d = (x as f64 - y as f64).abs();
            worst = worst.max(d);
            assert!(
                d <= 2e-5 + 2e-5 * (y as f64).abs(),
                "{name}[{i}]: {x} vs onnxruntime {y} ({c:?})"
            );
        }
        // Something was computed: not every output is zero.
        assert!(e.iter().any(|&v| v != 0.0), "{name}: all zero ({c:?})");
    }
    println!(
        "MoE/QMoE: {} cases, max |native - onnxruntime| {worst:e}",
        cases.len()
    );
}

/// What the native backend refuses names the node and the way out.
#[test]
fn unsupported_moe_forms_fail_at_load_naming_the_node() {
    let dir = tempfile::tempdir().unwrap();
    for (op, extra_inputs, attrs, needle) in [
        (
            "MoE",
            7,
            vec![
                attr::string("activation_type", "swiglu"),
                attr::int("swiglu_fusion", 1),
            ],
            "fc3",
        ),
        (
            "MoE",
            6,
            vec![
                attr::string("activation_type", "swiglu"),
                attr::int("swiglu_fusion", 2),
            ],
            "swiglu_fusion",
        ),
        (
            "MoE",
            6,
            vec![attr::int("use_sparse_mixer", 1)],
            "use_sparse_mixer",
        ),
        (
            "MoE",
            6,
            vec![attr::string("activation_type", "softplus")],
            "softplus",
        ),
        (
            "QMoE",
            8,
            vec![attr::int("expert_weight_bits", 2)],
            "expert_weight_bits",
        ),
        (
            "QMoE",
            8,
            vec![attr::string("quant_type", "mxfp4")],
            "quant_type",
        ),
        ("QMoE", 16, vec![], "fc1_global_scale"),
        ("QMoE", 8, vec![attr::int("block_size", 24)], "block_size"),
    ] {
        let mut b = ModelBuilder::new("t");
        b.opset("", 21);
        b.opset("com.microsoft", 1);
        // Inputs 0..n, but QMoE's 8..=14 stay empty past 8 (so only the last one counts).
        let names: Vec<String> = (0..extra_inputs)
            .map(|i| {
                if op == "QMoE" && (8..15).contains(&i) {
                    String::new()
                } else {
                    format!("in{i}")
                }
            })
            .collect();
        for n in names.iter().filter(|n| !n.is_empty()) {
            b.input(n, DType::F32, &[]);
        }
        let ins: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut all = vec![attr::int("k", 1)];
        all.extend(attrs);
        b.node(op, "com.microsoft", "the_moe", &ins, &["y"], all);
        b.output("y", DType::F32, &[]);
        let path = dir.path().join("m.onnx");
        b.save(&path, None).unwrap();
        let err = match native_session(&path) {
            Ok(_) => panic!("{op} with {needle} loaded"),
            Err(e) => e,
        };
        assert!(
            err.contains("the_moe") && err.contains(needle),
            "{op} / {needle}: {err}"
        );
    }
}
