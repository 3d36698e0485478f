//! The decoder layer's kernels besides the matmuls, at the default model's shapes
//! (SmolLM2-135M: hidden 576, 9 query heads and 3 KV heads of 64), on the kernels models run
//! (AVX2 / AVX-512 where the CPU has them), at 1 and 2 threads:
//!
//! - `gqa/decode/past=P/threads=T`: one query row per head against `P + 1` cached positions;
//!   throughput in bytes of K and V read (the cache is what decode attention streams);
//! - `gqa/paged_decode/batch=B,past=P/threads=T`: a decode step of `B` sequences over a paged
//!   cache (blocks of 16 positions, each sequence's blocks scattered through the pool), one
//!   layer per iteration out of 30 layers' pools, so the cache streams from beyond L2 as in a
//!   served model; bytes of K and V read;
//! - `gqa/paged_decode/1.5b,layers=L,batch=1,past=P,kv=K/threads=T`: the same at Qwen2.5-1.5B's
//!   attention shape (12 query heads on 2 KV heads of 128), over `L` layers' pools: 1 (16.8 MB
//!   of f32 keys and values at 8192 positions: from L3) or 8 (from DRAM); past 255 runs from L2;
//! - `gqa/paged_prefill/past=7680,new=256,kv=f32/threads=T`: a prefill chunk deep in a long
//!   prompt (256 rows after 7680 positions, each row over 30 tiles of keys); bytes of K and V;
//! - `gqa/prefill/seq=128/threads=T`: 128 causal query rows from an empty cache; throughput in
//!   elements = floating-point operations (`2·2·heads·head_size` per query-key pair seen);
//! - `rmsnorm/RxN/threads=T` (RMSNormalization) and `rmsnorm/skip/RxN/threads=T` (the fused
//!   residual add + RMSNorm layers run); bytes read and written;
//! - `rotary/seq=S/threads=T`: RoPE over a layer's query heads; bytes read and written;
//! - `softmax/RxN/threads=T`: over the last axis; bytes read and written;
//! - `silu_mul/RxN`: the gated SiLU of the MLP (`g · sigmoid(g) · u`, the f64 sigmoid) on one
//!   thread; bytes read and written.
//!
//! `cargo bench -p oxgen-kernels --bench layers` (add `-- --test` to run each once).

use std::hint::black_box;

use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};

mod common;
use oxgen_kernels::ThreadPool;
use oxgen_kernels::attention::kv::{CacheElem, Cached};
use oxgen_kernels::attention::paged::{
    PagedBatch, PagedLayout, Segment, paged_attention, paged_scratch_len,
};
use oxgen_kernels::attention::{GqaInputs, GqaShape, Rows, ScoreMod, attention, scratch_len};
use oxgen_kernels::norm::{NormRows, Residual, rms_norm, skip_rms_norm};
use oxgen_kernels::rotary::{HeadsShape, Positions, Rope, rotary};
use oxgen_kernels::sigmoid::silu_mul;
use oxgen_kernels::softmax::{SoftmaxKind, softmax};

const HIDDEN: usize = 576;
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_SIZE: usize = 64;
const F32: u64 = 4;

fn values(len: usize, seed: u64) -> Vec<f32> {
    common::values(len, seed)
}

fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> BenchmarkGroup<'a, criterion::measurement::WallTime> {
    common::group(c, name, 600)
}

fn pools() -> [ThreadPool; 2] {
    [ThreadPool::new(1), ThreadPool::new(2)]
}

