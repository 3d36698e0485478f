use super::*;

use crate::rng::Rng;

#[test]
fn softmax_routing_ranks_by_probability_and_breaks_ties_by_the_higher_index() {
    let logits = [0.5, 2.0, -1.0, 2.0, 1.0];
    let (mut e, mut w) = ([0u32; 3], [0f32; 3]);
    route(
        &logits,
        None,
        3,
        Routing::SoftmaxTopK { normalize: false },
        &mut e,
        &mut w,
    );
    // Experts 1 and 3 tie: the higher index ranks first.
    assert_eq!(e, [3, 1, 4]);
    let sum: f64 = logits.iter().map(|&l| ((l - 2.0) as f64).exp()).sum();
    for (&j, &w) in e.iter().zip(&w) {
        let want = ((logits[j as usize] - 2.0) as f64).exp() / sum;
        assert!((w as f64 - want).abs() < 1e-6, "{j}: {w} vs {want}");
    }
    route(
        &logits,
        None,
        3,
        Routing::SoftmaxTopK { normalize: true },
        &mut e,
        &mut w,
    );
    assert!((w.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    assert!(w[0] == w[1] && w[1] > w[2]);
}

#[test]
fn qmoe_routing_is_a_softmax_over_the_top_logits_and_drops_tiny_weights() {
    let logits = [0.0, 3.0, -30.0, 1.0];
    let (mut e, mut w) = ([0u32; 3], [0f32; 3]);
    route(&logits, None, 3, Routing::TopKSoftmax, &mut e, &mut w);
    assert_eq!(e, [1, 3, 0]);
    let z = 1.0 + (-2f64).exp() + (-3f64).exp();
    for (got, want) in w
        .iter()
        .zip([1.0 / z, (-2f64).exp() / z, (-3f64).exp() / z])
    {
        assert!((*got as f64 - want).abs() < 1e-6);
    }
    // Given weights weigh the experts the logits picked; a zero one is dropped.
    let given = [0.25, 0.5, 9.0, 0.0];
    route(
        &logits,
        Some(&given),
        3,
        Routing::Given { normalize: true },
        &mut e,
        &mut w,
    );
    assert_eq!(e, [1, u32::MAX, 0]);
    assert_eq!(w, [0.5 / 0.75, 0.0, 0.25 / 0.75]);
}

#[test]
fn nan_logits_route_without_panicking() {
    let (mut e, mut w) = ([0u32; 2], [0f32; 2]);
    for routing in [
        Routing::SoftmaxTopK { normalize: true },
        Routing::TopKSoftmax,
    ] {
        route(&[f32::NAN, 1.0, 0.0], None, 2, routing, &mut e, &mut w);
    }
}

/// One expert's weights as f64 rows `[n][k]`, whatever they are stored as.
fn dense(p: &Projection, e: usize) -> Vec<Vec<f64>> {
    let (n, k) = (p.n, p.k);
    match p.weights {
        ExpertMatrix::F32(w) => (0..n)
            .map(|j| (0..k).map(|c| w[(e * n + j) * k + c] as f64).collect())
            .collect(),
        ExpertMatrix::Quant {
            layout,
            data,
            scales,
            zero_points,
            ..
        } => {
            let bits = layout.bits as usize;
            let per_byte = 8 / bits;
            (0..n)
                .map(|j| {
                    let row = e * n + j;
                    (0..k)
                        .map(|c| {
                            let b = c / layout.block_size;
                            let byte = data[(row * layout.k_blocks + b) * layout.blob_size
                                + (c % layout.block_size) / per_byte];
                            let q = (byte >> ((c % per_byte) * bits)) & ((1 << bits) - 1) as u8;
                            let zp = zero_points.map_or(1 << (bits - 1), |z| {
                                let zb = z[row * layout.zp_row_bytes + b / per_byte];
                                (zb >> ((b % per_byte) * bits)) & ((1 << bits) - 1) as u8
                            });
                            let scale = scales[row * layout.k_blocks + b];
                            // As the kernels do: the weight rounds to f32 once.
                            ((q as f32 - zp as f32) * scale) as f64
                        })
                        .collect()
                })
                .collect()
        }
        ExpertMatrix::Mxfp4 { codes, scales, .. } => (0..n)
            .map(|j| {
                (0..k)
                    .map(|c| {
                        let byte = codes[(e * k + c) * (n / 2) + j / 2];
                        let code = (byte >> ((j % 2) * 4)) & 0xF;
                        let scale = scales[(e * n + j) * (k / 32) + c / 32];
                        crate::mxfp4::E2M1[code as usize] as f64 * crate::mxfp4::e8m0(scale) as f64
                    })
                    .collect()
            })
            .collect(),
    }
}

fn act64(a: &Activation, h: &[f64]) -> Vec<f64> {
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    match *a {
        Activation::Relu => h.iter().map(|&v| v.max(0.0)).collect(),
        Activation::Gelu => h
            .iter()
            .map(|&v| {
                0.5 * v
                    * (1.0
                        + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh())
            })
            .collect(),
        Activation::Silu => h.iter().map(|&v| v * sig(v)).collect(),
        Activation::Identity => h.to_vec(),
        Activation::SwiGlu { alpha, beta, limit } => h
            .chunks(2)
            .map(|p| {
                let (l, lim) = (p[1], limit as f64);
                let g = p[0].min(lim);
                g * sig(alpha as f64 * g) * (l.clamp(-lim, lim) + beta as f64)
            })
            .collect(),
    }
}

/// The straightforward computation in f64: each token, each of its routes, both products.
fn naive(x: &[f32], logits: &[f32], k: usize, routing: Routing, ex: &Experts) -> Vec<f64> {
    let (hidden, count) = (ex.fc1.k, ex.count);
    let mut out = vec![0f64; x.len()];
    for (t, o) in out.chunks_mut(hidden).enumerate() {
        let (mut e, mut w) = (vec![0u32; k], vec![0f32; k]);
        route(
            &logits[t * count..][..count],
            None,
            k,
            routing,
            &mut e,
            &mut w,
        );
        for (&e, &w) in e.iter().zip(&w) {
            if e == u32::MAX {
                continue;
            }
            let e = e as usize;
            let project = |p: &Projection, v: &[f64]| -> Vec<f64> {
                dense(p, e)
                    .iter()
                    .enumerate()
                    .map(|(j, row)| {
                        row.iter().zip(v).map(|(a, b)| a * b).sum::<f64>()
                            + p.bias.map_or(0.0, |b| b[e * p.n + j] as f64)
                    })
                    .collect()
            };
            let xv: Vec<f64> = x[t * hidden..][..hidden]
                .iter()
                .map(|&v| v as f64)
                .collect();
            let y = project(&ex.fc2, &act64(&ex.activation, &project(&ex.fc1, &xv)));
            for (o, y) in o.iter_mut().zip(y) {
                *o += w as f64 * y;
            }
        }
    }
    out
}

fn run(
    x: &[f32],
    logits: &[f32],
    k: usize,
    routing: Routing,
    ex: &Experts,
    threads: usize,
) -> (Vec<f32>, MoeStats) {
    let tokens = x.len() / ex.fc1.k;
    let pool = ThreadPool::new(threads);
    let (nv, ni) = scratch_len(tokens, k, ex);
    let (mut values, mut indices) = (vec![f32::NAN; nv], vec![7u32; ni]);
    let mut out = vec![f32::NAN; x.len()];
    let stats = moe(
        x,
        Router {
            tokens,
            logits,
            given: None,
            k,
            routing,
        },
        ex,
        &mut out,
        (&mut values, &mut indices),
        &pool,
        &mut |_| {},
    )
    .unwrap();
    (out, stats)
}

/// Owned weights for one projection.
enum Stored {
    F32(Vec<f32>),
    Mxfp4 {
        codes: Vec<u8>,
        scales: Vec<u8>,
    },
    Quant {
        layout: NBitsLayout,
        data: Vec<u8>,
        scales: Vec<f32>,
        zero_points: Option<Vec<u8>>,
    },
}

impl Stored {
    /// `quant`: `(bits, block, zero points)`, or bits 0 for MXFP4.
    fn new(
        rng: &mut Rng,
        count: usize,
        n: usize,
        k: usize,
        quant: Option<(u32, usize, bool)>,
    ) -> Stored {
        match quant {
            None => Stored::F32(rng.values(count * n * k, 0.5)),
            Some((0, _, _)) => Stored::Mxfp4 {
                codes: rng.bytes(count * k * n / 2),
                // 2^-7 ..= 2^-4.
                scales: rng
                    .bytes(count * n * k / 32)
                    .iter()
                    .map(|b| 120 + b % 4)
                    .collect(),
            },
            Some((bits, block, zp)) => {
                let layout = NBitsLayout::new(n, k, bits, block).unwrap();
                let blocks = count * n * layout.k_blocks;
                Stored::Quant {
                    layout,
                    data: rng.bytes(blocks * layout.blob_size),
                    scales: rng.floats(blocks, 0.02, 0.04),
                    zero_points: zp.then(|| rng.bytes(count * n * layout.zp_row_bytes)),
                }
            }
        }
    }

    fn view(&self, int8: bool) -> ExpertMatrix<'_> {
        match self {
            Stored::F32(w) => ExpertMatrix::F32(w),
            Stored::Mxfp4 { codes, scales } => ExpertMatrix::Mxfp4 {
                codes,
                scales,
                int8,
                packed: None,
            },
            Stored::Quant {
                layout,
                data,
                scales,
                zero_points,
            } => ExpertMatrix::Quant {
                layout: *layout,
                data,
                scales,
                zero_points: zero_points.as_deref(),
                int8,
                interleaved: None,
            },
        }
    }
}

#[test]
fn experts_match_an_f64_reference_and_a_token_gets_the_same_bits_in_any_batch() {
    let mut rng = Rng::new(0x0123_4567_89ab_cdef);
    let swiglu = Activation::SwiGlu {
        alpha: 1.702,
        beta: 1.0,
        limit: 7.0,
    };
    let (hidden, inter, count, tokens) = (32, 48, 6, 7);
    for (activation, quant, k, routing) in [
        (swiglu, None, 2, Routing::SoftmaxTopK { normalize: true }),
        (
            Activation::Silu,
            None,
            3,
            Routing::SoftmaxTopK { normalize: false },
        ),
        (
            Activation::Gelu,
            Some((4, 16, false)),
            2,
            Routing::TopKSoftmax,
        ),
        (swiglu, Some((4, 32, true)), 4, Routing::TopKSoftmax),
        (
            Activation::Relu,
            Some((8, 16, true)),
            1,
            Routing::TopKSoftmax,
        ),
        (
            Activation::Identity,
            Some((8, 32, false)),
            6,
            Routing::SoftmaxTopK { normalize: true },
        ),
        // MXFP4, whose inputs come in whole blocks of 32.
        (swiglu, Some((0, 32, false)), 2, Routing::TopKSoftmax),
    ] {
        let inter = if quant.is_some_and(|q| q.0 == 0) {
            64
        } else {
            inter
        };
        let f = activation.fc1_factor();
        let w1 = Stored::new(&mut rng, count, inter * f, hidden, quant);
        let w2 = Stored::new(&mut rng, count, hidden, inter, quant);
        let (b1, b2) = (
            rng.values(count * inter * f, 1.0),
            rng.values(count * hidden, 1.0),
        );
        let x = rng.values(tokens * hidden, 1.0);
        let logits = rng.values(tokens * count, 3.0);
        let what = format!("{activation:?} {quant:?} k {k} {routing:?}");
        for int8 in [false, true] {
            if quant.is_none() && int8 {
                continue;
            }
            let ex = Experts {
                count,
                fc1: Projection {
                    n: inter * f,
                    k: hidden,
                    weights: w1.view(int8),
                    bias: Some(&b1),
                },
                fc2: Projection {
                    n: hidden,
                    k: inter,
                    weights: w2.view(int8),
                    bias: Some(&b2),
                },
                activation,
            };
            let (out, stats) = run(&x, &logits, k, routing, &ex, 1);
            if !int8 {
                let want = naive(&x, &logits, k, routing, &ex);
                for (i, (&g, &w)) in out.iter().zip(&want).enumerate() {
                    assert!(
                        (g as f64 - w).abs() <= 1e-4 + 1e-4 * w.abs(),
                        "{what}: out[{i}] = {g}, want {w}"
                    );
                }
            }
            assert!(
                stats.experts <= count && stats.routes <= tokens * k,
                "{stats:?}"
            );
            assert_eq!(stats.bytes, stats.experts * ex.expert_bytes());
            // Each token alone, and the batch on three threads: the same bits.
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&run(&x, &logits, k, routing, &ex, 3).0),
                bits(&out),
                "{what} int8 {int8}"
            );
            for t in 0..tokens {
                let (one, _) = run(
                    &x[t * hidden..][..hidden],
                    &logits[t * count..][..count],
                    k,
                    routing,
                    &ex,
                    2,
                );
                assert_eq!(
                    bits(&one),
                    bits(&out[t * hidden..][..hidden]),
                    "{what} int8 {int8} token {t}"
                );
            }
            // Integer experts with f32 activations interleaved at load, MXFP4 experts with
            // int8 activations in tiles: the same bits.
            let packed = (ex.fc1.repack(count).unwrap()).zip(ex.fc2.repack(count).unwrap());
            let (integer, mxfp4) = (
                quant.is_some_and(|q| q.0 != 0),
                quant.is_some_and(|q| q.0 == 0),
            );
            assert_eq!(
                packed.is_some(),
                (integer && !int8 && crate::cpu::level() >= crate::cpu::Level::Avx2)
                    || (mxfp4 && int8),
                "{what} int8 {int8}"
            );
            if let Some((p1, p2)) = &packed {
                let repacked = Experts {
                    fc1: Projection {
                        weights: ex.fc1.weights.with_repacked(p1),
                        ..ex.fc1
                    },
                    fc2: Projection {
                        weights: ex.fc2.weights.with_repacked(p2),
                        ..ex.fc2
                    },
                    ..ex
                };
                assert_eq!(
                    bits(&run(&x, &logits, k, routing, &repacked, 2).0),
                    bits(&out),
                    "{what} int8 {int8} repacked"
                );
            }
        }
    }
}

