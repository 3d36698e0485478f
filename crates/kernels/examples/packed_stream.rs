//! How fast the packed int4 `MatMulNBits` kernel streams a model's matrices, in GB/s of
//! packed weight bytes (codes and f16 scales), for a few rows: the figure to set beside
//! `read_bandwidth` (the bound) and beside the same shapes held in cache (the kernel's own
//! speed, which a decode step cannot beat either).
//!
//! Each shape is a 4-bit matrix of blocks of 32 with f16 scales and no zero points (onnxruntime
//! -genai's builder layout); enough copies of it are packed that together they outgrow the
//! last-level cache, unless the shape is named `cached` (one copy, read again and again). The
//! figure is the best of five timings of many calls over the copies in turn.
//!
//!     cargo run --release -p oxgen-kernels --example packed_stream -- [THREADS] [ROWS]
//!
//! Prints one line per shape: `N x K (copies): MB, GB/s, µs per call`.

use std::time::Instant;

use oxgen_kernels::ThreadPool;
use oxgen_kernels::int8::Variant;
use oxgen_kernels::nbits::{NBitsLayout, PackedNBits, QuantWeights, ZeroPoints, matmul_packed};

/// (label, N, K, copies): Qwen2.5-1.5B's and Llama-3.2-3B's projections and one held in cache.
const SHAPES: [(&str, usize, usize, usize); 5] = [
    ("1.5B gate/up", 8960, 1536, 8),
    ("1.5B down", 1536, 8960, 8),
    ("3B q/o", 3072, 3072, 12),
    ("3B down", 3072, 8192, 4),
    ("cached", 2048, 1536, 1),
];

fn main() {
    let arg = |i: usize, default: usize| {
        std::env::args().nth(i).map_or(default, |s| {
            s.parse().unwrap_or_else(|_| {
                eprintln!("packed_stream: argument {i} ({s:?}) is not a whole number");
                eprintln!("usage: packed_stream [THREADS] [ROWS]");
                std::process::exit(2)
            })
        })
    };
    let (threads, m) = (arg(1, 2).max(1), arg(2, 1).max(1));
    let pool = ThreadPool::new(threads);
    let Some(&isa) = Variant::available().last() else {
        eprintln!("packed_stream: this CPU runs no packed kernel (it needs AVX2 with FMA)");
        std::process::exit(1)
    };
    println!("{threads} threads, {m} rows, {isa:?}");
    for (label, n, k, copies) in SHAPES {
        let layout = NBitsLayout::new(n, k, 4, 32).expect("a valid layout");
        let matrices: Vec<PackedNBits> = (0..copies)
            .map(|c| {
                let codes: Vec<u8> = (0..n * layout.k_blocks * layout.blob_size)
                    .map(|i| (i * 7 + c) as u8)
                    .collect();
                let scales: Vec<f32> = (0..n * layout.k_blocks)
                    .map(|i| half::f16::from_f32(0.01 + (i % 7) as f32 * 0.001).to_f32())
                    .collect();
                let w = QuantWeights {
                    layout,
                    data: &codes,
                    scales: &scales,
                    zero_points: ZeroPoints::Default,
                };
                PackedNBits::pack(&w)
                    .expect("packs")
                    .expect("AVX2 runs this layout")
            })
            .collect();
        let bytes: usize = matrices.iter().map(PackedNBits::nbytes).sum();
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 13) % 17) as f32 - 8.0).collect();
        let mut out = vec![0f32; m * n];
        let rounds = (400_000_000 / bytes).max(2);
        let mut best = f64::MAX;
        for _ in 0..5 {
            let start = Instant::now();
            for _ in 0..rounds {
                for w in &matrices {
                    matmul_packed(&a, m, w, None, &mut out, &pool, isa).expect("runs");
                }
            }
            best = best.min(start.elapsed().as_secs_f64() / rounds as f64);
        }
        println!(
            "{label:>13} {n} x {k} ({copies}): {:.1} MB, {:.2} GB/s, {:.1} µs per call",
            bytes as f64 / 1e6,
            bytes as f64 / best / 1e9,
            best * 1e6 / copies as f64
        );
    }
}
