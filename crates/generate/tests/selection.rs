//! Choosing the token: greedy selection (first maximum, NaN and masked ids skipped), the seeded
//! categorical draw (reproducible sequences, pinned draws) and its distributions against the
//! processors' renormalized probabilities (chi-square).

mod common;
use common::{NEG, logits_of, sampler};
use oxgen_generate::SamplingParams;

#[test]
fn greedy_selection_is_the_first_largest_unmasked_finite_logit() {
    let mut s = sampler(SamplingParams {
        greedy: true,
        ..Default::default()
    });
    let nan = f32::NAN;
    for (row, masked, want) in [
        (vec![1.0, 3.0, 3.0, 2.0], vec![], 1),
        (vec![nan, 1.0, nan, 1.5], vec![], 3),
        (vec![1.0, 3.0, 3.0, 2.0], vec![1], 2),
        (vec![1.0, 3.0, 3.0, 2.0], vec![1, 2], 3),
        (vec![-0.0, 0.0, -1.0], vec![], 0),
        (vec![1.0, f32::INFINITY, f32::INFINITY], vec![], 1),
        (vec![NEG, nan, NEG], vec![], 0),
        (vec![NEG, 2.0, NEG], vec![1], 0),
    ] {
        assert_eq!(s.sample(&row, &masked), want, "{row:?} masked {masked:?}");
    }
    // Rows longer than the sixteen lanes, the maximum in the tail or tied across lanes.
    let mut row: Vec<f32> = (0..100).map(|i| (i % 23) as f32).collect();
    assert_eq!(s.sample(&row, &[]), 22);
    row[99] = 30.0;
    assert_eq!(s.sample(&row, &[]), 99);
    assert_eq!(s.sample(&row, &[99]), 22);
}

// ---------------------------------------------------------------- selection

#[test]
fn greedy_takes_the_first_maximum_and_skips_masked_ids() {
    let mut s = sampler(SamplingParams {
        greedy: true,
        ..SamplingParams::default()
    });
    assert_eq!(s.sample(&[1.0, 3.0, 3.0, 2.0], &[]), 1);
    assert_eq!(s.sample(&[1.0, 3.0, 3.0, 2.0], &[1]), 2);
    assert_eq!(s.sample(&[1.0, 3.0, 3.0, 2.0], &[1, 2, 9]), 3);
}

#[test]
fn nan_and_fully_masked_rows_never_panic() {
    for params in [
        SamplingParams::default(),
        SamplingParams {
            greedy: true,
            ..SamplingParams::default()
        },
        SamplingParams {
            top_k: 2,
            top_p: 0.5,
            min_p: 0.5,
            repetition_penalty: 1.5,
            ..SamplingParams::default()
        },
    ] {
        let mut s = sampler(params);
        s.reset(&[0, 1, 2, 1_000_000, u32::MAX]);
        s.accept(u32::MAX);
        for _ in 0..50 {
            assert_eq!(s.sample(&[f32::NAN, 1.0, f32::NAN], &[]), 1, "NaN is -inf");
        }
        assert_eq!(s.sample(&[f32::NAN; 3], &[]), 0, "nothing finite: first id");
        assert_eq!(s.sample(&[f32::NAN; 3], &[0]), 1, "first unmasked id");
        assert_eq!(s.sample(&[NEG, NEG, 5.0], &[2]), 0);
        assert_eq!(s.sample(&[1.0, 2.0], &[0, 1]), 0, "all masked: 0");
        assert_eq!(s.sample(&[], &[]), 0);
    }
}

#[test]
fn nan_logits_carry_no_probability() {
    let mut s = sampler(SamplingParams::default());
    let mut counts = [0; 4];
    for _ in 0..1000 {
        counts[s.sample(&[f32::NAN, 0.0, 0.0, f32::NAN], &[]) as usize] += 1;
    }
    assert_eq!((counts[0], counts[3]), (0, 0), "{counts:?}");
    assert!(counts[1] > 400 && counts[2] > 400, "{counts:?}");
}

/// A toy "model": logits over `vocab` ids that depend on the previous token.
fn toy_logits(prev: u32, vocab: usize, out: &mut Vec<f32>) {
    out.clear();
    out.extend((0..vocab as u32).map(|i| ((i * 7 + prev * 13) % 17) as f32 * 0.3 - 2.0));
}

