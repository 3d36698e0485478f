//! Tests of the paged attention kernels: paged rows against contiguous ones, batches against
//! sequences alone, a fused step against its three calls, bit for bit.

use super::*;
use crate::attention::group::{KV_TILE, RowKeys, attend_rows, row_scratch_len};
use crate::attention::{GqaInputs, GqaShape, attention, scratch_len};
use crate::rng::Rng;

/// An unscaled pool's memory.
fn plain<C: CacheElem>(values: &mut [C]) -> KvMem<'_, C> {
    KvMem {
        values,
        scales: &mut [],
    }
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u32) -> Vec<f32> {
    Rng::new(seed.into()).values(n, 1.0)
}

/// A batch of sequences `(positions before, new rows)` stacked row after row, each with
/// the blocks it needs taken from the top of a pool of `blocks` (so the sequences'
/// blocks interleave): the block tables, the segments and the rows in all.
fn stack(seqs: &[(usize, usize)], bs: usize, blocks: usize) -> (Vec<u32>, Vec<Segment>, usize) {
    let mut free: Vec<u32> = (0..blocks as u32).collect();
    let (mut tables, mut segments, mut row) = (Vec::new(), Vec::new(), 0);
    for &(past, new) in seqs {
        let t0 = tables.len();
        tables.extend((0..(past + new).div_ceil(bs)).map(|_| free.pop().unwrap()));
        segments.push(Segment {
            rows: row..row + new,
            start: past,
            table: t0..tables.len(),
        });
        row += new;
    }
    (tables, segments, row)
}

/// One sequence of `len` positions attended contiguously, and the same in a paged pool
/// with scattered blocks inside a batch with another sequence: identical bits.
fn check(len: usize, new: usize, bs: usize, hs: usize, window: Option<usize>, threads: usize) {
    let (heads, kv_heads) = (4, 2);
    let pool = ThreadPool::new(threads);
    let keys = values(kv_heads * len * hs, 1);
    let vals = values(kv_heads * len * hs, 2);
    let q = values(new * heads * hs, 3);
    // Half the cases with attention sinks, one per head.
    let sinks = [0.5, -1.0, 2.0, 0.0];
    let score = ScoreMod {
        scale: 0.3,
        softcap: 0.0,
        window,
        sinks: (len % 2 == 1).then_some(&sinks[..]),
    };
    // Contiguous: the last `new` positions as queries.
    let shape = GqaShape {
        batch: 1,
        seq: new,
        heads,
        kv_heads,
        head_size: hs,
        capacity: len,
    };
    let rows = Rows {
        data: &q[..],
        stride: heads * hs,
        offset: 0,
    };
    let mut want = vec![0f32; heads * new * hs];
    let mut scratch = vec![0f32; scratch_len(&shape, &pool)];
    attention(
        &shape,
        &score,
        GqaInputs {
            q: rows,
            k: &keys,
            v: &vals,
            start: &[len - new],
            kv_len: &[len],
        },
        &mut want,
        &mut scratch,
        &pool,
    )
    .unwrap();

    // Paged: an unrelated 3-row sequence first, then ours, blocks in reverse order.
    let blocks = len.div_ceil(bs) + 4;
    let layout = PagedLayout::dense(blocks, bs, kv_heads, hs);
    let cache = layout.cache_len().unwrap();
    let (mut kp, mut vp) = (values(cache, 4), values(cache, 5));
    let ours: Vec<u32> = (0..len.div_ceil(bs) as u32).rev().map(|b| b + 1).collect();
    let mut tables = vec![0u32];
    tables.extend(&ours);
    for (p, b) in (0..len).map(|p| (p, ours[p / bs])) {
        for h in 0..kv_heads {
            let at = layout.head_start(b, h) + p % bs * hs;
            kp[at..at + hs].copy_from_slice(&keys[(h * len + p) * hs..][..hs]);
            vp[at..at + hs].copy_from_slice(&vals[(h * len + p) * hs..][..hs]);
        }
    }
    let other = values(3 * heads * hs, 6);
    let mut q2 = other.clone();
    q2.extend(&q);
    let segments = [
        Segment {
            rows: 0..3,
            start: 0,
            table: 0..1,
        },
        Segment {
            rows: 3..3 + new,
            start: len - new,
            table: 1..1 + ours.len(),
        },
    ];
    let tokens = 3 + new;
    let mut got = vec![0f32; heads * tokens * hs];
    let mut scratch = vec![0f32; paged_scratch_len(&layout, heads, &segments, &pool)];
    let rows = Rows {
        data: &q2[..],
        stride: heads * hs,
        offset: 0,
    };
    paged_attention(
        PagedBatch {
            heads,
            layout: &layout,
            segments: &segments,
            tables: &tables,
        },
        &score,
        &rows,
        (Cached::plain(&kp), Cached::plain(&vp)),
        &mut got,
        &mut scratch,
        &pool,
    )
    .unwrap();
    for h in 0..heads {
        for s in 0..new {
            let a = &want[(h * new + s) * hs..][..hs];
            let b = &got[((3 + s) * heads + h) * hs..][..hs];
            let (a, b): (Vec<u32>, Vec<u32>) = (
                a.iter().map(|x| x.to_bits()).collect(),
                b.iter().map(|x| x.to_bits()).collect(),
            );
            assert_eq!(a, b, "head {h} row {s} (len {len}, bs {bs}, hs {hs})");
        }
    }
}