/// Attention of `seq` new query rows starting at position `start` over a cache of
/// `start + seq` positions.
fn bench_attention(
    g: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    start: usize,
    seq: usize,
    pools: &[ThreadPool],
) {
    let capacity = start + seq;
    let shape = GqaShape {
        batch: 1,
        seq,
        heads: HEADS,
        kv_heads: KV_HEADS,
        head_size: HEAD_SIZE,
        capacity,
    };
    let score = ScoreMod {
        scale: 1.0 / (HEAD_SIZE as f32).sqrt(),
        softcap: 0.0,
        window: None,
        sinks: None,
    };
    let q = values(seq * HEADS * HEAD_SIZE, 1);
    let cache = KV_HEADS * capacity * HEAD_SIZE;
    let (k, v) = (values(cache, 2), values(cache, 3));
    let mut out = vec![0f32; seq * HEADS * HEAD_SIZE];
    let rows = Rows {
        data: &q,
        stride: HEADS * HEAD_SIZE,
        offset: 0,
    };
    for pool in pools {
        let mut scratch = vec![0f32; scratch_len(&shape, pool)];
        g.bench_function(format!("{name}/threads={}", pool.threads()), |b| {
            b.iter(|| {
                attention(
                    &shape,
                    &score,
                    GqaInputs {
                        q: *black_box(&rows),
                        k: &k,
                        v: &v,
                        start: &[start],
                        kv_len: &[capacity],
                    },
                    &mut out,
                    &mut scratch,
                    pool,
                )
                .expect("shapes match")
            })
        });
    }
}

/// The attention shape of a model: query heads, KV heads, head size; a named one's rows say
/// its name and layer count.
#[derive(Clone, Copy)]
struct Heads {
    name: Option<&'static str>,
    heads: usize,
    kv_heads: usize,
    head_size: usize,
}

/// The default model's.
const SMOL: Heads = Heads {
    name: None,
    heads: HEADS,
    kv_heads: KV_HEADS,
    head_size: HEAD_SIZE,
};

/// Qwen2.5-1.5B's: six query heads share each of two KV heads of 128.
const QWEN_1_5B: Heads = Heads {
    name: Some("1.5b"),
    heads: 12,
    kv_heads: 2,
    head_size: 128,
};

/// One decode row for each of `batch` sequences of `past + 1` positions, over one layer's
/// pool of `C` per iteration, cycling through `layers` layers (enough that the pools stream
/// from beyond the L3 cache).
fn bench_paged_decode<C: CacheElem>(
    g: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    shape: Heads,
    (batch, past, layers): (usize, usize, usize),
    pools: &[ThreadPool],
) {
    bench_paged::<C>(g, shape, (batch, past, 1, layers), pools);
}

/// [`bench_paged_decode`] with `new` rows per sequence (`new > 1`: a prefill chunk,
/// named `paged_prefill`).
fn bench_paged<C: CacheElem>(
    g: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    shape: Heads,
    (batch, past, new, layers): (usize, usize, usize, usize),
    pools: &[ThreadPool],
) {
    let Heads {
        heads,
        kv_heads,
        head_size,
        ..
    } = shape;
    const BLOCK: usize = 16;
    let per_seq = (past + new).div_ceil(BLOCK);
    let layout = PagedLayout::dense(batch * per_seq, BLOCK, kv_heads, head_size);
    // Sequence s owns blocks s, s + batch, s + 2·batch, …: interleaved as a busy pool leaves
    // them.
    let tables: Vec<u32> = (0..batch)
        .flat_map(|s| (0..per_seq).map(move |i| (i * batch + s) as u32))
        .collect();
    let segments: Vec<Segment> = (0..batch)
        .map(|s| Segment {
            rows: s * new..(s + 1) * new,
            start: past,
            table: s * per_seq..(s + 1) * per_seq,
        })
        .collect();
    let cache = layout.cache_len().expect("small pool");
    // A pool of `C`: every head vector encoded, with its scale where `C` has one.
    let encode = |seed: u64| {
        let x = values(cache, seed);
        let mut pool = (vec![C::ZERO; cache], Vec::new());
        for (src, dst) in x.chunks(head_size).zip(pool.0.chunks_mut(head_size)) {
            let scale = C::encode(src, dst);
            if C::SCALED {
                pool.1.push(scale);
            }
        }
        pool
    };
    let pools_of: Vec<_> = (0..layers as u64)
        .map(|l| (encode(10 + 2 * l), encode(11 + 2 * l)))
        .collect();
    let score = ScoreMod {
        scale: 1.0 / (head_size as f32).sqrt(),
        softcap: 0.0,
        window: None,
        sinks: None,
    };
    let q = values(batch * new * heads * head_size, 1);
    let rows = Rows {
        data: &q,
        stride: heads * head_size,
        offset: 0,
    };
    let mut out = vec![0f32; batch * new * heads * head_size];
    let head_bytes = head_size * std::mem::size_of::<C>() + if C::SCALED { 4 } else { 0 };
    g.throughput(Throughput::Bytes(
        2 * (batch * kv_heads * (past + new) * head_bytes) as u64,
    ));
    let kind = format!("{:?}", C::KIND).to_lowercase();
    for pool in pools {
        let mut scratch = vec![0f32; paged_scratch_len(&layout, heads, &segments, pool)];
        let mut layer = 0;
        let model = (shape.name).map_or(String::new(), |name| format!("{name},layers={layers},"));
        let name = match new {
            1 => format!("paged_decode/{model}batch={batch},past={past},kv={kind}"),
            _ => format!("paged_prefill/{model}past={past},new={new},kv={kind}"),
        };
        let name = format!("{name}/threads={}", pool.threads());
        g.bench_function(name, |b| {
            b.iter(|| {
                layer = (layer + 1) % layers;
                let (k, v) = &pools_of[layer];
                paged_attention(
                    PagedBatch {
                        heads,
                        layout: &layout,
                        segments: &segments,
                        tables: &tables,
                    },
                    &score,
                    black_box(&rows),
                    (
                        Cached {
                            values: &k.0,
                            scales: &k.1,
                        },
                        Cached {
                            values: &v.0,
                            scales: &v.1,
                        },
                    ),
                    &mut out,
                    &mut scratch,
                    pool,
                )
                .expect("shapes match")
            })
        });
    }
}

