//! What the kernel benches share: deterministic inputs and short criterion groups.

// Each bench compiles its own copy and uses part of it.
#![allow(dead_code)]

use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion};
use oxgen_kernels::acc::Accum;

/// Deterministic values in [-1, 1) (a 64-bit LCG, Knuth's MMIX constants).
pub fn values<T: Accum>(len: usize, seed: u64) -> Vec<T> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            T::from_f32(((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0)
        })
        .collect()
}

/// A group of 10 samples after a 200 ms warm-up, measured for `measure_ms`, so a whole bench
/// file runs in minutes.
pub fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
    measure_ms: u64,
) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(measure_ms));
    g
}