#[test]
fn paged_rows_equal_contiguous_rows_bit_for_bit() {
    for (len, new, bs, hs, window, threads) in [
        (1, 1, 16, 8, None, 1),
        (37, 1, 16, 64, None, 2),
        (37, 5, 4, 64, None, 2),
        (64, 64, 16, 32, None, 3),
        (50, 7, 8, 12, None, 1),
        (50, 7, 16, 64, Some(9), 2),
        (300, 2, 32, 64, None, 2),
    ] {
        check(len, new, bs, hs, window, threads);
    }
}

/// A decode batch of sequences of different lengths with a prefill chunk among them: at
/// 1-3 threads (cuts between sequences, KV heads and inside a group), and with the pools
/// as strided views of one buffer, each row's bits are what it gets when its sequence
/// runs alone.
#[test]
fn batched_rows_equal_rows_alone_at_any_thread_count() {
    let (heads, kv_heads, hs, bs) = (6, 2, 64, 16);
    // (positions before, new rows)
    let seqs: [(usize, usize); 7] = [(4, 1), (39, 1), (16, 1), (29, 4), (0, 1), (63, 1), (100, 1)];
    let per_seq: Vec<usize> = seqs.iter().map(|&(p, n)| (p + n).div_ceil(bs)).collect();
    let layout = PagedLayout::dense(per_seq.iter().sum::<usize>() + 3, bs, kv_heads, hs);
    let cache = layout.cache_len().unwrap();
    let (kp, vp) = (values(cache, 7), values(cache, 8));
    let (tables, segments, tokens) = stack(&seqs, bs, layout.blocks);
    let q = values(tokens * heads * hs, 9);
    let score = ScoreMod {
        scale: 0.125,
        softcap: 0.0,
        window: None,
        sinks: None,
    };
    // The same pools interleaved in one buffer, as a store keeping several layers'
    // blocks together lays them out: per block, junk, then the keys, then the values.
    let block = layout.block_len();
    let strided = PagedLayout {
        block_stride: 3 * block,
        ..layout
    };
    let mut both = values(layout.blocks * 3 * block, 10);
    for b in 0..layout.blocks {
        let at = b * 3 * block;
        both[at + block..at + 2 * block].copy_from_slice(&kp[b * block..][..block]);
        both[at + 2 * block..at + 3 * block].copy_from_slice(&vp[b * block..][..block]);
    }
    let run_on = |layout: &PagedLayout,
                  k: &[f32],
                  v: &[f32],
                  segments: &[Segment],
                  q: &[f32],
                  threads: usize| {
        let pool = ThreadPool::new(threads);
        let tokens = segments.last().unwrap().rows.end;
        let mut out = vec![0f32; tokens * heads * hs];
        let mut scratch = vec![0f32; paged_scratch_len(layout, heads, segments, &pool)];
        let rows = Rows {
            data: q,
            stride: heads * hs,
            offset: 0,
        };
        paged_attention(
            PagedBatch {
                heads,
                layout,
                segments,
                tables: &tables,
            },
            &score,
            &rows,
            (Cached::plain(k), Cached::plain(v)),
            &mut out,
            &mut scratch,
            &pool,
        )
        .unwrap();
        out.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
    };
    let run = |segments: &[Segment], q: &[f32], threads: usize| {
        run_on(&layout, &kp, &vp, segments, q, threads)
    };
    let width = heads * hs;
    let alone: Vec<u32> = segments
        .iter()
        .flat_map(|s| {
            let one = [Segment {
                rows: 0..s.rows.len(),
                ..s.clone()
            }];
            run(&one, &q[s.rows.start * width..s.rows.end * width], 1)
        })
        .collect();
    for threads in 1..=3 {
        assert_eq!(run(&segments, &q, threads), alone, "{threads} threads");
    }
    let (k, v) = (&both[block..], &both[2 * block..]);
    assert_eq!(
        run_on(&strided, k, v, &segments, &q, 2),
        alone,
        "strided pools"
    );
}

