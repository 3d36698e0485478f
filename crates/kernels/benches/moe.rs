//! Mixture-of-experts kernels at gpt-oss-like widths (hidden and expert width 1024 here, so
//! 32 experts' 4-bit weights, 50 MB, exceed the L3 cache of a laptop but not a server's), on
//! the kernels models run, at 1 and 2 threads:
//!
//! - `moe/route/E=e,k=k`: 64 tokens' routing (top-k of the logits, softmax over them);
//!   elements are tokens;
//! - `moe/experts/k=4 of 32/FORM/tokens=T/threads=N`: a whole MoE layer
//!   (routing, each routed expert's two projections and SwiGLU, the weighted sum) for `T`
//!   tokens whose routes are spread over the experts; throughput in weight bytes the routed
//!   experts stream (`MoeStats::bytes`); `int4` is QMoE's integer form in f32 (the
//!   `MatMulNBits` reference arithmetic: what onnxruntime computes for it), `int4-int8` with
//!   int8 activations (`accuracy_level` 4), `int4-interleaved` in f32 on the experts
//!   interleaved at load; `mxfp4` the MXFP4 codes as stored in f32 (exact), `mxfp4-int8` with
//!   int8 activations gathering the tiles from the stored codes (a weight budget's path),
//!   `mxfp4-int8-packed` on the tiles packed at load;
//! - `mxfp4/gemv` and `mxfp4/gemm/8`: one expert's first projection (2048 x 1024) for 1 and
//!   8 rows (`mxfp4` exact, `mxfp4-int8-packed`), beside the int4 `MatMulNBits` kernels on the
//!   same shape (`nbits/...`, f32 and int8 activations); bytes of weights read.
//!
//! `cargo bench -p oxgen-kernels --bench moe` (add `-- --test` to run each once).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

mod common;
use oxgen_kernels::ThreadPool;
use oxgen_kernels::moe::{
    Activation, ExpertMatrix, Experts, Projection, Router, Routing, moe, route, scratch_len,
};
use oxgen_kernels::mxfp4::{Mxfp4Packed, Mxfp4Weights, matmul_mxfp4, matmul_mxfp4_int8};
use oxgen_kernels::nbits::{
    NBitsLayout, QuantWeights, ZeroPoints, matmul_nbits_f32, matmul_nbits_int8,
};
use oxgen_kernels::rng::Rng;

const HIDDEN: usize = 1024;
const INTER: usize = 1024;
const EXPERTS: usize = 32;
const K: usize = 4;
const SWIGLU: Activation = Activation::SwiGlu {
    alpha: 1.702,
    beta: 1.0,
    limit: 7.0,
};

fn bytes(len: usize, seed: u64) -> Vec<u8> {
    Rng::new(seed).bytes(len)
}

/// One projection's storage for every expert: 4-bit blocks of 32 or MXFP4.
struct Stored {
    n: usize,
    k: usize,
    codes: Vec<u8>,
    scales: Vec<f32>,
    e8m0: Vec<u8>,
}

impl Stored {
    fn new(experts: usize, n: usize, k: usize, seed: u64) -> Stored {
        Stored {
            n,
            k,
            codes: bytes(experts * n * k / 2, seed),
            scales: common::values::<f32>(experts * n * k / 32, seed)
                .iter()
                .map(|v| 0.01 + 0.01 * v.abs())
                .collect(),
            e8m0: bytes(experts * n * k / 32, seed + 1)
                .iter()
                .map(|b| 118 + b % 4)
                .collect(),
        }
    }

    fn projection<'a>(&'a self, form: &str, bias: &'a [f32]) -> Projection<'a> {
        let weights = if form.starts_with("mxfp4") {
            ExpertMatrix::Mxfp4 {
                codes: &self.codes,
                scales: &self.e8m0,
                int8: form.contains("int8"),
                packed: None,
            }
        } else {
            ExpertMatrix::Quant {
                layout: NBitsLayout::new(self.n, self.k, 4, 32).unwrap(),
                data: &self.codes,
                scales: &self.scales,
                zero_points: None,
                int8: form == "int4-int8",
                interleaved: None,
            }
        };
        Projection {
            n: self.n,
            k: self.k,
            weights,
            bias: Some(bias),
        }
    }
}

fn bench_route(c: &mut Criterion) {
    let mut g = common::group(c, "moe/route", 400);
    for (experts, k) in [(32, 4), (128, 4)] {
        let tokens = 64;
        let logits = common::values::<f32>(tokens * experts, 3);
        let (mut e, mut w) = (vec![0u32; k], vec![0f32; k]);
        g.throughput(Throughput::Elements(tokens as u64));
        g.bench_function(format!("E={experts},k={k}"), |b| {
            b.iter(|| {
                for t in logits.chunks_exact(experts) {
                    route(black_box(t), None, k, Routing::TopKSoftmax, &mut e, &mut w);
                }
            })
        });
    }
    g.finish();
}

