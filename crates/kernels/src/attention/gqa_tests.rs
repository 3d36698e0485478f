//! Tests of the attention kernel: against an f64 reference, and the reduction contract
//! (prefill = decode steps, any thread count, bit for bit).

use half::f16;

use super::*;
use crate::attention::{append_kv, copy_prefix};
use crate::rng::Rng;
use crate::rotary::Rope;

/// Runs [`attention`] with query rows `(batch, seq, heads * head_size)`.
fn run(
    shape: &GqaShape,
    score: &ScoreMod,
    (q, k, v): (&[f32], &[f32], &[f32]),
    start: &[usize],
    kv_len: &[usize],
    threads: usize,
) -> Vec<f32> {
    let pool = ThreadPool::new(threads);
    let mut out = vec![f32::NAN; shape.batch * shape.heads * shape.seq * shape.head_size];
    let mut scratch = vec![0f32; scratch_len(shape, &pool)];
    let rows = Rows {
        data: q,
        stride: shape.heads * shape.head_size,
        offset: 0,
    };
    attention(
        shape,
        score,
        GqaInputs {
            q: rows,
            k,
            v,
            start,
            kv_len,
        },
        &mut out,
        &mut scratch,
        &pool,
    )
    .unwrap();
    out
}

/// Straightforward f64 attention for one (batch, head, row).
fn reference_row(
    shape: &GqaShape,
    score: &ScoreMod,
    (q, k, v): (&[f32], &[f32], &[f32]),
    (b, n, s): (usize, usize, usize),
    start: usize,
    kv_len: usize,
) -> Vec<f64> {
    let hs = shape.head_size;
    let kvh = n / (shape.heads / shape.kv_heads);
    let p = start + s;
    let lo = score.window.map_or(0, |w| (p + 1).saturating_sub(w));
    let end = kv_len.min(p + 1);
    let qv = &q[((b * shape.seq + s) * shape.heads + n) * hs..][..hs];
    let at = |c: &[f32], j: usize, d: usize| {
        c[((b * shape.kv_heads + kvh) * shape.capacity + j) * hs + d] as f64
    };
    let xs: Vec<f64> = (lo..end)
        .map(|j| {
            let x = (0..hs).map(|d| qv[d] as f64 * at(k, j, d)).sum::<f64>() * score.scale as f64;
            if score.softcap > 0.0 {
                let c = score.softcap as f64;
                c * (x / c).tanh()
            } else {
                x
            }
        })
        .collect();
    let sink = score.sinks.map(|s| s[n] as f64);
    let m = xs
        .iter()
        .chain(&sink)
        .cloned()
        .fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = xs.iter().map(|x| (x - m).exp()).collect();
    let sum: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - m).exp());
    (0..hs)
        .map(|d| (lo..end).zip(&e).map(|(j, w)| w / sum * at(v, j, d)).sum())
        .collect()
}