/// Decode rows over contexts longer than a tile, at 2 and 3 threads split by (row, KV head,
/// tile) with the tiles folded after, and a batch of two such rows: each row's bits are the
/// same row's in a prefill chunk (split by rows) across the tiles' bounds, at 1 thread and
/// 2, with and without sinks and a window, f32 and int8 caches.
#[test]
fn decode_rows_split_by_tiles_equal_prefill_rows() {
    tiles_equal_prefill::<f32>();
    tiles_equal_prefill::<i8>();
}

fn tiles_equal_prefill<C: CacheElem>() {
    let (heads, kv_heads, hs, bs) = (9, 3, 32, 16);
    let len = 2 * KV_TILE + 40;
    let layout = PagedLayout::dense(len.div_ceil(bs) + 2, bs, kv_heads, hs);
    let mut k = Pool::<C>::new(layout.cache_len().unwrap(), hs);
    let mut v = Pool::<C>::new(layout.cache_len().unwrap(), hs);
    // The sequence's blocks in reverse order, after two others.
    let table: Vec<u32> = (2..layout.blocks as u32).rev().collect();
    let whole = [Segment {
        rows: 0..len,
        start: 0,
        table: 0..table.len(),
    }];
    for (pool, seed) in [(&mut k, 11), (&mut v, 12)] {
        let kv = values(len * kv_heads * hs, seed);
        let rows = Rows {
            data: &kv[..],
            stride: kv_heads * hs,
            offset: 0,
        };
        paged_append(&rows, &layout, &whole, &table, None, pool.mem()).unwrap();
    }
    let q = values(len * heads * hs, 13);
    let sinks = [0.5, 4.0, -1.0, 0.0, 2.0, -3.0, 1.0, 0.25, 6.0];
    let width = heads * hs;
    // Rows `p..p + n` of the sequence as one segment.
    let segment = |p: usize, n: usize| Segment {
        rows: 0..n,
        start: p,
        table: 0..(p + n).div_ceil(bs),
    };
    let attend = |score: &ScoreMod, segments: &[Segment], q: &[f32], threads: usize| {
        let pool = ThreadPool::new(threads);
        let tokens = segments.last().unwrap().rows.end;
        let mut out = vec![f32::NAN; tokens * width];
        let mut scratch = vec![0f32; paged_scratch_len(&layout, heads, segments, &pool)];
        let rows = Rows {
            data: q,
            stride: width,
            offset: 0,
        };
        let (kc, vc) = (k.cached(), v.cached());
        paged_attention(
            PagedBatch {
                heads,
                layout: &layout,
                segments,
                tables: &table,
            },
            score,
            &rows,
            (kc, vc),
            &mut out,
            &mut scratch,
            &pool,
        )
        .unwrap();
        out.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
    };
    // Prefill chunks of 24 rows around each tile's bound, and the last rows.
    let chunks = [KV_TILE - 12, 2 * KV_TILE - 12, len - 24];
    let window = Some(KV_TILE + 100);
    for (window, sinks) in [(None, None), (None, Some(&sinks[..])), (window, None)] {
        let score = ScoreMod {
            scale: 0.4,
            softcap: 0.0,
            window,
            sinks,
        };
        let mut prefill = vec![0u32; len * width];
        for p in chunks {
            let chunk = [segment(p, 24)];
            let q = &q[p * width..(p + 24) * width];
            let rows = attend(&score, &chunk, q, 1);
            assert_eq!(
                attend(&score, &chunk, q, 2),
                rows,
                "{window:?} chunk at {p}"
            );
            prefill[p * width..(p + 24) * width].copy_from_slice(&rows);
        }
        for p in chunks.iter().flat_map(|&p| [p + 11, p + 12, p + 23]) {
            let one = [segment(p, 1)];
            let q = &q[p * width..][..width];
            for threads in 1..=3 {
                let pool = ThreadPool::new(threads);
                let plan = Plan::new(&layout, heads, &one, &pool);
                assert_eq!(plan.by_tiles, threads > 1 && p >= KV_TILE, "position {p}");
                assert_eq!(
                    attend(&score, &one, q, threads),
                    prefill[p * width..][..width],
                    "{:?} {window:?} position {p}, {threads} threads",
                    C::KIND
                );
            }
        }
        // Two decode rows in one step, split by tiles between them.
        let (a, b) = (len - 1, KV_TILE + 11);
        let two = [
            segment(a, 1),
            Segment {
                rows: 1..2,
                ..segment(b, 1)
            },
        ];
        let mut q2 = q[a * width..][..width].to_vec();
        q2.extend_from_slice(&q[b * width..][..width]);
        let mut want = prefill[a * width..][..width].to_vec();
        want.extend_from_slice(&prefill[b * width..][..width]);
        assert_eq!(
            attend(&score, &two, &q2, 2),
            want,
            "{:?} {window:?}",
            C::KIND
        );
    }
}

