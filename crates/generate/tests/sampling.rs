//! The sampling chain, processor by processor and in order, its parameters, and that
//! sampling allocates nothing per token (selection and draws: `selection.rs`).
//!
//! Expected values follow Hugging Face transformers' `generation/logits_process.py` (the rule
//! is quoted in each test) and were worked out by hand; torch is not available here. Where a
//! boundary matters, the inputs are chosen so every probability is exact in binary (equal
//! logits, −inf), so the expected result does not hang on rounding.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use oxgen_generate::{
    GenerateError, Sampler, SamplingParams, Scratch, apply_frequency_presence, apply_logit_bias,
    apply_min_p, apply_repetition_penalty, apply_temperature, apply_top_k, apply_top_p,
};

mod common;
use common::{NEG, kept, logits_of, sampler};

// ---------------------------------------------------------------- processors one by one

#[test]
fn logit_bias_adds_to_raw_logits_and_ignores_ids_outside_the_row() {
    let mut row = vec![1.0, 2.0, 3.0, NEG];
    apply_logit_bias(&mut row, &[(0, 0.5), (2, -10.0), (3, 100.0), (7, 5.0)]);
    assert_eq!(row, [1.5, 2.0, -7.0, NEG], "-inf + bias stays -inf");
}

#[test]
fn a_bias_cannot_unmask_a_masked_id() {
    let params = SamplingParams {
        logit_bias: vec![(1, 100.0)],
        ..SamplingParams::default()
    };
    let mut s = sampler(params.clone());
    let logits = [0.0, 0.0, 0.0];
    for _ in 0..200 {
        assert_ne!(s.sample(&logits, &[1]), 1);
    }
    // Unmasked, the bias makes id 1 all but certain: the others weigh exp(-100) ≈ 4e-44.
    assert_eq!(s.sample(&logits, &[]), 1);
    let mut greedy = sampler(SamplingParams {
        greedy: true,
        ..params
    });
    assert_eq!(greedy.sample(&logits, &[1]), 0);
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_negative_logits() {
    // HF: score = torch.where(score < 0, score * penalty, score / penalty)
    let mut row = vec![2.0, -2.0, 0.0, 1.0];
    apply_repetition_penalty(&mut row, &[0, 1, 2, 9], 2.0);
    assert_eq!(row, [1.0, -4.0, 0.0, 1.0], "id 3 unseen, id 9 outside");
    // A penalty below 1 rewards repetition, symmetrically.
    let mut row = vec![2.0, -2.0];
    apply_repetition_penalty(&mut row, &[0, 1], 0.5);
    assert_eq!(row, [4.0, -1.0]);
}

#[test]
fn the_repetition_penalty_counts_prompt_and_generated_ids_once_each() {
    let mut s = sampler(SamplingParams {
        repetition_penalty: 2.0,
        ..SamplingParams::default()
    });
    s.reset(&[0, 0, 1]);
    s.accept(3);
    s.accept(3);
    let mut row = vec![2.0, -2.0, 5.0, 4.0];
    s.process(&mut row);
    // Id 0 twice in the prompt and id 3 twice generated: penalized once (HF gathers then
    // scatters), not 2².
    assert_eq!(row, [1.0, -4.0, 5.0, 2.0]);
    s.reset(&[]);
    let mut row = vec![2.0, -2.0, 5.0, 4.0];
    s.process(&mut row);
    assert_eq!(
        row,
        [2.0, -2.0, 5.0, 4.0],
        "reset forgets prompt and generated ids"
    );
}

#[test]
fn frequency_and_presence_penalties_follow_the_openai_formula() {
    // OpenAI: mu[j] -= c[j] * frequency + (c[j] > 0) * presence
    let mut row = vec![1.0, 1.0, 1.0];
    apply_frequency_presence(&mut row, [(0, 3), (2, 1), (1, 0)], 0.5, 1.0);
    assert_eq!(row, [-1.5, 1.0, -0.5]);

    // Over generated ids only: the prompt's id 1 is not penalized.
    let mut s = sampler(SamplingParams {
        frequency_penalty: 0.5,
        presence_penalty: 1.0,
        ..SamplingParams::default()
    });
    s.reset(&[1, 1]);
    for id in [0, 2, 0, 0] {
        s.accept(id);
    }
    let mut row = vec![1.0, 1.0, 1.0];
    s.process(&mut row);
    assert_eq!(row, [-1.5, 1.0, -0.5]);

    // Negative values encourage repetition.
    let mut row = vec![0.0];
    apply_frequency_presence(&mut row, [(0, 2)], -1.0, -2.0);
    assert_eq!(row, [4.0]);
}

#[test]
fn temperature_divides_the_logits() {
    // HF TemperatureLogitsWarper: scores / temperature
    let mut row = vec![2.0, -1.0, 0.0, NEG];
    apply_temperature(&mut row, 0.5);
    assert_eq!(row, [4.0, -2.0, 0.0, NEG]);
}

#[test]
fn top_k_keeps_every_logit_tied_with_the_kth() {
    // HF TopKLogitsWarper: top_k = min(max(top_k, 1), vocab);
    //   remove = scores < torch.topk(scores, top_k)[0][..., -1, None]
    let mut scratch = Scratch::default();
    let row = [1.0, 3.0, 3.0, 2.0, 3.0];
    let mut r = row.to_vec();
    apply_top_k(&mut r, 2, &mut scratch);
    assert_eq!(
        r,
        [NEG, 3.0, 3.0, NEG, 3.0],
        "2nd largest is 3: all three 3s stay"
    );
    let mut r = row.to_vec();
    apply_top_k(&mut r, 4, &mut scratch);
    assert_eq!(r, [NEG, 3.0, 3.0, 2.0, 3.0]);
    let mut r = row.to_vec();
    apply_top_k(&mut r, 0, &mut scratch);
    assert_eq!(kept(&r), [1, 2, 4], "k is raised to 1 (min_tokens_to_keep)");
    let mut r = row.to_vec();
    apply_top_k(&mut r, 10, &mut scratch);
    assert_eq!(r, row, "k is clamped to the vocabulary");
    let mut r = vec![-1.0, -0.0, 0.0, -2.0];
    apply_top_k(&mut r, 1, &mut scratch);
    assert_eq!(kept(&r), [1, 2], "-0.0 == 0.0 as a tie");
}

#[test]
fn top_p_removes_tokens_whose_cumulative_mass_is_at_most_one_minus_p() {
    // HF TopPLogitsWarper: sort ascending; cumprobs = softmax(sorted).cumsum();
    //   remove = cumprobs <= 1 - top_p; the last (most likely) one is always kept.
    // Four equal logits and a -inf: probabilities exactly 0, .25, .25, .25, .25; ascending
    // (ties by index) 4, 0, 1, 2, 3 with cumulative sums 0, .25, .5, .75, 1.
    let mut scratch = Scratch::default();
    let row = [0.0, 0.0, 0.0, 0.0, NEG];
    let mut r = row.to_vec();
    apply_top_p(&mut r, 0.75, &mut scratch);
    assert_eq!(
        kept(&r),
        [1, 2, 3],
        "cumsum .25 <= 1 - .75: the boundary token goes (a `<` rule would keep it)"
    );
    let mut r = row.to_vec();
    apply_top_p(&mut r, 0.5, &mut scratch);
    assert_eq!(kept(&r), [2, 3]);
    let mut r = row.to_vec();
    apply_top_p(&mut r, 0.01, &mut scratch);
    assert_eq!(kept(&r), [3], "the most likely token always stays");
    let mut r = row.to_vec();
    apply_top_p(&mut r, 1.0, &mut scratch);
    assert_eq!(r, row);
    // -0.0 == 0.0: still a tie, so the index decides which one goes first.
    let mut r = vec![0.0, -0.0, 0.0, 0.0, NEG];
    apply_top_p(&mut r, 0.75, &mut scratch);
    assert_eq!(kept(&r), [1, 2, 3]);

    // probs .5 .25 .15 .1: ascending cumsums .1 .25 .5 1.
    let row = logits_of(&[0.5, 0.25, 0.15, 0.1]);
    let mut r = row.clone();
    apply_top_p(&mut r, 0.8, &mut scratch); // remove cumsum <= .2: only .1
    assert_eq!(kept(&r), [0, 1, 2]);
    assert_eq!(&r[..3], &row[..3], "kept logits are untouched");
    let mut r = row.clone();
    apply_top_p(&mut r, 0.7, &mut scratch); // remove cumsum <= .3: .1 and .15
    assert_eq!(kept(&r), [0, 1]);
}

/// HF's rule spelled out: sort ascending (ties by index), cumulative softmax sum in f64,
/// remove while the sum is `<= 1 − top_p`, never the last.
fn top_p_by_full_sort(row: &[f32], top_p: f32) -> Vec<usize> {
    let mut order: Vec<usize> = (0..row.len()).filter(|&i| row[i] > NEG).collect();
    order.sort_by(|&a, &b| row[a].partial_cmp(&row[b]).unwrap().then(a.cmp(&b)));
    let max = row[*order.last().unwrap()] as f64;
    let w: Vec<f64> = order.iter().map(|&i| (row[i] as f64 - max).exp()).collect();
    let total: f64 = w.iter().sum();
    let mut cumulative = 0.0;
    let mut removed = 0;
    for &w in &w[..w.len() - 1] {
        cumulative += w / total;
        if cumulative > 1.0 - top_p as f64 {
            break;
        }
        removed += 1;
    }
    let mut kept = order[removed..].to_vec();
    kept.sort();
    kept
}

#[test]
fn top_p_sorting_only_the_head_keeps_what_sorting_everything_keeps() {
    // Peaked rows (the cut among the first 64), flatter ones (the head grows to 256, 1024,
    // ...) and flat ones with repeated values (ties at the cut), vocabularies up to 50k.
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut scratch = Scratch::default();
    let mut heads = [0usize; 3];
    for case in 0..60 {
        let n = [50, 1000, 49152][case % 3];
        let spread = [1.0, 4.0, 12.0, 0.0][case % 4];
        let row: Vec<f32> = (0..n)
            .map(|i| match (spread == 0.0, i % 97) {
                (_, 0) => NEG,
                (true, _) => (i % 5) as f32,
                (false, _) => (spread * next() * next()) as f32 - 3.0,
            })
            .collect();
        for top_p in [0.05f32, 0.5, 0.9, 0.99] {
            let want = top_p_by_full_sort(&row, top_p);
            let mut got = row.clone();
            apply_top_p(&mut got, top_p, &mut scratch);
            assert_eq!(kept(&got), want, "case {case}, n {n}, top_p {top_p}");
            heads[match want.len() {
                0..=64 => 0,
                65..=256 => 1,
                _ => 2,
            }] += 1;
        }
    }
    assert!(
        heads.iter().all(|&h| h > 0),
        "cuts at every head size: {heads:?}"
    );
}

#[test]
fn min_p_keeps_tokens_exactly_at_the_threshold() {
    // HF MinPLogitsWarper: probs = softmax(scores); remove = probs < min_p * probs.max()
    let mut r = vec![0.0, 0.0, -1.0, 0.0, NEG];
    apply_min_p(&mut r, 1.0);
    assert_eq!(
        r,
        [0.0, 0.0, NEG, 0.0, NEG],
        "ties with the maximum are never below it"
    );

    // probs .5 .25 .15 .1 relative to the max: 1, .5, .3, .2.
    let row = logits_of(&[0.5, 0.25, 0.15, 0.1]);
    let mut r = row.clone();
    apply_min_p(&mut r, 0.25);
    assert_eq!(kept(&r), [0, 1, 2]);
    let mut r = row.clone();
    apply_min_p(&mut r, 0.4);
    assert_eq!(kept(&r), [0, 1]);
    let mut r = row.clone();
    apply_min_p(&mut r, 0.0);
    assert_eq!(r, row);
}

#[test]
fn processors_keep_the_softmax_limit_of_infinite_logits() {
    let mut scratch = Scratch::default();
    let mut r = vec![1.0, f32::INFINITY, 2.0];
    apply_top_p(&mut r, 0.9, &mut scratch);
    assert_eq!(kept(&r), [1]);
    let mut r = vec![1.0, f32::INFINITY, 2.0];
    apply_min_p(&mut r, 0.1);
    assert_eq!(kept(&r), [1]);
    let mut s = sampler(SamplingParams::default());
    assert_eq!(s.sample(&[1.0, f32::INFINITY, 2.0], &[]), 1);
}

// ---------------------------------------------------------------- chain order

/// Runs `process` on `row` with `params`, after `reset(prompt)` and accepting `generated`.
fn processed(params: SamplingParams, prompt: &[u32], generated: &[u32], row: &[f32]) -> Vec<f32> {
    let mut s = sampler(params);
    s.reset(prompt);
    for &id in generated {
        s.accept(id);
    }
    let mut r = row.to_vec();
    s.process(&mut r);
    r
}

#[test]
fn the_bias_comes_before_the_repetition_penalty() {
    let params = SamplingParams {
        logit_bias: vec![(0, -2.0)],
        repetition_penalty: 2.0,
        ..SamplingParams::default()
    };
    // (1 - 2) * 2 = -2; the other order gives 1 / 2 - 2 = -1.5.
    assert_eq!(processed(params, &[0], &[], &[1.0]), [-2.0]);
}

#[test]
fn the_repetition_penalty_comes_before_frequency_and_presence() {
    let params = SamplingParams {
        repetition_penalty: 2.0,
        frequency_penalty: 1.0,
        ..SamplingParams::default()
    };
    // 2 / 2 - 1 = 0; the other order gives (2 - 1) / 2 = 0.5.
    assert_eq!(processed(params, &[], &[0], &[2.0]), [0.0]);
}

#[test]
fn penalties_come_before_temperature() {
    let params = SamplingParams {
        frequency_penalty: 1.0,
        temperature: 2.0,
        ..SamplingParams::default()
    };
    // (2 - 1) / 2 = 0.5; the other order gives 2 / 2 - 1 = 0.
    assert_eq!(processed(params, &[], &[0], &[2.0, 0.0]), [0.5, 0.0]);
}

#[test]
fn temperature_comes_before_min_p() {
    let params = SamplingParams {
        temperature: 2.0,
        min_p: 0.5,
        ..SamplingParams::default()
    };
    // After temperature: [0, -0.5], exp(-0.5) = .61 >= .5 kept. Min-p first would see
    // exp(-1) = .37 < .5 and remove id 1.
    assert_eq!(processed(params, &[], &[], &[0.0, -1.0]), [0.0, -0.5]);
}

#[test]
fn top_k_comes_before_top_p() {
    let params = SamplingParams {
        top_k: 2,
        top_p: 0.6,
        ..SamplingParams::default()
    };
    // probs .5 .3 .2 → top-k 2 → renormalized .625 .375 → top-p removes cumsum <= .4: the
    // .375. Top-p first would remove only the .2 (cumsums .2 .5 1) and keep ids 0 and 1.
    let r = processed(params, &[], &[], &logits_of(&[0.5, 0.3, 0.2]));
    assert_eq!(kept(&r), [0]);
}

#[test]
fn top_p_comes_before_min_p() {
    let params = SamplingParams {
        top_p: 0.6,
        min_p: 0.5,
        ..SamplingParams::default()
    };
    // probs .5 .3 .2 → top-p removes cumsum <= .4: the .2 → min-p (.3/.5 = .6 >= .5) keeps
    // both. Min-p first would remove the .2, leaving .625 .375, and top-p would then remove
    // the .375.
    let r = processed(params, &[], &[], &logits_of(&[0.5, 0.3, 0.2]));
    assert_eq!(kept(&r), [0, 1]);
}

#[test]
fn greedy_selection_skips_the_warpers_but_not_bias_and_penalties() {
    let params = SamplingParams {
        temperature: 0.0,
        top_k: 1,
        top_p: 0.1,
        min_p: 0.9,
        logit_bias: vec![(2, 1.0)],
        presence_penalty: 0.5,
        ..SamplingParams::default()
    };
    let r = processed(params.clone(), &[], &[0], &[3.0, 2.0, 1.0]);
    assert_eq!(
        r,
        [2.5, 2.0, 2.0],
        "no temperature division by 0, nothing filtered"
    );
    let mut s = sampler(params);
    s.accept(0);
    s.accept(0);
    // presence 0.5 and bias: [2.5, 2.6, 2.0] → id 1.
    assert_eq!(s.sample(&[3.0, 2.6, 1.0], &[]), 1);
}

// ---------------------------------------------------------------- parameters

#[test]
fn is_greedy_means_flag_temperature_zero_or_top_k_one() {
    let d = SamplingParams::default();
    assert!(!d.is_greedy());
    for p in [
        SamplingParams {
            greedy: true,
            ..d.clone()
        },
        SamplingParams {
            temperature: 0.0,
            ..d.clone()
        },
        SamplingParams {
            top_k: 1,
            ..d.clone()
        },
    ] {
        assert!(p.is_greedy(), "{p:?}");
    }
}

#[test]
fn validation_names_the_parameter_its_value_and_the_range() {
    type Break = fn(&mut SamplingParams);
    let cases: [(Break, &str); 14] = [
        (|p| p.temperature = -1.0, "temperature = -1"),
        (|p| p.temperature = f32::NAN, "temperature = NaN"),
        (|p| p.temperature = f32::INFINITY, "temperature = inf"),
        (|p| p.top_p = 0.0, "top_p = 0: must be in (0, 1]"),
        (|p| p.top_p = 1.5, "top_p = 1.5"),
        (|p| p.top_p = f32::NAN, "top_p = NaN"),
        (|p| p.min_p = 1.5, "min_p = 1.5: must be in [0, 1]"),
        (|p| p.min_p = -0.1, "min_p = -0.1"),
        (
            |p| p.repetition_penalty = 0.0,
            "repetition_penalty = 0: must be a finite number > 0",
        ),
        (
            |p| p.repetition_penalty = f32::NAN,
            "repetition_penalty = NaN",
        ),
        (
            |p| p.frequency_penalty = 3.0,
            "frequency_penalty = 3: must be in [-2, 2]",
        ),
        (|p| p.presence_penalty = -2.5, "presence_penalty = -2.5"),
        (
            |p| p.logit_bias = vec![(5, 1.0), (7, f32::INFINITY)],
            "logit_bias for token 7 = inf",
        ),
        (
            |p| p.logit_bias = vec![(5, f32::NAN)],
            "logit_bias for token 5 = NaN",
        ),
    ];
    for (break_it, expected) in cases {
        let mut params = SamplingParams::default();
        break_it(&mut params);
        let err = Sampler::new(params.clone()).expect_err(expected);
        assert!(matches!(err, GenerateError::Sampling(_)), "{err:?}");
        let message = err.to_string();
        assert!(
            message.starts_with("sampling: ") && message.contains(expected),
            "{message:?} should contain {expected:?}"
        );
        assert!(params.validate().is_err());
    }
}

#[test]
fn validation_accepts_the_edges_of_every_range() {
    let params = SamplingParams {
        temperature: 0.0,
        top_k: usize::MAX,
        top_p: 1.0,
        min_p: 1.0,
        repetition_penalty: 1e-3,
        frequency_penalty: -2.0,
        presence_penalty: 2.0,
        logit_bias: vec![(0, f32::NEG_INFINITY), (1, -100.0)],
        seed: u64::MAX,
        greedy: false,
    };
    params.validate().unwrap();
    Sampler::new(SamplingParams {
        top_p: f32::MIN_POSITIVE,
        min_p: 0.0,
        ..params
    })
    .unwrap();
}

// ---------------------------------------------------------------- allocation

/// Counts allocations per thread, so tests running in parallel do not disturb each other.
struct CountingAlloc;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn count_one() {
    // `try_with`: never panic inside the allocator, even during thread teardown.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

#[test]
fn sampling_allocates_nothing_per_token_once_warm() {
    let vocab = 2000;
    for params in [
        SamplingParams {
            temperature: 0.7,
            top_k: 50,
            top_p: 0.9,
            min_p: 0.02,
            repetition_penalty: 1.2,
            frequency_penalty: 0.3,
            presence_penalty: 0.3,
            logit_bias: vec![(7, 2.0)],
            ..SamplingParams::default()
        },
        // Top-p alone sorts a varying number of finite logits.
        SamplingParams {
            top_p: 0.9,
            ..SamplingParams::default()
        },
        SamplingParams {
            greedy: true,
            repetition_penalty: 1.3,
            ..SamplingParams::default()
        },
    ] {
        let mut s = sampler(params);
        let prompt: Vec<u32> = (0..100).collect();
        s.reset(&prompt);
        let mut logits = Vec::with_capacity(vocab);
        let masked = [3u32];
        let mut prev = 0;
        // The warm-up row has only 3 candidates (a grammar-constrained first token, say): the
        // buffers must be sized for the vocabulary, not for the first row's candidates.
        let step = |s: &mut Sampler, logits: &mut Vec<f32>, prev: &mut u32, warm_up: bool| {
            logits.clear();
            logits.extend((0..vocab as u32).map(|i| {
                if (warm_up && i > 2) || (i + *prev).is_multiple_of(97) {
                    NEG
                } else {
                    ((i * 31 + *prev * 17) % 101) as f32 * 0.05
                }
            }));
            *prev = s.sample(logits, &masked);
            s.accept(*prev);
        };
        step(&mut s, &mut logits, &mut prev, true);
        let before = ALLOCATIONS.with(Cell::get);
        for _ in 0..300 {
            step(&mut s, &mut logits, &mut prev, false);
        }
        let after = ALLOCATIONS.with(Cell::get);
        assert_eq!(after - before, 0, "allocations in 300 warm steps");
    }
}

// ---------------------------------------------------------------- the one rule, and new processors

#[test]
fn a_request_turns_sampling_on_by_one_rule() {
    use oxgen_generate::SamplingRequest;
    let greedy_package = SamplingParams {
        greedy: true,
        temperature: 0.6,
        ..SamplingParams::default()
    };
    let resolve = |r: SamplingRequest| r.resolve(&greedy_package, 77).unwrap();
    let none = resolve(SamplingRequest::default());
    assert!(none.is_greedy(), "nothing asked: as the package says");
    assert_eq!(none.seed, 77, "no seed given: the fresh one");
    for (what, r) in [
        (
            "seed",
            SamplingRequest {
                seed: Some(5),
                ..Default::default()
            },
        ),
        (
            "n > 1",
            SamplingRequest {
                choices: 2,
                ..Default::default()
            },
        ),
        (
            "top_k",
            SamplingRequest {
                top_k: Some(40),
                ..Default::default()
            },
        ),
        (
            "top_p",
            SamplingRequest {
                top_p: Some(0.9),
                ..Default::default()
            },
        ),
        (
            "min_p",
            SamplingRequest {
                min_p: Some(0.1),
                ..Default::default()
            },
        ),
    ] {
        let s = resolve(r);
        assert!(!s.is_greedy(), "{what} turns sampling on");
        assert_eq!(s.temperature, 0.6, "{what}: at the package's temperature");
    }
    let t = resolve(SamplingRequest {
        temperature: Some(0.9),
        ..Default::default()
    });
    assert!(!t.is_greedy() && t.temperature == 0.9);
    let zero = resolve(SamplingRequest {
        temperature: Some(0.0),
        top_p: Some(0.9),
        seed: Some(1),
        ..Default::default()
    });
    assert!(zero.is_greedy(), "temperature 0 is always greedy");
    let forced = resolve(SamplingRequest {
        greedy: true,
        temperature: Some(0.9),
        ..Default::default()
    });
    assert!(forced.is_greedy(), "--greedy wins");
    // A package that says greedy with temperature 0 samples at the neutral 1 when asked to.
    let zero_package = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    let s = SamplingRequest {
        top_p: Some(0.9),
        ..Default::default()
    }
    .resolve(&zero_package, 0)
    .unwrap();
    assert!(!s.is_greedy() && s.temperature == 1.0);
    let e = SamplingRequest {
        top_p: Some(1.5),
        ..Default::default()
    }
    .resolve(&zero_package, 0)
    .unwrap_err();
    assert!(e.to_string().contains("top_p = 1.5"), "{e}");
}

#[test]
fn a_processor_pushed_in_front_sees_raw_logits_and_every_token() {
    use oxgen_generate::{History, LogitsProcessor};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Bans id 0, counts the tokens it is told of.
    #[derive(Debug)]
    struct BanZero(Arc<AtomicUsize>);
    impl LogitsProcessor for BanZero {
        fn apply(&mut self, logits: &mut [f32], _: &History) {
            logits[0] = f32::NEG_INFINITY;
        }
        fn accept(&mut self, _: u32) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        fn reset(&mut self, _: &[u32]) {
            self.0.store(0, Ordering::Relaxed);
        }
    }
    let accepted = Arc::new(AtomicUsize::new(0));
    for greedy in [true, false] {
        let mut s = sampler(SamplingParams {
            greedy,
            logit_bias: vec![(0, 50.0)],
            seed: 3,
            ..SamplingParams::default()
        });
        s.push_front(Box::new(BanZero(accepted.clone())));
        for _ in 0..50 {
            let id = s.sample(&[10.0, 1.0, 0.5], &[]);
            assert_ne!(
                id, 0,
                "greedy {greedy}: the bias after the ban cannot revive id 0"
            );
            s.accept(id);
        }
        assert_eq!(accepted.load(Ordering::Relaxed), 50);
        s.reset(&[]);
        assert_eq!(accepted.load(Ordering::Relaxed), 0);
    }
}