#[test]
fn bad_shapes_are_errors() {
    let w = vec![0f32; 2 * 8 * 4];
    let ex = Experts {
        count: 2,
        fc1: Projection {
            n: 8,
            k: 4,
            weights: ExpertMatrix::F32(&w),
            bias: None,
        },
        fc2: Projection {
            n: 4,
            k: 8,
            weights: ExpertMatrix::F32(&w),
            bias: None,
        },
        activation: Activation::Relu,
    };
    let pool = ThreadPool::new(1);
    let (nv, ni) = scratch_len(1, 1, &ex);
    let (mut v, mut i) = (vec![0f32; nv], vec![0u32; ni]);
    let mut out = vec![0f32; 4];
    let mut call = |x: &[f32], logits: &[f32], k: usize, out: &mut [f32]| {
        moe(
            x,
            Router {
                tokens: 1,
                logits,
                given: None,
                k,
                routing: Routing::TopKSoftmax,
            },
            &ex,
            out,
            (&mut v, &mut i),
            &pool,
            &mut |_| {},
        )
    };
    assert!(call(&[0.0; 4], &[0.0; 2], 1, &mut out).is_ok());
    assert!(call(&[0.0; 3], &[0.0; 2], 1, &mut out).is_err());
    assert!(call(&[0.0; 4], &[0.0; 3], 1, &mut out).is_err());
    assert!(call(&[0.0; 4], &[0.0; 2], 3, &mut out).is_err());
    assert!(call(&[0.0; 4], &[0.0; 2], 0, &mut out).is_err());
    let short = vec![0f32; 5];
    let bad = Experts {
        fc2: Projection {
            n: 4,
            k: 8,
            weights: ExpertMatrix::F32(&short),
            bias: None,
        },
        ..ex
    };
    let mut scratch = (vec![0f32; nv], vec![0u32; ni]);
    assert!(
        moe(
            &[0.0; 4],
            Router {
                tokens: 1,
                logits: &[0.0; 2],
                given: None,
                k: 1,
                routing: Routing::TopKSoftmax,
            },
            &bad,
            &mut out,
            (&mut scratch.0, &mut scratch.1),
            &pool,
            &mut |_| {}
        )
        .is_err()
    );
}