/// One layer's step in one region (writes in the prelude) against the three calls it
/// stands for, on a store that keeps each block's keys and values together: the same
/// cache, rotated queries and output bits, with a rope and without, at 1-3 threads.
#[test]
fn a_fused_step_equals_append_rotate_attend() {
    let (heads, kv_heads, hs, bs, half) = (6, 2, 16, 4, 4);
    // (positions before, new rows): decode rows and a prefill chunk.
    let seqs: [(usize, usize); 4] = [(5, 1), (0, 3), (9, 1), (2, 1)];
    let per_seq: Vec<usize> = seqs.iter().map(|&(p, n)| (p + n).div_ceil(bs)).collect();
    let blocks = per_seq.iter().sum::<usize>() + 2;
    let dense = PagedLayout::dense(blocks, bs, kv_heads, hs);
    let block = dense.block_len();
    let layout = PagedLayout {
        block_stride: 3 * block,
        ..dense
    };
    let (k_at, v_at) = (block, 2 * block);
    let (tables, segments, tokens) = stack(&seqs, bs, blocks);
    let q = values(tokens * heads * hs, 11);
    let qkv = values(tokens * (heads + 2 * kv_heads) * hs, 12);
    let rows_at = |offset: usize| Rows {
        data: &qkv[..],
        stride: (heads + 2 * kv_heads) * hs,
        offset,
    };
    let (keys, vals) = (rows_at(heads * hs), rows_at((heads + kv_heads) * hs));
    let (cos, sin) = (values(16 * half, 13), values(16 * half, 14));
    let rope = Rope::new(&cos, &sin, half, false).unwrap();
    let score = ScoreMod {
        scale: 0.25,
        softcap: 0.0,
        window: None,
        sinks: None,
    };
    let qrows = Rows {
        data: &q[..],
        stride: heads * hs,
        offset: 0,
    };
    let start = values(blocks * 3 * block, 15);
    for (rope, threads) in [
        (Some(&rope), 1),
        (Some(&rope), 2),
        (None, 3),
        (Some(&rope), 3),
    ] {
        let pool = ThreadPool::new(threads);
        let scratch_len = paged_scratch_len(&layout, heads, &segments, &pool);
        // Three calls.
        let mut store = start.clone();
        for (src, at, rope) in [(&keys, k_at, rope), (&vals, v_at, None)] {
            paged_append(
                src,
                &layout,
                &segments,
                &tables,
                rope,
                plain(&mut store[at..]),
            )
            .unwrap();
        }
        let mut rotated = vec![0f32; tokens * heads * hs];
        if let Some(r) = rope {
            paged_rotate_query(&qrows, heads, hs, &segments, r, &mut rotated).unwrap();
        }
        let query = match rope {
            Some(_) => Rows {
                data: &rotated[..],
                ..qrows
            },
            None => qrows,
        };
        let mut want = vec![0f32; tokens * heads * hs];
        let mut scratch = vec![0f32; scratch_len];
        let (k, v) = (&store[k_at..], &store[v_at..]);
        paged_attention(
            PagedBatch {
                heads,
                layout: &layout,
                segments: &segments,
                tables: &tables,
            },
            &score,
            &query,
            (Cached::plain(k), Cached::plain(v)),
            &mut want,
            &mut scratch,
            &pool,
        )
        .unwrap();
        // One region.
        let mut fused = start.clone();
        let mut rotated2 = vec![0f32; tokens * heads * hs];
        let mut got = vec![0f32; tokens * heads * hs];
        let new = NewKv {
            keys,
            values: vals,
            rope,
        };
        paged_step(
            PagedBatch {
                heads,
                layout: &layout,
                segments: &segments,
                tables: &tables,
            },
            &score,
            &qrows,
            &new,
            (plain(&mut fused), k_at, v_at),
            &mut rotated2,
            (&mut got, &mut scratch, &pool),
        )
        .unwrap();
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
        assert_eq!(bits(&fused), bits(&store), "cache, {threads} threads");
        assert_eq!(bits(&got), bits(&want), "output, {threads} threads");
    }
    // Pools that overlap, or two sequences writing one block, are refused.
    let pool = ThreadPool::new(2);
    let new = NewKv {
        keys,
        values: vals,
        rope: None,
    };
    let mut scratch = vec![0f32; paged_scratch_len(&layout, heads, &segments, &pool)];
    let (mut store, mut rot, mut out) = (
        start.clone(),
        vec![0f32; 0],
        vec![0f32; tokens * heads * hs],
    );
    let mut step = |at: (usize, usize), tables: &[u32]| {
        paged_step(
            PagedBatch {
                heads,
                layout: &layout,
                segments: &segments,
                tables,
            },
            &score,
            &qrows,
            &new,
            (plain(&mut store), at.0, at.1),
            &mut rot,
            (&mut out, &mut scratch, &pool),
        )
    };
    assert!(step((k_at, k_at + hs), &tables).is_err());
    assert!(step((k_at, v_at + 3 * block), &tables).is_err());
    let mut shared = tables.clone();
    // Sequence 0 writes position 5 (its second block), sequence 1 positions 0..3.
    shared[segments[1].table.start] = tables[segments[0].table.start + 1];
    assert!(step((k_at, v_at), &shared).is_err());
    assert!(step((k_at, v_at), &tables).is_ok());
}

