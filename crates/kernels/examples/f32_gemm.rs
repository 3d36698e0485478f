//! GFLOP/s of the f32 product on packed weights ([`matmul_packed_f32`]) at a sentence
//! encoder's shapes (all-MiniLM's: 384 wide, 1536 in the MLP) for 13 to 256 rows:
//!
//! ```sh
//! cargo run --release -p oxgen-kernels --example f32_gemm -- THREADS COPIES
//! ```
//!
//! Each shape runs over `COPIES` different weight matrices in turn (default 40, more than the
//! L2 caches hold, as a model's layers are; 1 keeps one matrix in cache), nine rounds of 200
//! products; the median round is printed. `bench/ort_matmul.py` times onnxruntime's MatMul on
//! the same shapes.

use std::time::Instant;

use oxgen_kernels::ThreadPool;
use oxgen_kernels::matmul::{PackedF32, matmul_packed_f32};

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .map_or(default, |s| s.parse().expect("a number"))
}

fn main() {
    let (threads, copies) = (arg(1, 2), arg(2, 40).max(1));
    let pool = ThreadPool::new(threads);
    for m in [13usize, 32, 70, 150, 256] {
        for (k, n) in [(384usize, 1536usize), (384, 384), (1536, 384)] {
            let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
            let weights: Vec<PackedF32> = (0..copies)
                .map(|c| {
                    let b: Vec<f32> = (0..k * n).map(|i| ((i + c) % 5) as f32 * 0.1).collect();
                    PackedF32::pack(&b, k, n).expect("k x n values")
                })
                .collect();
            let mut out = vec![0f32; m * n];
            let reps = 200;
            let mut rounds: Vec<f64> = (0..9)
                .map(|r| {
                    let start = Instant::now();
                    for i in 0..reps {
                        let b = &weights[(i + r) % copies];
                        matmul_packed_f32(&a, m, b, &mut out, &pool).expect("shapes match");
                    }
                    start.elapsed().as_secs_f64() / reps as f64
                })
                .collect();
            rounds.sort_by(f64::total_cmp);
            let t = rounds[4];
            let gflops = 2.0 * (m * k * n) as f64 / t / 1e9;
            println!(
                "{m}x{k}x{n} threads {threads} copies {copies}: {:.1} us {gflops:.1} GFLOP/s",
                t * 1e6
            );
        }
    }
}
