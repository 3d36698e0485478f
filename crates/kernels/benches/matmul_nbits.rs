//! `MatMulNBits` with 4-bit weights in blocks of 32 and int8 activations (accuracy_level 4),
//! at the default model's shapes: the fast kernel and its reference, 1 and 2 threads.
//! Names read `matmul_nbits/q4_int8_{fast,reference}/MxKxN/threads=T`; the repacked kernel
//! (what models run) `matmul_nbits/packed_qB/MxKxN/threads=T`, with its throughput in bytes
//! of packed weights, at the default model's decode shapes (Q/K/V and gate/up grouped, the
//! 8-bit output head) and a prefill chunk.
//! `cargo bench -p oxgen-kernels --bench matmul_nbits`

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use oxgen_kernels::ThreadPool;
use oxgen_kernels::matmul_nbits::{NBitsLayout, QuantWeights, ZeroPoints};
use oxgen_kernels::matmul_nbits_int8::{matmul_nbits_int8, matmul_nbits_int8_reference};
use oxgen_kernels::nbits_avx2::Isa;
use oxgen_kernels::nbits_packed::{PackedNBits, matmul_packed};

/// (M, K, N): decode rows of the MLP up/down projections and the output head, a prefill chunk.
const SHAPES: [(usize, usize, usize); 4] = [
    (1, 576, 1536),
    (1, 1536, 576),
    (1, 576, 49152),
    (128, 576, 1536),
];

/// (M, K, N, bits) for the repacked kernel.
const PACKED_SHAPES: [(usize, usize, usize, u32); 6] = [
    (1, 576, 960, 4),
    (1, 576, 3072, 4),
    (1, 1536, 576, 4),
    (1, 576, 49152, 8),
    (8, 576, 3072, 4),
    (128, 576, 3072, 4),
];

/// Pseudo-random codes, scales and float zero points (not f16 values, like a GGUF Q4_1
/// import's) for `layout`, and `m` rows of activations.
struct Inputs {
    data: Vec<u8>,
    scales: Vec<f32>,
    zp: Vec<f32>,
    a: Vec<f32>,
}

fn inputs(layout: &NBitsLayout, m: usize, seed: u64) -> Inputs {
    let mut s = seed;
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) as u32
    };
    let blocks = layout.n * layout.k_blocks;
    Inputs {
        data: (0..blocks * layout.blob_size)
            .map(|_| next() as u8)
            .collect(),
        scales: (0..blocks).map(|_| (next() % 100) as f32 * 1e-4).collect(),
        zp: (0..blocks).map(|_| (next() % 16) as f32 + 0.3).collect(),
        a: (0..m * layout.k)
            .map(|_| (next() % 2000) as f32 * 1e-3 - 1.0)
            .collect(),
    }
}

fn bench_packed(c: &mut Criterion) {
    let mut g = c.benchmark_group("matmul_nbits");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(700));
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    for (m, k, n, bits) in PACKED_SHAPES {
        let layout = NBitsLayout::new(n, k, bits, 32).expect("a valid layout");
        let Inputs {
            data,
            scales,
            zp,
            a,
        } = inputs(&layout, m, 2);
        // 4-bit layers carry float zero points (GGUF Q4_1 imports), the 8-bit head none.
        let w = QuantWeights {
            layout,
            data: &data,
            scales: &scales,
            zero_points: if bits == 4 {
                ZeroPoints::Float(&zp)
            } else {
                ZeroPoints::Default
            },
        };
        let packed = PackedNBits::pack(&w)
            .expect("valid")
            .expect("AVX2 is available");
        g.throughput(Throughput::Bytes(packed.nbytes() as u64));
        let mut out = vec![0f32; m * n];
        for pool in &pools {
            let t = pool.threads();
            g.bench_function(format!("packed_q{bits}/{m}x{k}x{n}/threads={t}"), |b| {
                b.iter(|| {
                    matmul_packed(black_box(&a), m, &packed, None, &mut out, pool, Isa::best())
                        .expect("valid")
                })
            });
        }
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("matmul_nbits");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(700));
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    for (m, k, n) in SHAPES {
        let layout = NBitsLayout::new(n, k, 4, 32).expect("a valid layout");
        let Inputs {
            data,
            scales,
            zp,
            a,
        } = inputs(&layout, m, 1);
        let w = QuantWeights {
            layout,
            data: &data,
            scales: &scales,
            zero_points: ZeroPoints::Float(&zp),
        };
        let mut out = vec![0f32; m * n];
        for pool in &pools {
            let t = pool.threads();
            g.bench_function(format!("q4_int8_fast/{m}x{k}x{n}/threads={t}"), |b| {
                b.iter(|| {
                    matmul_nbits_int8(black_box(&a), m, &w, None, &mut out, pool).expect("valid")
                })
            });
            if m == 1 && n <= 1536 {
                g.bench_function(format!("q4_int8_reference/{m}x{k}x{n}/threads={t}"), |b| {
                    b.iter(|| {
                        matmul_nbits_int8_reference(black_box(&a), m, &w, None, &mut out, pool)
                            .expect("valid")
                    })
                });
            }
        }
    }
}

criterion_group!(benches, bench, bench_packed);
criterion_main!(benches);