#[test]
fn append_writes_each_position_to_its_block() {
    let layout = PagedLayout::dense(4, 2, 1, 2);
    let src = [1f32, 2., 3., 4., 5., 6.];
    let rows = Rows {
        data: &src[..],
        stride: 2,
        offset: 0,
    };
    let mut cache = vec![0f32; 16];
    let segments = [Segment {
        rows: 0..3,
        start: 1,
        table: 0..2,
    }];
    paged_append(&rows, &layout, &segments, &[3, 0], None, plain(&mut cache)).unwrap();
    // Position 1 → block 3 row 1; positions 2, 3 → block 0 rows 0, 1.
    assert_eq!(&cache[14..16], &[1., 2.]);
    assert_eq!(&cache[0..4], &[3., 4., 5., 6.]);
}

#[test]
fn bad_segments_are_errors() {
    let layout = PagedLayout::dense(2, 2, 1, 2);
    let src = [0f32; 8];
    let rows = Rows {
        data: &src[..],
        stride: 2,
        offset: 0,
    };
    let mut cache = vec![0f32; 8];
    let bad = [
        // A position past its table.
        (
            vec![Segment {
                rows: 0..3,
                start: 0,
                table: 0..1,
            }],
            vec![0u32],
        ),
        // A block outside the pool.
        (
            vec![Segment {
                rows: 0..1,
                start: 0,
                table: 0..1,
            }],
            vec![7],
        ),
        // A table range outside the tables.
        (
            vec![Segment {
                rows: 0..1,
                start: 0,
                table: 0..3,
            }],
            vec![0],
        ),
        // Rows that skip row 0.
        (
            vec![Segment {
                rows: 1..2,
                start: 0,
                table: 0..1,
            }],
            vec![0],
        ),
    ];
    for (segments, tables) in bad {
        let r = paged_append(&rows, &layout, &segments, &tables, None, plain(&mut cache));
        assert!(r.is_err(), "{segments:?} {tables:?}");
    }
}

