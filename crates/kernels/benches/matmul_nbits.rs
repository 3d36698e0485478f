//! `MatMulNBits` with int8 activations (accuracy_level 4) at the default model's shapes, on
//! the repacked tile kernel models run (weights packed once, as at load):
//!
//! - `matmul_nbits/q4_gemv/KxN/threads=T`: one decode row, 4-bit weights in blocks of 32 with
//!   a GGUF Q4_1 import's f16 scales and offsets; throughput in bytes of packed weights (what a
//!   decode step streams);
//! - `matmul_nbits/q8_gemv/KxN/threads=T`: the same with 8-bit weights (the output head);
//! - `matmul_nbits/q4_gemm/MxKxN/threads=T`: a batch of 8 decode rows and a 128-row prefill
//!   chunk; throughput in elements = floating-point operations (`2·M·K·N`);
//! - `matmul_nbits/q4_gemm_codes/8x576x3072/threads=T`: the batch of 8 with uint8 zero-point
//!   codes, as onnxruntime-genai int4 exports have them (the default model, a GGUF Q4_1
//!   import, has float zero points like the other q4 shapes here);
//! - `matmul_nbits/q8_gemm/8x576x49152/threads=T`: the 8-bit output head at batch 8, 28 MB
//!   streamed from beyond L2 each call; throughput in floating-point operations;
//! - `matmul_nbits/q4_reference/1xKxN/threads=T`: the scalar reference every fast variant
//!   equals bit for bit, for scale.
//!
//! KxN 576x192 is a K or V projection, 576x576 Q or O, 576x1536 gate or up, 1536x576 down,
//! 576x49152 the output head (each but the head fits L2 or L3 after the first call);
//! 576x262144 streams 94 MB, about what a decode step of the default model reads, from
//! memory on every call; 576x960 and 576x3072 are the grouped Q/K/V and gate/up matmuls
//! (one call over matrices packed side by side) that models actually run.
//! `cargo bench -p oxgen-kernels --bench matmul_nbits`

use std::hint::black_box;

use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
mod common;
use oxgen_kernels::ThreadPool;
use oxgen_kernels::int8::Variant;
use oxgen_kernels::nbits::{
    NBitsLayout, PackedNBits, QuantWeights, ZeroPoints, matmul_nbits_int8_reference, matmul_packed,
};
use oxgen_kernels::rng::Rng;

/// (K, N) of the decode rows.
const GEMV_SHAPES: [(usize, usize); 8] = [
    (576, 192),
    (576, 576),
    (576, 960),
    (576, 1536),
    (576, 3072),
    (1536, 576),
    (576, 49152),
    (576, 262144),
];

/// (M, K, N) of batched rows.
const GEMM_SHAPES: [(usize, usize, usize); 4] = [
    (8, 576, 3072),
    (8, 1536, 576),
    (128, 576, 3072),
    (128, 1536, 576),
];

/// Codes, scales and zero points for `layout`, and `m` rows of activations. 4-bit blocks
/// look like a GGUF Q4_1 import's: an f16 scale `d` and minimum `m` per block, stored as the
/// float zero point `−m/d`; 8-bit ones have default zero points, as the output head does.
struct Inputs {
    data: Vec<u8>,
    scales: Vec<f32>,
    zp: Vec<f32>,
    a: Vec<f32>,
}

fn inputs(layout: &NBitsLayout, m: usize, seed: u64) -> Inputs {
    let mut rng = Rng::new(seed);
    let mut next = || (rng.next_u64() >> 33) as u32;
    let f16 = |v: f32| half::f16::from_f32(v).to_f32();
    let blocks = layout.n * layout.k_blocks;
    let scales: Vec<f32> = (0..blocks)
        .map(|_| f16((next() % 100 + 1) as f32 * 1e-4))
        .collect();
    let zp = scales
        .iter()
        .map(|&d| -f16(-((next() % 100) as f32) * 1e-3) / d)
        .collect();
    Inputs {
        data: (0..blocks * layout.blob_size)
            .map(|_| next() as u8)
            .collect(),
        scales,
        zp,
        a: (0..m * layout.k)
            .map(|_| (next() % 2000) as f32 * 1e-3 - 1.0)
            .collect(),
    }
}

type Group<'a> = BenchmarkGroup<'a, criterion::measurement::WallTime>;

