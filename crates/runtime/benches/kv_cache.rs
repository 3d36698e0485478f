//! The paged KV bookkeeping ([`oxgen_runtime::BlockPool`]) a scheduler runs every step:
//! reserving and releasing a sequence's blocks, making room for a decode token (a new block
//! every 16 positions), and looking up a prompt's prefix in the cache.
//!
//! `cargo bench -p oxgen-runtime --bench kv_cache` (add `-- --test` to run each once).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use oxgen_runtime::BlockPool;

const BLOCK: usize = 16;

fn ids(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) ^ salt)
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("kv_cache");
    g.sample_size(20)
        .measurement_time(Duration::from_millis(800));

    // A sequence of 2048 positions: reserve, fill block by block, release.
    let mut pool = BlockPool::new(4096, BLOCK).unwrap();
    g.bench_function("alloc_free/2048_positions", |b| {
        b.iter(|| {
            let mut t = pool.reserve(2048).unwrap();
            for pos in (0..2048).step_by(BLOCK) {
                pool.prepare_write(&mut t, pos, pos + BLOCK).unwrap();
            }
            pool.release(black_box(t));
        })
    });

    // One decode token's bookkeeping: the position's block (a fresh one at block starts).
    g.bench_function("decode_token", |b| {
        let mut t = pool.reserve(1 << 15).unwrap();
        let mut pos = 0;
        b.iter(|| {
            if pos == 1 << 15 {
                pool.release(std::mem::take(&mut t));
                t = pool.reserve(1 << 15).unwrap();
                pos = 0;
            }
            pool.prepare_write(&mut t, pos, pos + 1).unwrap();
            pos += 1;
        });
        pool.release(t);
    });

    // Prefix lookup of a 1024-id prompt whose first 512 ids are cached (32 blocks hit, the
    // 33rd missed), then releasing the attached blocks.
    let mut cached = BlockPool::new(4096, BLOCK).unwrap();
    let shared = ids(512, 1);
    let mut owner = cached.reserve(512).unwrap();
    cached.prepare_write(&mut owner, 0, 512).unwrap();
    cached.register_full(&mut owner, &shared);
    let mut prompt = shared.clone();
    prompt.extend(ids(512, 2));
    g.bench_function("prefix_lookup/32_of_64_blocks", |b| {
        b.iter(|| {
            let mut t = cached.reserve(1024).unwrap();
            let hit = cached.attach_prefix(&mut t, black_box(&prompt), prompt.len() - 1);
            assert_eq!(hit, 512);
            cached.release(t);
        })
    });
    // Registering 64 full blocks of a new sequence's ids.
    g.bench_function("prefix_register/64_blocks", |b| {
        let p = ids(1024, 3);
        b.iter(|| {
            let mut t = cached.reserve(1024).unwrap();
            cached.prepare_write(&mut t, 0, 1024).unwrap();
            cached.register_full(&mut t, black_box(&p));
            cached.release(t);
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