/// A store of `C`: elements and, when scaled, one scale per head vector.
struct Pool<C> {
    values: Vec<C>,
    scales: Vec<f32>,
}

impl<C: CacheElem> Pool<C> {
    fn new(len: usize, head_size: usize) -> Self {
        Pool {
            values: vec![C::ZERO; len],
            scales: vec![0.0; if C::SCALED { len / head_size } else { 0 }],
        }
    }

    fn mem(&mut self) -> KvMem<'_, C> {
        KvMem {
            values: &mut self.values,
            scales: &mut self.scales,
        }
    }

    fn cached(&self) -> Cached<'_, C> {
        Cached {
            values: &self.values,
            scales: &self.scales,
        }
    }

    fn bits(&self) -> (Vec<u64>, Vec<u32>) {
        let values = self.values.iter().map(|v| v.to_f64().to_bits()).collect();
        (values, self.scales.iter().map(|s| s.to_bits()).collect())
    }
}

/// Query heads, KV heads and head size of the packed QKV rows the tests below run.
const QKV_HEADS: (usize, usize, usize) = (6, 2, 64);

/// One sequence of `qkv.len()` tokens' QKV rows run through [`paged_step`] on a store of `C`
/// (each block's keys then values), `cuts` rows per step (one prefill, chunks, or one decode
/// row at a time), beside a 2-row sequence in every step: the store afterwards, and the
/// bits of every row of ours.
fn run_in_steps<C: CacheElem>(qkv: &[f32], cuts: &[usize], threads: usize) -> (Pool<C>, Vec<u32>) {
    let (heads, kv_heads, hs) = QKV_HEADS;
    let (bs, half) = (16, 16);
    let width = (heads + 2 * kv_heads) * hs;
    let len = qkv.len() / width;
    let other = values(2 * width, 22);
    let (cos, sin) = (values(64 * half, 23), values(64 * half, 24));
    let rope = Rope::new(&cos, &sin, half, false).unwrap();
    let score = ScoreMod {
        scale: 0.125,
        softcap: 0.0,
        window: None,
        sinks: None,
    };
    let dense = PagedLayout::dense(len.div_ceil(bs) + 1, bs, kv_heads, hs);
    let layout = PagedLayout {
        block_stride: 2 * dense.block_len(),
        ..dense
    };
    let mut store = Pool::<C>::new(layout.blocks * layout.block_stride, hs);
    let pool = ThreadPool::new(threads);
    // Ours in blocks 1.., the other sequence's two rows rewrite block 0 every step.
    let mut tables = vec![0u32];
    tables.extend(1..=len.div_ceil(bs) as u32);
    let mut outs = Vec::new();
    let mut done = 0;
    for &n in cuts {
        let mut rows = other.clone();
        rows.extend(&qkv[done * width..(done + n) * width]);
        let segments = [
            Segment {
                rows: 0..2,
                start: 0,
                table: 0..1,
            },
            Segment {
                rows: 2..2 + n,
                start: done,
                table: 1..tables.len(),
            },
        ];
        let at = |offset| Rows {
            data: &rows[..],
            stride: width,
            offset,
        };
        let new = NewKv {
            keys: at(heads * hs),
            values: at((heads + kv_heads) * hs),
            rope: Some(&rope),
        };
        let tokens = 2 + n;
        let mut rotated = vec![0f32; tokens * heads * hs];
        let mut out = vec![0f32; tokens * heads * hs];
        let mut scratch = vec![0f32; paged_scratch_len(&layout, heads, &segments, &pool)];
        paged_step(
            PagedBatch {
                heads,
                layout: &layout,
                segments: &segments,
                tables: &tables,
            },
            &score,
            &at(0),
            &new,
            (store.mem(), 0, dense.block_len()),
            &mut rotated,
            (&mut out, &mut scratch, &pool),
        )
        .unwrap();
        outs.extend(out[2 * heads * hs..].iter().map(|x| x.to_bits()));
        done += n;
    }
    (store, outs)
}