fn run_sequence(params: &SamplingParams, steps: usize) -> Vec<u32> {
    let mut s = sampler(params.clone());
    s.reset(&[3, 1, 4]);
    let mut logits = Vec::new();
    let mut prev = 4;
    let mut ids = Vec::with_capacity(steps);
    for _ in 0..steps {
        toy_logits(prev, 40, &mut logits);
        prev = s.sample(&logits, &[5]);
        s.accept(prev);
        ids.push(prev);
    }
    ids
}

#[test]
fn the_same_seed_gives_the_same_sequence_and_other_seeds_differ() {
    let params = SamplingParams {
        temperature: 0.8,
        top_k: 30,
        top_p: 0.95,
        min_p: 0.01,
        repetition_penalty: 1.1,
        frequency_penalty: 0.2,
        presence_penalty: 0.1,
        seed: 7,
        ..SamplingParams::default()
    };
    let a = run_sequence(&params, 1000);
    assert_eq!(a, run_sequence(&params, 1000));
    assert!(!a.contains(&5), "masked id 5 was sampled");
    let distinct = {
        let mut d = a.clone();
        d.sort_unstable();
        d.dedup();
        d.len()
    };
    assert!(
        distinct > 10,
        "the draws actually vary: {distinct} distinct ids"
    );
    for seed in [8, 1 << 40] {
        let b = run_sequence(
            &SamplingParams {
                seed,
                ..params.clone()
            },
            1000,
        );
        assert_ne!(a, b, "seed {seed}");
    }
}

#[test]
fn reset_restarts_the_random_stream() {
    let mut s = sampler(SamplingParams {
        seed: 3,
        ..SamplingParams::default()
    });
    let logits = [0.0; 16];
    let first: Vec<u32> = (0..20).map(|_| s.sample(&logits, &[])).collect();
    let second: Vec<u32> = (0..20).map(|_| s.sample(&logits, &[])).collect();
    assert_ne!(first, second);
    s.reset(&[]);
    let again: Vec<u32> = (0..20).map(|_| s.sample(&logits, &[])).collect();
    assert_eq!(first, again);
}

/// Cross-platform reproducibility guard: ChaCha8 `seed_from_u64(42)`, uniforms from the top
/// 53 bits, an f64 CDF walk in index order. If this changes, seeded outputs changed for users.
///
/// The ids were checked against an independent Python implementation (python3, no packages):
///
/// ```text
/// import math, struct
/// M = 2**64 - 1
/// def seed_bytes(state):  # rand_core 0.9 seed_from_u64: PCG32 words, little-endian
///     out = b''
///     for _ in range(8):
///         state = (state * 6364136223846793005 + 11634580027462260723) & M
///         x = (((state >> 18) ^ state) >> 27) & 0xffffffff; r = state >> 59
///         out += struct.pack('<I', ((x >> r) | (x << ((32 - r) & 31))) & 0xffffffff)
///     return out
/// def rotl(v, c): return ((v << c) | (v >> (32 - c))) & 0xffffffff
/// def qr(s, a, b, c, d):
///     for (x, y, z, n) in ((a, b, d, 16), (c, d, b, 12), (a, b, d, 8), (c, d, b, 7)):
///         s[x] = (s[x] + s[y]) & 0xffffffff; s[z] = rotl(s[z] ^ s[x], n)
/// def block(key, n):  # ChaCha, 8 rounds, 64-bit block counter, stream 0
///     st = [0x61707865, 0x3320646e, 0x79622d32, 0x6b206574, *struct.unpack('<8I', key),
///           n & 0xffffffff, n >> 32, 0, 0]
///     w = st[:]
///     for _ in range(4):
///         for q in ((0,4,8,12),(1,5,9,13),(2,6,10,14),(3,7,11,15),
///                   (0,5,10,15),(1,6,11,12),(2,7,8,13),(3,4,9,14)): qr(w, *q)
///     return [(a + b) & 0xffffffff for a, b in zip(w, st)]
/// def u64s(seed):  # next_u64 = low word | high word << 32
///     key, n = seed_bytes(seed), 0
///     while True:
///         b = block(key, n); n += 1
///         yield from (b[i] | b[i + 1] << 32 for i in range(0, 16, 2))
/// logits = [(i % 5) * 0.5 for i in range(32)]
/// w = [math.exp(l - max(logits)) for l in logits]; total = 0.0
/// for x in w: total += x
/// g, out = u64s(42), []
/// for _ in range(8):
///     t, run = (next(g) >> 11) * 2.0**-53 * total, 0.0
///     for i, x in enumerate(w):
///         run += x
///         if run > t: out.append(i); break
/// print(out)  # [22, 29, 14, 19, 9, 4, 9, 24]
/// ```
#[test]
fn seed_42_draws_are_pinned() {
    let mut s = sampler(SamplingParams {
        seed: 42,
        ..SamplingParams::default()
    });
    let logits: Vec<f32> = (0..32).map(|i| (i % 5) as f32 * 0.5).collect();
    let draws: Vec<u32> = (0..8).map(|_| s.sample(&logits, &[])).collect();
    assert_eq!(draws, PINNED_SEED_42);
}
const PINNED_SEED_42: [u32; 8] = [22, 29, 14, 19, 9, 4, 9, 24];

