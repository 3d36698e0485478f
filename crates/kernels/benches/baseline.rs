//! Baseline benches of the reference kernels: MatMul, Add (broadcasting binary), ReduceMean and
//! Gather over f32, f16 and bf16 at small, medium and large shapes.
//!
//! Throughput: bytes read and written for add, reduce_mean and gather (memory-bound), elements
//! = floating-point operations (`2·M·K·N`) for matmul.
//!
//! Names read `family/dtype/shape/threads=N`, e.g. `matmul/f32/32x512x512/threads=1`. Kernels
//! that take a thread pool run at 1 and 2 threads; `broadcast::binary` and `gather::gather`
//! take none, so they run at threads=1 only. Each bench is kept short (10 samples, ~0.5 s) so
//! the file runs in a couple of minutes:
//! `cargo bench -p oxgen-kernels --bench baseline` (add `-- --test` to run each once).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

mod common;
use common::values;
use half::{bf16, f16};
use oxgen_kernels::acc::Accum;
use oxgen_kernels::reduce::{Lanes, ReduceOp, reduce};
use oxgen_kernels::{ThreadPool, broadcast, gather, matmul};

const THREADS: [usize; 2] = [1, 2];

/// `values` elements of `T` as a byte throughput.
fn bytes<T>(values: usize) -> Throughput {
    Throughput::Bytes((values * std::mem::size_of::<T>()) as u64)
}

fn configure<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    common::group(c, name, 500)
}

/// (M, K, N): one decode row, a small prefill chunk, a larger prefill chunk.
const MATMUL_SHAPES: [(usize, usize, usize); 3] =
    [(1, 576, 1536), (32, 512, 512), (128, 1024, 1024)];

fn matmul_typed<T: Accum>(c: &mut Criterion, dtype: &str, pools: &[ThreadPool]) {
    let mut g = configure(c, "matmul");
    for (m, k, n) in MATMUL_SHAPES {
        let (a, b) = (values::<T>(m * k, 1), values::<T>(k * n, 2));
        let mut out = vec![T::ZERO; m * n];
        g.throughput(Throughput::Elements(2 * (m * k * n) as u64));
        for pool in pools {
            g.bench_function(
                format!("{dtype}/{m}x{k}x{n}/threads={}", pool.threads()),
                |bench| {
                    bench.iter(|| {
                        matmul::matmul(black_box(&a), black_box(&b), &mut out, m, k, n, pool)
                            .expect("shapes match")
                    })
                },
            );
        }
    }
}

/// (A shape, B shape): same-shape, row-vector broadcast, and a large same-shape add.
const ADD_SHAPES: [(&[usize], &[usize]); 3] = [
    (&[1, 576], &[1, 576]),
    (&[128, 576], &[576]),
    (&[512, 4096], &[512, 4096]),
];

fn add_typed<T: Accum>(c: &mut Criterion, dtype: &str) {
    let mut g = configure(c, "add");
    for (a_dims, b_dims) in ADD_SHAPES {
        let (a, b) = (
            values::<T>(a_dims.iter().product(), 3),
            values::<T>(b_dims.iter().product(), 4),
        );
        let mut out = vec![T::ZERO; a.len()];
        g.throughput(bytes::<T>(2 * a.len() + b.len()));
        let dims = |d: &[usize]| d.iter().map(usize::to_string).collect::<Vec<_>>().join("x");
        g.bench_function(
            format!("{dtype}/{}+{}/threads=1", dims(a_dims), dims(b_dims)),
            |bench| {
                bench.iter(|| {
                    broadcast::binary(
                        black_box(&a),
                        a_dims,
                        black_box(&b),
                        b_dims,
                        &mut out,
                        a_dims,
                        T::add,
                    )
                })
            },
        );
    }
}

/// (rows, n): ReduceMean over the last axis, as LayerNorm graphs written with ReduceMean do.
const REDUCE_SHAPES: [(usize, usize); 3] = [(1, 576), (128, 576), (1024, 4096)];

fn reduce_mean_typed<T: Accum>(c: &mut Criterion, dtype: &str, pools: &[ThreadPool]) {
    let mut g = configure(c, "reduce_mean");
    for (rows, n) in REDUCE_SHAPES {
        let x = values::<T>(rows * n, 5);
        let mut out = vec![T::ZERO; rows];
        g.throughput(bytes::<T>(x.len()));
        for pool in pools {
            g.bench_function(
                format!("{dtype}/{rows}x{n}/threads={}", pool.threads()),
                |bench| {
                    bench.iter(|| {
                        let lanes = Lanes {
                            outer: rows,
                            n,
                            inner: 1,
                        };
                        reduce(ReduceOp::Mean, black_box(&x), lanes, &mut out, pool)
                            .expect("shapes match")
                    })
                },
            );
        }
    }
}

/// (vocab, hidden, indices): embedding lookups for one token, a prompt chunk, a long prompt.
const GATHER_SHAPES: [(usize, usize, usize); 3] =
    [(1024, 64, 1), (49152, 576, 32), (49152, 576, 512)];

fn gather_typed<T: Accum>(c: &mut Criterion, dtype: &str) {
    let mut g = configure(c, "gather");
    for (vocab, hidden, count) in GATHER_SHAPES {
        let table = values::<T>(vocab * hidden, 6);
        let ids: Vec<i64> = (0..count as i64)
            .map(|i| (i * 7919) % vocab as i64)
            .collect();
        let mut out = vec![T::ZERO; count * hidden];
        g.throughput(bytes::<T>(2 * out.len()));
        g.bench_function(
            format!("{dtype}/{vocab}x{hidden}/ids={count}/threads=1"),
            |bench| {
                bench.iter(|| {
                    gather::gather(
                        black_box(&table),
                        &[vocab, hidden],
                        0,
                        black_box(&ids),
                        &mut out,
                    )
                    .expect("indices are in range")
                })
            },
        );
    }
}

fn baseline(c: &mut Criterion) {
    let pools: Vec<ThreadPool> = THREADS.iter().map(|&t| ThreadPool::new(t)).collect();
    matmul_typed::<f32>(c, "f32", &pools);
    matmul_typed::<f16>(c, "f16", &pools);
    matmul_typed::<bf16>(c, "bf16", &pools);
    add_typed::<f32>(c, "f32");
    add_typed::<f16>(c, "f16");
    add_typed::<bf16>(c, "bf16");
    reduce_mean_typed::<f32>(c, "f32", &pools);
    reduce_mean_typed::<f16>(c, "f16", &pools);
    reduce_mean_typed::<bf16>(c, "bf16", &pools);
    gather_typed::<f32>(c, "f32");
    gather_typed::<f16>(c, "f16");
    gather_typed::<bf16>(c, "bf16");
}

criterion_group!(benches, baseline);
criterion_main!(benches);