fn bench_experts(c: &mut Criterion) {
    let fc1 = Stored::new(EXPERTS, 2 * INTER, HIDDEN, 1);
    let fc2 = Stored::new(EXPERTS, HIDDEN, INTER, 2);
    let (b1, b2) = (
        common::values::<f32>(EXPERTS * 2 * INTER, 4),
        common::values::<f32>(EXPERTS * HIDDEN, 5),
    );
    let mut g = common::group(c, "moe/experts/k=4 of 32", 1500);
    // Forms as stored, and repacked at load as a session without a weight budget runs them:
    // the int4 experts interleaved for f32 activations, the MXFP4 ones in the int8 kernel's
    // tiles.
    let repack = |form| {
        let repack = |p: Projection<'_>| p.repack(EXPERTS).unwrap();
        repack(fc1.projection(form, &b1)).zip(repack(fc2.projection(form, &b2)))
    };
    let (interleaved, tiles) = (repack("int4"), repack("mxfp4-int8"));
    for form in [
        "int4",
        "int4-interleaved",
        "int4-int8",
        "mxfp4",
        "mxfp4-int8",
        "mxfp4-int8-packed",
    ] {
        let (mut p1, mut p2) = (fc1.projection(form, &b1), fc2.projection(form, &b2));
        let repacked = match form {
            "int4-interleaved" => Some(&interleaved),
            "mxfp4-int8-packed" => Some(&tiles),
            _ => None,
        };
        if let Some(repacked) = repacked {
            let Some((r1, r2)) = repacked else {
                continue;
            };
            (p1.weights, p2.weights) = (p1.weights.with_repacked(r1), p2.weights.with_repacked(r2));
        }
        let experts = Experts {
            count: EXPERTS,
            fc1: p1,
            fc2: p2,
            activation: SWIGLU,
        };
        for tokens in [1, 8] {
            let x = common::values::<f32>(tokens * HIDDEN, 6);
            let logits = common::values::<f32>(tokens * EXPERTS, 7 + tokens as u64);
            let (nv, ni) = scratch_len(tokens, K, &experts);
            let (mut values, mut indices) = (vec![0f32; nv], vec![0u32; ni]);
            let mut out = vec![0f32; tokens * HIDDEN];
            for threads in [1, 2] {
                let pool = ThreadPool::new(threads);
                let mut run = || {
                    moe(
                        black_box(&x),
                        Router {
                            tokens,
                            logits: &logits,
                            given: None,
                            k: K,
                            routing: Routing::TopKSoftmax,
                        },
                        &experts,
                        &mut out,
                        (&mut values, &mut indices),
                        &pool,
                        &mut |_| {},
                    )
                    .unwrap()
                };
                g.throughput(Throughput::Bytes(run().bytes as u64));
                g.bench_function(format!("{form}/tokens={tokens}/threads={threads}"), |b| {
                    b.iter(&mut run)
                });
            }
        }
    }
    g.finish();
}

fn bench_matrix(c: &mut Criterion) {
    let (n, k) = (2 * INTER, HIDDEN);
    let w = Stored::new(1, n, k, 9);
    let mx = Mxfp4Weights {
        n,
        k,
        codes: &w.codes,
        scales: &w.e8m0,
    };
    let tiles = Mxfp4Packed::pack(&mx).unwrap();
    let q = QuantWeights {
        layout: NBitsLayout::new(n, k, 4, 32).unwrap(),
        data: &w.codes,
        scales: &w.scales,
        zero_points: ZeroPoints::Default,
    };
    for (name, rows) in [("gemv", 1), ("gemm/8", 8)] {
        let mut g = common::group(c, &format!("mxfp4/{name}"), 600);
        let a = common::values::<f32>(rows * k, 10);
        let mut out = vec![0f32; rows * n];
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            g.throughput(Throughput::Bytes(mx.bytes() as u64));
            g.bench_function(format!("mxfp4/threads={threads}"), |b| {
                b.iter(|| matmul_mxfp4(black_box(&a), rows, &mx, None, &mut out, &pool).unwrap())
            });
            g.bench_function(format!("mxfp4-int8-packed/threads={threads}"), |b| {
                b.iter(|| {
                    let a = black_box(&a);
                    matmul_mxfp4_int8(a, rows, &mx, Some(&tiles), None, &mut out, &pool).unwrap()
                })
            });
            g.throughput(Throughput::Bytes(
                (w.codes.len() + 4 * w.scales.len()) as u64,
            ));
            g.bench_function(format!("nbits-f32/threads={threads}"), |b| {
                b.iter(|| matmul_nbits_f32(black_box(&a), rows, &q, None, &mut out, &pool).unwrap())
            });
            g.bench_function(format!("nbits-int8/threads={threads}"), |b| {
                b.iter(|| {
                    matmul_nbits_int8(black_box(&a), rows, &q, None, &mut out, &pool).unwrap()
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench_route, bench_experts, bench_matrix);
criterion_main!(benches);
