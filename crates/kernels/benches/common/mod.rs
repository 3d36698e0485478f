//! What the kernel benches share: deterministic inputs and short criterion groups.

// Each bench compiles its own copy and uses part of it.
#![allow(dead_code)]

use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion};
use oxgen_kernels::acc::Accum;
use oxgen_kernels::rng::Rng;

/// Deterministic values in [-1, 1) (the tests' generator).
pub fn values<T: Accum>(len: usize, seed: u64) -> Vec<T> {
    let mut rng = Rng::new(seed);
    (0..len).map(|_| T::from_f32(rng.uniform())).collect()
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