// ---------------------------------------------------------------- distributions

/// Chi-square critical values at p = 0.999 for 1..=3 degrees of freedom.
const CHI2_999: [f64; 3] = [10.828, 13.816, 16.266];
const DRAWS: usize = 20_000;

/// Draws `DRAWS` ids from `probs` under `params` and checks them against `expected` (the
/// renormalized probabilities of the ids that survive; 0 for filtered ids, which must never
/// be drawn) with a chi-square test at p = 0.999. Deterministic: the seed is fixed.
fn check_distribution(params: SamplingParams, probs: &[f64], expected: &[f64]) {
    let mut s = sampler(params);
    let logits = logits_of(probs);
    let mut counts = vec![0usize; probs.len()];
    for _ in 0..DRAWS {
        counts[s.sample(&logits, &[]) as usize] += 1;
    }
    let total: f64 = expected.iter().sum();
    let mut chi2 = 0.0;
    let mut support = 0;
    for (&count, &e) in counts.iter().zip(expected) {
        if e == 0.0 {
            assert_eq!(count, 0, "a filtered id was drawn: {counts:?}");
            continue;
        }
        support += 1;
        let want = e / total * DRAWS as f64;
        chi2 += (count as f64 - want).powi(2) / want;
    }
    let critical = CHI2_999[support - 2];
    assert!(
        chi2 < critical,
        "chi2 {chi2:.2} >= {critical} for {counts:?} vs {expected:?}"
    );
}

const PROBS: [f64; 4] = [0.5, 0.25, 0.15, 0.1];

#[test]
fn categorical_draws_follow_the_softmax() {
    check_distribution(
        SamplingParams {
            seed: 1,
            ..SamplingParams::default()
        },
        &PROBS,
        &PROBS,
    );
}

#[test]
fn temperature_two_draws_follow_the_square_root_of_the_probabilities() {
    // softmax(log p / 2) ∝ sqrt(p)
    let expected: Vec<f64> = PROBS.iter().map(|p| p.sqrt()).collect();
    check_distribution(
        SamplingParams {
            temperature: 2.0,
            seed: 2,
            ..SamplingParams::default()
        },
        &PROBS,
        &expected,
    );
}

#[test]
fn top_k_draws_follow_the_renormalized_top_two() {
    check_distribution(
        SamplingParams {
            top_k: 2,
            seed: 3,
            ..SamplingParams::default()
        },
        &PROBS,
        &[0.5, 0.25, 0.0, 0.0],
    );
}

#[test]
fn top_p_draws_follow_the_renormalized_nucleus() {
    // top_p .8 removes ascending cumsum <= .2: only the .1.
    check_distribution(
        SamplingParams {
            top_p: 0.8,
            seed: 4,
            ..SamplingParams::default()
        },
        &PROBS,
        &[0.5, 0.25, 0.15, 0.0],
    );
}

#[test]
fn min_p_draws_follow_the_renormalized_survivors() {
    // min_p .4: threshold .4 * .5 = .2 removes .15 and .1.
    check_distribution(
        SamplingParams {
            min_p: 0.4,
            seed: 5,
            ..SamplingParams::default()
        },
        &PROBS,
        &[0.5, 0.25, 0.0, 0.0],
    );
}

#[test]
fn the_chi_square_check_rejects_a_wrong_distribution() {
    // Guards the guard: drawing from PROBS must fail against a uniform expectation.
    let result = std::panic::catch_unwind(|| {
        check_distribution(SamplingParams::default(), &PROBS, &[1.0; 4]);
    });
    assert!(result.is_err());
}