/// The invariance a quantized cache keeps (DESIGN.md §5.1 within a cache dtype): a prompt
/// prefilled in one piece, in chunks or one row at a time, at 1 or 2 threads, stores the same
/// bytes and gives every row the same bits. A decode row equals the prefill row.
fn cut_invariant<C: CacheElem>() {
    let (heads, kv_heads, hs) = QKV_HEADS;
    let len = 40;
    let qkv = values(len * (heads + 2 * kv_heads) * hs, 21);
    let (one, want) = run_in_steps::<C>(&qkv, &[len], 1);
    for (cuts, threads) in [
        (vec![len], 2),
        (vec![17, 1, 22], 1),
        (vec![16, 16, 8], 2),
        (vec![1; len], 2),
    ] {
        let (store, got) = run_in_steps::<C>(&qkv, &cuts, threads);
        assert!(
            store.bits() == one.bits(),
            "{cuts:?} at {threads} threads: the store differs"
        );
        assert!(
            got == want,
            "{cuts:?} at {threads} threads: the rows differ"
        );
    }
}

#[test]
fn quantized_caches_store_and_attend_the_same_however_the_prompt_is_cut() {
    cut_invariant::<f32>();
    cut_invariant::<half::f16>();
    cut_invariant::<half::bf16>();
    cut_invariant::<i8>();
}