fn gqa(c: &mut Criterion) {
    let pools = pools();
    let mut g = group(c, "gqa");
    for past in [128, 1024, 4096] {
        let kv_bytes = 2 * (KV_HEADS * (past + 1) * HEAD_SIZE) as u64 * F32;
        g.throughput(Throughput::Bytes(kv_bytes));
        bench_attention(&mut g, &format!("decode/past={past}"), past, 1, &pools);
    }
    bench_paged_decode::<f32>(&mut g, SMOL, (8, 128, 30), &pools);
    // Each cache element, at a short context and at a long one where attention streams the KV.
    for past in [128, 4096] {
        bench_paged_decode::<f32>(&mut g, SMOL, (1, past, 30), &pools);
        bench_paged_decode::<half::f16>(&mut g, SMOL, (1, past, 30), &pools);
        bench_paged_decode::<i8>(&mut g, SMOL, (1, past, 30), &pools);
    }
    // A 1.5B model's layer at depth 8192 (f32: 16.8 MB of keys and values per layer).
    bench_paged_decode::<f32>(&mut g, QWEN_1_5B, (1, 255, 1), &pools);
    for layers in [1, 8] {
        bench_paged_decode::<f32>(&mut g, QWEN_1_5B, (1, 8192, layers), &pools);
        bench_paged_decode::<half::f16>(&mut g, QWEN_1_5B, (1, 8192, layers), &pools);
        bench_paged_decode::<i8>(&mut g, QWEN_1_5B, (1, 8192, layers), &pools);
    }
    // A prefill chunk deep in a long prompt: 256 rows after 7680 positions.
    bench_paged::<f32>(&mut g, SMOL, (1, 7680, 256, 1), &pools);
    let seq = 128;
    // Row s sees s + 1 keys: (QK dot + weighted V sum) × 2 flops per multiply-add.
    let pairs = (seq * (seq + 1) / 2 * HEADS) as u64;
    g.throughput(Throughput::Elements(pairs * 4 * HEAD_SIZE as u64));
    bench_attention(&mut g, &format!("prefill/seq={seq}"), 0, seq, &pools);
}