#[test]
fn matches_an_f64_reference_with_windows_softcap_sinks_and_groups() {
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    // Sinks around the scores' range: below, among and above them (the last rules the max).
    let sinks = [-3.0, 0.4, -0.2, 1.0, 0.1, 6.0];
    for (heads, kv_heads, window, softcap, sinks) in [
        (2, 2, None, 0.0, None),
        (4, 2, Some(3), 0.0, None),
        (6, 2, None, 1.5, None),
        (3, 1, Some(1), 2.0, None),
        (2, 1, Some(0), 0.0, None),
        (6, 2, None, 0.0, Some(&sinks[..])),
        (4, 2, Some(3), 1.5, Some(&sinks[2..])),
    ] {
        let shape = GqaShape {
            batch: 2,
            seq: 5,
            heads,
            kv_heads,
            head_size: 16,
            capacity: 12,
        };
        let score = ScoreMod {
            scale: 0.25,
            softcap,
            window,
            sinks,
        };
        let q = rng.values(2 * 5 * heads * 16, 1.0);
        let (k, v) = (
            rng.values(shape.cache_len(), 1.0),
            rng.values(shape.cache_len(), 1.0),
        );
        // Entry 0 continues after 4 cached positions; entry 1 is a padded first prompt.
        let (start, kv_len) = ([4, 0], [9, 3]);
        let out = run(&shape, &score, (&q, &k, &v), &start, &kv_len, 1);
        for b in 0..2 {
            for n in 0..heads {
                for s in 0..5 {
                    let want =
                        reference_row(&shape, &score, (&q, &k, &v), (b, n, s), start[b], kv_len[b]);
                    let got = &out[((b * heads + n) * 5 + s) * 16..][..16];
                    for (g, w) in got.iter().zip(&want) {
                        assert!(
                            (*g as f64 - w).abs() < 1e-5,
                            "{heads}/{kv_heads} {window:?} b{b} n{n} s{s}: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }
}

/// Rows whose keys span several tiles (`KV_TILE` positions; a window starting inside one,
/// sinks, softcap): each tile's softmax folded into the next still matches the f64 one.
#[test]
fn rows_over_several_tiles_match_the_f64_reference() {
    use crate::attention::group::KV_TILE;
    let mut rng = Rng::new(0x51ed_270b);
    let sinks = [0.3, 9.0, -2.0, 0.0, 1.0, -0.5];
    let len = 2 * KV_TILE + 60;
    for (window, softcap, sinks) in [
        (None, 0.0, None),
        (Some(KV_TILE + 40), 0.0, Some(&sinks[..])),
        (None, 3.0, Some(&sinks[..])),
        (Some(KV_TILE + 1), 1.5, None),
    ] {
        let shape = GqaShape {
            batch: 1,
            seq: 3,
            heads: 6,
            kv_heads: 2,
            head_size: 16,
            capacity: len,
        };
        // Scores up to about ±3, so tiles' maxima differ and the fold rescales.
        let score = ScoreMod {
            scale: 0.7,
            softcap,
            window,
            sinks,
        };
        let q = rng.values(3 * 6 * 16, 1.0);
        let (k, v) = (
            rng.values(shape.cache_len(), 1.0),
            rng.values(shape.cache_len(), 1.0),
        );
        let out = run(&shape, &score, (&q, &k, &v), &[len - 3], &[len], 2);
        for n in 0..6 {
            for s in 0..3 {
                let want = reference_row(&shape, &score, (&q, &k, &v), (0, n, s), len - 3, len);
                let got = &out[(n * 3 + s) * 16..][..16];
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (*g as f64 - w).abs() < 1e-5,
                        "{window:?} softcap {softcap} n{n} s{s}: {g} vs {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn prefill_equals_decode_steps_bit_for_bit() {
    // 7 prompt tokens in one call vs 7 calls of one token with a growing past, over a cache
    // that already holds 3 earlier positions; with and without a window and softcap.
    let mut rng = Rng::new(42);
    let shape = GqaShape {
        batch: 1,
        seq: 7,
        heads: 4,
        kv_heads: 2,
        head_size: 64,
        capacity: 16,
    };
    let q = rng.values(7 * 4 * 64, 1.0);
    let (k, v) = (
        rng.values(shape.cache_len(), 1.0),
        rng.values(shape.cache_len(), 1.0),
    );
    for score in [
        ScoreMod {
            scale: 0.125,
            softcap: 0.0,
            window: None,
            sinks: None,
        },
        ScoreMod {
            scale: 0.125,
            softcap: 30.0,
            window: Some(4),
            sinks: None,
        },
    ] {
        let prefill = run(&shape, &score, (&q, &k, &v), &[3], &[10], 1);
        let one = GqaShape { seq: 1, ..shape };
        for t in 0..7 {
            let row = &q[t * 4 * 64..][..4 * 64];
            let step = run(&one, &score, (row, &k, &v), &[3 + t], &[4 + t], 1);
            for n in 0..4 {
                let a = &prefill[(n * 7 + t) * 64..][..64];
                let b = &step[n * 64..][..64];
                assert!(
                    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "token {t} head {n} {score:?}"
                );
            }
        }
    }
}

#[test]
fn one_and_three_threads_agree_bit_for_bit() {
    let mut rng = Rng::new(7);
    // 2 * 6 heads of 16 rows x 64 positions x 32: enough work to split across threads.
    let shape = GqaShape {
        batch: 2,
        seq: 16,
        heads: 6,
        kv_heads: 3,
        head_size: 32,
        capacity: 64,
    };
    let score = ScoreMod {
        scale: 0.2,
        softcap: 0.0,
        window: Some(20),
        sinks: None,
    };
    let q = rng.values(2 * 16 * 6 * 32, 1.0);
    let (k, v) = (
        rng.values(shape.cache_len(), 1.0),
        rng.values(shape.cache_len(), 1.0),
    );
    assert!(
        parts(&shape, &ThreadPool::new(3)) > 1,
        "the case must actually run in parallel"
    );
    let a = run(&shape, &score, (&q, &k, &v), &[40, 10], &[56, 26], 1);
    let b = run(&shape, &score, (&q, &k, &v), &[40, 10], &[56, 26], 3);
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    assert!(a.iter().all(|x| x.is_finite()));
}

#[test]
fn cache_updates_concatenate_and_rotate() {
    let shape = GqaShape {
        batch: 2,
        seq: 2,
        heads: 2,
        kv_heads: 1,
        head_size: 4,
        capacity: 5,
    };
    let past: Vec<f32> = (0..2 * 3 * 4).map(|i| i as f32).collect();
    let mut cache = vec![0f32; shape.cache_len()];
    copy_prefix(&past, 3, &mut cache, &shape, &[3, 1]).unwrap();
    assert_eq!(&cache[..12], &past[..12]);
    assert_eq!(&cache[20..24], &past[12..16]);
    assert!(cache[24..].iter().all(|&x| x == 0.0));
    let new: Vec<f32> = (100..116).map(|i| i as f32).collect();
    let src = Rows {
        data: &new,
        stride: 4,
        offset: 0,
    };
    append_kv(&src, &shape, &[3, 1], None, &mut cache).unwrap();
    assert_eq!(&cache[12..20], &new[..8]);
    assert_eq!(&cache[24..32], &new[8..]);
    // A 180° rotation at position 3 (cache row 3) negates the rotated pair (x0, x1) only.
    let (cos, sin) = ([1f32, 1.0, 1.0, -1.0, 1.0], [0f32; 5]);
    let rope = Rope::new(&cos, &sin, 1, false).unwrap();
    append_kv(&src, &shape, &[3, 1], Some(&rope), &mut cache).unwrap();
    assert_eq!(&cache[12..16], &[-100.0, -101.0, 102.0, 103.0]);
    assert!(
        append_kv(&src, &shape, &[4, 1], None, &mut cache).is_err(),
        "rows past the capacity"
    );
    assert!(
        copy_prefix(&past, 3, &mut cache, &shape, &[4, 1]).is_err(),
        "more than the past holds"
    );
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    let shape = GqaShape {
        batch: 1,
        seq: 1,
        heads: 2,
        kv_heads: 1,
        head_size: 8,
        capacity: 4,
    };
    let score = ScoreMod {
        scale: 1.0,
        softcap: 0.0,
        window: None,
        sinks: None,
    };
    let pool = ThreadPool::new(1);
    let (q, kv) = (vec![0f32; 16], vec![0f32; 32]);
    let mut out = vec![0f32; 16];
    let mut scratch = vec![0f32; scratch_len(&shape, &pool)];
    let rows = Rows {
        data: &q,
        stride: 16,
        offset: 0,
    };
    let mut go = |shape: &GqaShape, rows: &Rows<f32>, kv_len: &[usize], scratch: &mut [f32]| {
        attention(
            shape,
            &score,
            GqaInputs {
                q: *rows,
                k: &kv,
                v: &kv,
                start: &[0],
                kv_len,
            },
            &mut out,
            scratch,
            &pool,
        )
    };
    assert!(go(&shape, &rows, &[1], &mut scratch).is_ok());
    assert!(
        go(&shape, &rows, &[5], &mut scratch).is_err(),
        "kv_len beyond the capacity"
    );
    assert!(
        go(&shape, &Rows { offset: 1, ..rows }, &[1], &mut scratch).is_err(),
        "query overrun"
    );
    assert!(
        go(
            &GqaShape {
                kv_heads: 3,
                ..shape
            },
            &rows,
            &[1],
            &mut scratch
        )
        .is_err(),
        "heads % kv_heads"
    );
    assert!(
        go(&shape, &rows, &[1], &mut []).is_err(),
        "scratch too small"
    );
}

#[test]
fn halves_compute_in_f32() {
    let mut rng = Rng::new(3);
    let shape = GqaShape {
        batch: 1,
        seq: 3,
        heads: 2,
        kv_heads: 1,
        head_size: 16,
        capacity: 3,
    };
    let score = ScoreMod {
        scale: 0.25,
        softcap: 0.0,
        window: None,
        sinks: None,
    };
    let h = |v: Vec<f32>| v.into_iter().map(f16::from_f32).collect::<Vec<_>>();
    let (q, k, v) = (
        h(rng.values(3 * 32, 1.0)),
        h(rng.values(48, 1.0)),
        h(rng.values(48, 1.0)),
    );
    let wide = |x: &[f16]| x.iter().map(|v| v.to_f32()).collect::<Vec<_>>();
    let want = run(
        &shape,
        &score,
        (&wide(&q), &wide(&k), &wide(&v)),
        &[0],
        &[3],
        1,
    );
    let pool = ThreadPool::new(1);
    let mut out = vec![f16::ZERO; want.len()];
    let mut scratch = vec![0f32; scratch_len(&shape, &pool)];
    let rows = Rows {
        data: &q[..],
        stride: 32,
        offset: 0,
    };
    attention(
        &shape,
        &score,
        GqaInputs {
            q: rows,
            k: &k,
            v: &v,
            start: &[0],
            kv_len: &[3],
        },
        &mut out,
        &mut scratch,
        &pool,
    )
    .unwrap();
    assert!(
        out.iter().zip(&want).all(|(o, w)| *o == f16::from_f32(*w)),
        "one rounding of the f32 result"
    );
}

#[test]
fn avx2_rows_equal_the_scalar_reference_bit_for_bit() {
    // Key counts around the 4- and 8-key blocks, head sizes with and without the 8-wide path,
    // windows, softcap and sinks, prefill and decode rows, groups of 1 to 4 and 6 query heads
    // per KV head (the heads a score pass takes together, and the rest).
    let mut rng = Rng::new(0x5eed);
    let mut cases = 0;
    for (head_size, (heads, kv_heads)) in [8, 12, 64, 128]
        .into_iter()
        .flat_map(|hs| [(4, 2), (9, 3), (8, 2), (3, 3), (12, 2)].map(|g| (hs, g)))
    {
        for (seq, past) in [
            (1, 0),
            (1, 7),
            (1, 8),
            (1, 9),
            (1, 15),
            (1, 16),
            (1, 23),
            (5, 11),
            (17, 0),
        ] {
            for score in [
                ScoreMod {
                    scale: 0.125,
                    softcap: 0.0,
                    window: None,
                    sinks: None,
                },
                ScoreMod {
                    scale: 0.3,
                    softcap: 5.0,
                    window: Some(6),
                    sinks: None,
                },
                ScoreMod {
                    scale: 0.3,
                    softcap: 0.0,
                    window: Some(6),
                    sinks: Some(&SINKS[..heads]),
                },
            ] {
                let shape = GqaShape {
                    batch: 1,
                    seq,
                    heads,
                    kv_heads,
                    head_size,
                    capacity: past + seq + 3,
                };
                let q = rng.values(seq * heads * head_size, 1.0);
                let k = rng.values(shape.cache_len(), 1.0);
                let v = rng.values(shape.cache_len(), 1.0);
                let (start, kv_len) = ([past], [past + seq]);
                let pool = ThreadPool::new(2);
                let rows = Rows {
                    data: &q[..],
                    stride: heads * head_size,
                    offset: 0,
                };
                let mut scratch = vec![0f32; scratch_len(&shape, &pool)];
                let n = seq * heads * head_size;
                let (mut fast, mut reference) = (vec![f32::NAN; n], vec![f32::NAN; n]);
                let inputs = GqaInputs {
                    q: rows,
                    k: &k,
                    v: &v,
                    start: &start,
                    kv_len: &kv_len,
                };
                attention(&shape, &score, inputs, &mut fast, &mut scratch, &pool).unwrap();
                attention_reference(&shape, &score, inputs, &mut reference, &mut scratch, &pool)
                    .unwrap();
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&fast),
                    bits(&reference),
                    "head_size {head_size} heads {heads}/{kv_heads} seq {seq} past {past} {score:?}"
                );
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 4 * 5 * 9 * 3);
}

/// Attention sinks for up to nine heads, around the scores' range.
const SINKS: [f32; 12] = [
    0.5, -1.0, 2.0, 0.0, -4.0, 1.25, 0.3, 9.0, -0.7, 3.5, -2.25, 0.1,
];

#[test]
fn heads_sharing_a_kv_head_get_the_bits_they_get_alone() {
    let mut rng = Rng::new(19);
    // SmolLM2's 9 heads on 3 KV heads, Qwen2.5-1.5B's group of 6, groups of MAX_GROUP and
    // longer, and no sharing; head size 64 (the register-resident value sum) and 32; caches
    // longer than a key tile.
    for (heads, kv_heads, head_size) in
        [(9, 3, 64), (12, 2, 64), (8, 1, 32), (12, 1, 64), (4, 4, 64)]
    {
        let (batch, seq, capacity) = (2, 3, 150);
        let shape = GqaShape {
            batch,
            seq,
            heads,
            kv_heads,
            head_size,
            capacity,
        };
        let score = ScoreMod {
            scale: 0.125,
            softcap: 0.0,
            window: None,
            sinks: None,
        };
        let q = rng.values(batch * seq * heads * head_size, 1.0);
        let (k, v) = (
            rng.values(shape.cache_len(), 1.0),
            rng.values(shape.cache_len(), 1.0),
        );
        // The same caches with one KV head per query head: nothing shared.
        let alone = GqaShape {
            kv_heads: heads,
            ..shape
        };
        let group = heads / kv_heads;
        let widen = |c: &[f32]| -> Vec<f32> {
            let per_head = capacity * head_size;
            (0..batch * heads)
                .flat_map(|u| {
                    let (b, n) = (u / heads, u % heads);
                    let src = (b * kv_heads + n / group) * per_head;
                    c[src..src + per_head].iter().copied()
                })
                .collect()
        };
        let (start, kv_len) = ([144, 60], [147, 63]);
        let want = run(
            &alone,
            &score,
            (&q, &widen(&k), &widen(&v)),
            &start,
            &kv_len,
            1,
        );
        for threads in [1, 2, 3] {
            let got = run(&shape, &score, (&q, &k, &v), &start, &kv_len, threads);
            assert!(
                want.iter()
                    .zip(&got)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "heads {heads} kv heads {kv_heads} threads {threads}"
            );
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..proptest::prelude::ProptestConfig::default()
    })]

    /// Any shape, not only the hand-picked ones above (batches, groups of any size, head
    /// sizes on and off the vector paths, a window, a softcap, each row continuing its own
    /// cache): every row matches the f64 reference, and three threads give one thread's bits.
    #[test]
    fn any_shape_matches_the_f64_reference(
        batch in 1usize..4,
        kv_heads in 1usize..3,
        group in 1usize..10,
        hs_at in 0usize..6,
        seq in 1usize..6,
        starts in proptest::collection::vec(0usize..40, 3),
        window in proptest::option::of(1usize..30),
        softcap in proptest::bool::ANY,
        seed in proptest::num::u64::ANY,
    ) {
        let head_size = [8, 16, 24, 64, 80, 128][hs_at];
        let heads = kv_heads * group;
        let start = &starts[..batch];
        let kv_len: Vec<usize> = start.iter().map(|s| s + seq).collect();
        let shape = GqaShape {
            batch,
            seq,
            heads,
            kv_heads,
            head_size,
            capacity: kv_len.iter().copied().max().unwrap_or(0),
        };
        let score = ScoreMod {
            scale: 1.0 / (head_size as f32).sqrt(),
            softcap: if softcap { 2.0 } else { 0.0 },
            window,
            sinks: None,
        };
        let mut rng = Rng::new(seed);
        let q = rng.values(batch * seq * heads * head_size, 1.0);
        let (k, v) = (rng.values(shape.cache_len(), 1.0), rng.values(shape.cache_len(), 1.0));
        let out = run(&shape, &score, (&q, &k, &v), start, &kv_len, 1);
        for (b, n, s) in (0..batch).flat_map(|b| {
            (0..heads).flat_map(move |n| (0..seq).map(move |s| (b, n, s)))
        }) {
            let want = reference_row(&shape, &score, (&q, &k, &v), (b, n, s), start[b], kv_len[b]);
            let got = &out[((b * heads + n) * seq + s) * head_size..][..head_size];
            for (g, w) in got.iter().zip(&want) {
                proptest::prop_assert!((*g as f64 - w).abs() < 2e-5, "b{b} n{n} s{s}: {g} vs {w}");
            }
        }
        let three = run(&shape, &score, (&q, &k, &v), start, &kv_len, 3);
        proptest::prop_assert!(out.iter().zip(&three).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}