/// Attention over an f16, bf16 or int8 cache stays close to the f32 cache's: the error of
/// rounding each stored value once (half a step of the element: 2^-11, 2^-8, and 1/254 of
/// each head vector's largest magnitude), not more.
#[test]
fn narrower_caches_stay_close_to_the_f32_cache() {
    let (heads, kv_heads, hs) = QKV_HEADS;
    let len = 64;
    let qkv = values(len * (heads + 2 * kv_heads) * hs, 31);
    let (_, exact) = run_in_steps::<f32>(&qkv, &[len], 2);
    let exact: Vec<f32> = exact.into_iter().map(f32::from_bits).collect();
    let worst = |bits: Vec<u32>| {
        bits.iter()
            .zip(&exact)
            .map(|(&b, &e)| (f32::from_bits(b) - e).abs())
            .fold(0f32, f32::max)
    };
    let f16 = worst(run_in_steps::<half::f16>(&qkv, &[len], 2).1);
    let bf16 = worst(run_in_steps::<half::bf16>(&qkv, &[len], 2).1);
    let int8 = worst(run_in_steps::<i8>(&qkv, &[len], 2).1);
    // Measured here: 2.4e-4, 2.1e-3 and 4.4e-3 (outputs are averages of values in [-1, 1)).
    assert!(f16 > 0.0 && f16 < 1e-3, "f16 cache: max |error| {f16}");
    assert!(bf16 > f16 && bf16 < 1e-2, "bf16 cache: max |error| {bf16}");
    assert!(
        int8 > 0.0 && int8 < 1.5e-2,
        "int8 cache: max |error| {int8}"
    );
}

/// A group of heads over keys of `C` in pieces, by the vector rows and by the scalar
/// reference: the same bits, for every cache element, head sizes with and without the
/// 64-wide value sums (one or more slices of 64 columns), groups of 1 to 8 heads (past four,
/// the AVX-512 value sums take the heads in two runs), softcap (and sinks) on and off, keys
/// in one tile and over several.
fn simd_rows_equal_the_reference<C: CacheElem>() {
    for (hs, g, n, softcap) in [
        (64, 3, 37, 0.0),
        (64, 3, 2 * KV_TILE + 100, 5.0),
        (32, 6, KV_TILE + 1, 0.0),
        (64, 1, 16, 0.0),
        (128, 4, 29, 0.0),
        (128, 6, 29, 5.0),
        (64, 8, 23, 0.0),
        (128, 2, 7, 5.0),
        (256, 3, 11, 0.0),
        (32, 4, 21, 5.0),
        (8, 2, 9, 0.0),
    ] {
        let x = values(n * hs, 41);
        let y = values(n * hs, 42);
        let (mut k, mut v) = (Pool::<C>::new(n * hs, hs), Pool::<C>::new(n * hs, hs));
        for (pool, src) in [(&mut k, &x), (&mut v, &y)] {
            for j in 0..n {
                let s = C::encode(&src[j * hs..][..hs], &mut pool.values[j * hs..][..hs]);
                if C::SCALED {
                    pool.scales[j] = s;
                }
            }
        }
        let (kc, vc) = (k.cached(), v.cached());
        // Pieces of 5 rows, the last of a tile shorter.
        let pieces = |keys: Range<usize>| {
            let end = keys.end;
            keys.step_by(5).map(move |j| (kc, vc, j..(j + 5).min(end)))
        };
        let q = values(g * hs, 43);
        let qs: Vec<&[f32]> = q.chunks(hs).collect();
        let score = ScoreMod {
            scale: 0.2,
            softcap,
            window: None,
            sinks: None,
        };
        let run = |simd: bool| {
            let mut scratch = vec![0f32; row_scratch_len(g, hs)];
            let mut out = vec![0f32; g * hs];
            let mut outs: Vec<&mut [f32]> = out.chunks_mut(hs).collect();
            let row = RowKeys {
                qs: &qs,
                keys: &[n],
                first: 0,
                score: &score,
                sinks: (softcap > 0.0)
                    .then_some(&[1.5, -0.5, 0.0, 3.0, 0.25, -2.0, 0.75, 1.0][..g]),
            };
            attend_rows(&row, pieces, &mut scratch, &mut outs, simd, true);
            out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        };
        assert_eq!(run(true), run(false), "{:?} hs {hs} group {g}", C::KIND);
    }
}

#[test]
fn vector_rows_equal_the_scalar_reference_for_every_cache_element() {
    simd_rows_equal_the_reference::<f32>();
    simd_rows_equal_the_reference::<half::f16>();
    simd_rows_equal_the_reference::<half::bf16>();
    simd_rows_equal_the_reference::<i8>();
}