fn rmsnorm(c: &mut Criterion) {
    let pools = pools();
    let mut g = group(c, "rmsnorm");
    let gamma = values(HIDDEN, 4);
    for rows in [1, 8, 128] {
        let n = rows * HIDDEN;
        let (x, skip) = (values(n, 5), values(n, 6));
        let (mut out, mut sum) = (vec![0f32; n], vec![0f32; n]);
        for pool in &pools {
            let t = pool.threads();
            g.throughput(Throughput::Bytes(2 * n as u64 * F32));
            g.bench_function(format!("{rows}x{HIDDEN}/threads={t}"), |b| {
                b.iter(|| {
                    rms_norm(
                        NormRows {
                            x: black_box(&x),
                            rows,
                            n: HIDDEN,
                            epsilon: 1e-5,
                        },
                        &gamma,
                        &mut out,
                        pool,
                    )
                    .expect("shapes match")
                })
            });
            // Reads x and the skip, writes the normalized row and the sum.
            g.throughput(Throughput::Bytes(4 * n as u64 * F32));
            g.bench_function(format!("skip/{rows}x{HIDDEN}/threads={t}"), |b| {
                b.iter(|| {
                    skip_rms_norm(
                        NormRows {
                            x: black_box(&x),
                            rows,
                            n: HIDDEN,
                            epsilon: 1e-5,
                        },
                        Residual {
                            skip: &skip,
                            bias: None,
                        },
                        &gamma,
                        &mut out,
                        Some(&mut sum),
                        None,
                        pool,
                    )
                    .expect("shapes match")
                })
            });
        }
    }
}

fn rope(c: &mut Criterion) {
    let pools = pools();
    let mut g = group(c, "rotary");
    let (half, positions) = (HEAD_SIZE / 2, 2048);
    let (cos, sin) = (values(positions * half, 7), values(positions * half, 8));
    let rope = Rope::new(&cos, &sin, half, false).expect("whole rows");
    for seq in [1, 128] {
        let shape = HeadsShape {
            batch: 1,
            seq,
            heads: HEADS,
            head_size: HEAD_SIZE,
            heads_first: false,
        };
        let x = values(seq * HEADS * HEAD_SIZE, 9);
        let mut out = vec![0f32; x.len()];
        g.throughput(Throughput::Bytes(2 * x.len() as u64 * F32));
        for pool in &pools {
            g.bench_function(format!("seq={seq}/threads={}", pool.threads()), |b| {
                b.iter(|| {
                    rotary(
                        black_box(&x),
                        &shape,
                        Positions::Offset(100),
                        &rope,
                        &mut out,
                        pool,
                    )
                    .expect("positions in range")
                })
            });
        }
    }
}

fn softmax_rows(c: &mut Criterion) {
    let pools = pools();
    let mut g = group(c, "softmax");
    // A vocabulary row, and a prefill chunk's attention scores (heads × rows × keys).
    for (rows, n) in [(1, 49152), (HEADS * 128, 128)] {
        let x = values(rows * n, 10);
        let mut out = vec![0f32; x.len()];
        g.throughput(Throughput::Bytes(2 * x.len() as u64 * F32));
        for pool in &pools {
            g.bench_function(format!("{rows}x{n}/threads={}", pool.threads()), |b| {
                b.iter(|| {
                    softmax(
                        SoftmaxKind::Softmax,
                        black_box(&x),
                        rows,
                        n,
                        1,
                        &mut out,
                        pool,
                    )
                    .expect("shapes match")
                })
            });
        }
    }
}

fn gated_silu(c: &mut Criterion) {
    let mut g = group(c, "silu_mul");
    for rows in [1, 8] {
        let n = rows * 1536;
        let (gate, up) = (values(n, 11), values(n, 12));
        let mut out = vec![0f32; n];
        g.throughput(Throughput::Bytes(3 * n as u64 * F32));
        g.bench_function(format!("{rows}x1536"), |b| {
            b.iter(|| silu_mul(black_box(&gate), &up, &mut out))
        });
    }
}

/// One parallel region with next to no work per task: what every kernel call over the pool
/// pays to post a job and wait for its end (a decode step runs ~100-300 of them).
fn pool_region(c: &mut Criterion) {
    let mut g = group(c, "pool");
    let pool = ThreadPool::new(2);
    let hits = std::sync::atomic::AtomicUsize::new(0);
    g.bench_function("region/tasks=2,threads=2", |b| {
        b.iter(|| {
            pool.run(2, &|i| {
                hits.fetch_add(black_box(i), std::sync::atomic::Ordering::Relaxed);
            })
        })
    });
}

criterion_group!(
    benches,
    gqa,
    rmsnorm,
    rope,
    softmax_rows,
    gated_silu,
    pool_region
);
criterion_main!(benches);