/// `matmul_nbits/NAME/threads=T` on the packed kernel at 1 and 2 threads; the throughput is
/// the packed bytes, or `2·M·K·N` elements when `flops`.
fn packed(g: &mut Group<'_>, name: &str, (m, k, n): (usize, usize, usize), bits: u32, flops: bool) {
    packed_zp(g, name, (m, k, n), bits, flops, false);
}

/// [`packed`], with `codes`: uint8 zero-point codes (an onnxruntime-genai int4 export's)
/// instead of the Q4_1 floats or the default.
fn packed_zp(
    g: &mut Group<'_>,
    name: &str,
    (m, k, n): (usize, usize, usize),
    bits: u32,
    flops: bool,
    codes: bool,
) {
    let layout = NBitsLayout::new(n, k, bits, 32).expect("a valid layout");
    let Inputs {
        data,
        scales,
        zp,
        a,
    } = inputs(&layout, m, 2);
    let zp_codes: Vec<u8> = (0..n * layout.zp_row_bytes)
        .map(|i| (i * 37 % 251) as u8)
        .collect();
    let w = QuantWeights {
        layout,
        data: &data,
        scales: &scales,
        zero_points: match (codes, bits) {
            (true, _) => ZeroPoints::Packed(&zp_codes),
            (false, 4) => ZeroPoints::Float(&zp),
            (false, _) => ZeroPoints::Default,
        },
    };
    let packed = PackedNBits::pack(&w)
        .expect("valid")
        .expect("the tile kernel runs on this CPU (AVX2 and FMA)");
    g.throughput(if flops {
        Throughput::Elements(2 * (m * k * n) as u64)
    } else {
        Throughput::Bytes(packed.nbytes() as u64)
    });
    // The output 64-byte aligned, as the executor's buffers are (else the lines at the
    // parts' edges are written by both threads).
    let mut buf = vec![0f32; m * n + 16];
    let off = (64 - buf.as_ptr() as usize % 64) % 64 / 4;
    let out = &mut buf[off..off + m * n];
    for pool in [ThreadPool::new(1), ThreadPool::new(2)] {
        g.bench_function(format!("{name}/threads={}", pool.threads()), |b| {
            b.iter(|| {
                matmul_packed(black_box(&a), m, &packed, None, out, &pool, Variant::best())
                    .expect("valid")
            })
        });
    }
}

fn bench(c: &mut Criterion) {
    let mut g = common::group(c, "matmul_nbits", 700);
    for (k, n) in GEMV_SHAPES {
        packed(&mut g, &format!("q4_gemv/{k}x{n}"), (1, k, n), 4, false);
    }
    for (k, n) in [(576, 576), (576, 49152)] {
        packed(&mut g, &format!("q8_gemv/{k}x{n}"), (1, k, n), 8, false);
    }
    for (m, k, n) in GEMM_SHAPES {
        packed(&mut g, &format!("q4_gemm/{m}x{k}x{n}"), (m, k, n), 4, true);
    }
    // Gate and up at batch 8 with an onnxruntime-genai export's zero-point codes.
    packed_zp(
        &mut g,
        "q4_gemm_codes/8x576x3072",
        (8, 576, 3072),
        4,
        true,
        true,
    );
    // The output head at batch 8: 28 MB, streamed from beyond L2 on every call.
    packed(&mut g, "q8_gemm/8x576x49152", (8, 576, 49152), 8, true);

    let (m, k, n) = (1, 576, 1536);
    let layout = NBitsLayout::new(n, k, 4, 32).expect("a valid layout");
    let inp = inputs(&layout, m, 1);
    let w = QuantWeights {
        layout,
        data: &inp.data,
        scales: &inp.scales,
        zero_points: ZeroPoints::Float(&inp.zp),
    };
    let mut out = vec![0f32; m * n];
    g.throughput(Throughput::Bytes(
        (inp.data.len() + 8 * inp.scales.len()) as u64,
    ));
    for pool in [ThreadPool::new(1), ThreadPool::new(2)] {
        g.bench_function(
            format!("q4_reference/{m}x{k}x{n}/threads={}", pool.threads()),
            |b| {
                b.iter(|| {
                    matmul_nbits_int8_reference(black_box(&inp.a), m, &w, None, &mut out, &pool)
                        .expect("valid")
                })
            },
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
