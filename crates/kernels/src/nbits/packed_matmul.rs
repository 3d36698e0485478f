//! The int8-activation `MatMulNBits` over weights packed by [`super::packed`]: the entry
//! points ([`matmul_packed`], [`matmul_packed_parts`], [`matmul_packed_glu`]), the split of
//! rows and columns over the pool, and the passes of rows over each tile that call the x86
//! tile kernels ([`super::packed_avx2`], [`super::packed_avx512`]). Each output column gets
//! the bits [`super::int8_reference`] gives it.

use std::ops::Range;

use super::layout::TILE;
use super::packed::PackedNBits;
#[cfg(target_arch = "x86_64")]
use super::packed_avx2::{tile, tile_glu};
#[cfg(target_arch = "x86_64")]
use super::packed_avx512::tile_pair;
use super::tile_io::{Ahead, Meta, ROW_BLOCK};
use crate::error::{KernelError, check_len, numel};
use crate::int8::Variant;
use crate::int8::{QuantizedRow, with_rows_and_meta};
use crate::par::{Grid, Shared, par_row_blocks_spans, parts_for};
use crate::pool::Prelude;
use crate::{ThreadPool, sigmoid};

/// `out = a · dequant(w)ᵀ + bias` (`a`: `m × K`) over a packed single matrix, with `isa`
/// from [`Variant::available`]. The same bits as the reference on the unpacked matrix.
pub fn matmul_packed(
    a: &[f32],
    m: usize,
    w: &PackedNBits,
    bias: Option<&[f32]>,
    out: &mut [f32],
    pool: &ThreadPool,
    isa: Variant,
) -> Result<(), KernelError> {
    if w.spans.len() != 1 || w.glu {
        return Err(KernelError::Shape(format!(
            "a matrix packed from {} parts computes through matmul_packed_{}",
            if w.glu { 2 } else { w.spans.len() },
            if w.glu { "glu" } else { "parts" }
        )));
    }
    if let Some(b) = bias {
        check_len("bias", b.len(), w.layout.n)?;
    }
    run(a, m, w, bias, &mut [out], pool, isa)
}

/// `outs[p] = a · dequant(part p)ᵀ` for the matrices [`PackedNBits::pack_parts`] packed side
/// by side: `a` is quantized once and every part computed in one parallel region, each
/// output column exactly as [`matmul_packed`] computes it for its part alone.
pub fn matmul_packed_parts(
    a: &[f32],
    m: usize,
    w: &PackedNBits,
    outs: &mut [&mut [f32]],
    pool: &ThreadPool,
    isa: Variant,
) -> Result<(), KernelError> {
    if outs.len() != w.spans.len() || w.glu {
        return Err(KernelError::Shape(format!(
            "{} outputs for a matrix packed from {} parts{}",
            outs.len(),
            w.spans.len(),
            if w.glu {
                " as gate and up (matmul_packed_glu)"
            } else {
                ""
            }
        )));
    }
    run(a, m, w, None, outs, pool, isa)
}

/// The gated SiLU of a decoder's MLP over the gate and up projections
/// [`PackedNBits::pack_glu`] packed: `out = silu(a · gateᵀ) * (a · upᵀ)`, each product
/// column exactly as [`matmul_packed`] computes it and the rest exactly as
/// [`sigmoid::silu_mul`] does, in one parallel region.
pub fn matmul_packed_glu(
    a: &[f32],
    m: usize,
    w: &PackedNBits,
    out: &mut [f32],
    pool: &ThreadPool,
    isa: Variant,
) -> Result<(), KernelError> {
    if !w.glu {
        return Err(KernelError::Shape(
            "matmul_packed_glu takes a gate and an up projection packed by pack_glu".into(),
        ));
    }
    run(a, m, w, None, &mut [out], pool, isa)
}

fn run(
    a: &[f32],
    m: usize,
    w: &PackedNBits,
    bias: Option<&[f32]>,
    outs: &mut [&mut [f32]],
    pool: &ThreadPool,
    isa: Variant,
) -> Result<(), KernelError> {
    let l = w.layout;
    check_len("A", a.len(), numel(&[m, l.k])?)?;
    for (out, span) in outs.iter().zip(&w.spans) {
        check_len("output", out.len(), numel(&[m, span.len()])?)?;
    }
    if !Variant::available().contains(&isa) {
        return Err(KernelError::Shape(format!(
            "{isa:?} is not available on this CPU"
        )));
    }
    let kb = l.k_blocks;
    let meta_len = m.div_ceil(Meta::ROWS) * kb * Meta::BLOCK;
    with_rows_and_meta(m, meta_len, |rows, meta| {
        // Each row alone (a batch's rows are worth spreading: ~0.6 µs per row of 576), in the
        // prelude of the columns' region: the rows are quantized, then every part reads them.
        let per_part = m
            .div_ceil(parts_for(pool, m, l.k.saturating_mul(QUANTIZE_WORK)))
            .max(1);
        let quantize_parts = m.div_ceil(per_part);
        let (quantized, stats) = (Shared::new(rows), Shared::new(meta));
        let quantize = |part: usize| {
            let first = part * per_part;
            for r in first..(first + per_part).min(m) {
                // SAFETY: prelude call `part` alone writes rows `first..first + per_part` and
                // their statistics, and no part reads either before every prelude call has
                // finished.
                let row = unsafe { &mut quantized.range(r..r + 1)[0] };
                row.quantize(&a[r * l.k..][..l.k], l.block_size, false);
                unsafe { Meta::write(&stats, r, kb, row) };
            }
        };
        // One part of the columns per thread, each a contiguous stream its prefetch runs
        // ahead in (batches of more than eight rows add tasks by rows). Every part more starts
        // cold, and a part's prefetch stops at its end: four parts per thread for a decode row
        // and up to eight for a batch cost ~7-10% at every batch size on a Zen 5
        // (docs/PERFORMANCE.md). Parts hold whole tile pairs on AVX-512 (a lone tile takes the
        // 256-bit kernel).
        let parts = if m == 1 && parts_for(pool, w.tiles, l.k) == 1 {
            1
        } else {
            pool.threads()
        };
        let unit = if isa == Variant::Avx512Vnni {
            2 * TILE
        } else {
            TILE
        };
        par_row_blocks_spans(
            pool,
            Prelude {
                tasks: quantize_parts,
                run: &quantize,
            },
            outs,
            &w.spans,
            Grid {
                tile: unit,
                rows_per_task: ROW_BLOCK,
                col_parts: parts,
            },
            |first, _, cols, outs| {
                // SAFETY: parts run after the prelude, which wrote every row, has finished.
                let (rows, meta) = unsafe { (quantized.all(), stats.all()) };
                let meta = &meta[first / Meta::ROWS * kb * Meta::BLOCK..][..kb * Meta::BLOCK];
                let rows = &rows[first..first + outs.len()];
                // The first row block streams the weights from memory; later ones find most
                // of them in cache, where prefetching the statistics too costs more than
                // it brings (prefill 6% slower).
                w.count_streamed(cols.len());
                let prefetch = Ahead {
                    tiles: 0,
                    stats: first == 0,
                    once: m <= ONE_PASS,
                };
                row_block_tiles(rows, meta, w, bias, cols, outs, isa, prefetch);
            },
        );
    });
    Ok(())
}

/// Work per activation value quantized, in [`parts_for`]'s simple operations.
const QUANTIZE_WORK: usize = 16;

/// How many packed tiles ahead of the one it computes a task prefetches: about
/// [`PREFETCH_BYTES`] of weights ahead, in whole tile pairs, at least one pair.
#[cfg(target_arch = "x86_64")]
fn prefetch_distance(tile_bytes: usize) -> usize {
    PREFETCH_BYTES
        .div_ceil(tile_bytes.max(1))
        .next_multiple_of(2)
        .max(2)
}

/// How far ahead a decode row's weight stream is prefetched. One pair ahead (4.6 KB for a
/// 4-bit K = 576 matrix) left the stream short of what one core can pull from memory on a
/// Zen 5 slice; four tiles (9.2 KB) gained ~4% single-thread decode there, 16 KB and more
/// lost (`oxgen bench`, interleaved, docs/PERFORMANCE.md). Matrices whose tiles are larger
/// (8-bit, or K = 1536) stay one pair ahead.
#[cfg(target_arch = "x86_64")]
const PREFETCH_BYTES: usize = 8192;

/// The most rows the 256-bit kernels take in one pass over a tile (`row_block_tiles`'s
/// widest pass): a call of no more rows reads each weight once.
const ONE_PASS: usize = 4;

/// Columns of a gated MLP's output whose gated SiLUs are computed together.
const GLU_WINDOW: usize = 64;

/// Columns `cols` (whole tiles, the last possibly short) of the output rows `outs` (one per
/// row of `rows`, quantized, with their blocks' `meta`): tile by tile, four rows per pass
/// over the tile's weights, then one at a time. Each row's arithmetic is the single-row
/// kernel's, so the bits do not depend on how many rows share the call. For a gate and up pair (`w.glu`), `cols` are output columns and
/// each tile's gate and up sums become gated SiLUs there. The kernels prefetch the weights'
/// codes a few tiles ahead as `prefetch` says (its `tiles` set here), with `prefetch.stats`
/// their scales and zero points too.
// Eight parameters, not seven: passing `rows` and `meta` as one pair measured 5% slower on
// the one-row products (the hot loop below compiled differently).
#[allow(clippy::too_many_arguments)]
fn row_block_tiles(
    rows: &[QuantizedRow],
    meta: &[f32],
    w: &PackedNBits,
    bias: Option<&[f32]>,
    cols: Range<usize>,
    outs: &mut [&mut [f32]],
    isa: Variant,
    prefetch: Ahead,
) {
    #[cfg(target_arch = "x86_64")]
    let mut j0 = cols.start;
    // A gated MLP's gate and up sums, a window of columns per row, become gated SiLUs a
    // window at a time (one vector call per row and window instead of one per tile).
    #[cfg(target_arch = "x86_64")]
    let (mut gate, mut up, mut window) = (
        [[0f32; GLU_WINDOW]; ROW_BLOCK],
        [[0f32; GLU_WINDOW]; ROW_BLOCK],
        cols.start,
    );
    assert!(
        rows.len() <= ROW_BLOCK,
        "a task takes at most {ROW_BLOCK} rows"
    );
    // Each pass's column sums, per row: zeroed once per task, not once per pass.
    #[cfg(target_arch = "x86_64")]
    let (mut pair_lanes, mut tile_lanes) =
        ([[0f32; 2 * TILE]; ROW_BLOCK], [[0f32; TILE]; ROW_BLOCK]);
    #[cfg(target_arch = "x86_64")]
    let (per_tile, tile_bytes) = (
        if w.glu { 2 } else { 1 },
        w.layout.block_size * w.layout.bits as usize * w.layout.k_blocks,
    );
    #[cfg(target_arch = "x86_64")]
    let (end_tile, distance) = (
        per_tile * cols.end.div_ceil(TILE),
        prefetch_distance(tile_bytes),
    );
    #[cfg(target_arch = "x86_64")]
    while j0 < cols.end {
        let t = j0 / TILE;
        let o = j0 - cols.start;
        // A call whose last packed tile is `last` prefetches `d` tiles ahead while that stays
        // inside this part: past it they are another task's.
        let ahead = |last: usize, d: usize| Ahead {
            tiles: if last + d < end_tile { d } else { 0 },
            ..prefetch
        };
        // The rows in passes of `$n` (the first count that fits, in order) over the tile's
        // weights, each pass one kernel call that uses every weight load for its rows; `$store`
        // takes each row's lanes.
        macro_rules! passes {
            ($lanes:ident, $width:expr, [$($n:literal),*], $store:ident, $ahead:expr, |$g:ident, $m:ident, $l:ident, $p:ident| $call:expr) => {{
                let mut r = 0;
                $(
                    while rows.len() - r >= $n {
                        // The kernel writes every lane of its rows.
                        let lanes: &mut [[f32; $width]; $n] = (&mut $lanes[..$n])
                            .try_into()
                            .expect("lane buffers hold every pass's rows");
                        let group: [&QuantizedRow; $n] = std::array::from_fn(|i| &rows[r + i]);
                        // SAFETY: `run` checked the ISA is available; the tiles read exist
                        // (`t < w.tiles`; `t + 1` for a pair, whose first column is inside
                        // `cols`; `2t + 1` for a gate and up pair); the rows' buffers hold
                        // whole blocks (asserted inside).
                        unsafe {
                            let ($g, $m, $l, $p) = (group, &meta[r..], &mut *lanes, if r == 0 { $ahead } else { Ahead::NONE });
                            $call
                        };
                        for (i, l) in lanes.iter().enumerate() {
                            $store(r + i, l);
                        }
                        r += $n;
                    }
                )*
            }};
        }
        if w.glu {
            // A gate and up tile pair's sixteen sums → this tile's eight columns of the window.
            let at = j0 - window;
            let mut store = |r: usize, lanes: &[f32]| {
                gate[r][at..at + TILE].copy_from_slice(&lanes[..TILE]);
                up[r][at..at + TILE].copy_from_slice(&lanes[TILE..]);
            };
            // Output tile t is gate tile 2t beside up tile 2t + 1.
            if isa == Variant::Avx512Vnni {
                passes!(
                    pair_lanes,
                    2 * TILE,
                    [8, 4, 2, 1],
                    store,
                    ahead(2 * t + 1, distance),
                    |g, m, l, p| tile_pair(g, m, w, 2 * t, l, p)
                );
            } else {
                passes!(
                    pair_lanes,
                    2 * TILE,
                    [4, 2, 1],
                    store,
                    ahead(2 * t + 1, 1),
                    |g, _m, l, p| tile_glu(g, w, t, l, isa.ymm(), p)
                );
            }
            j0 += TILE;
            if j0 - window == GLU_WINDOW || j0 >= cols.end {
                let n = j0.min(cols.end) - window;
                for (r, out) in outs.iter_mut().enumerate() {
                    let out = &mut out[window - cols.start..][..n];
                    sigmoid::silu_mul(&gate[r][..n], &up[r][..n], out);
                }
                window = j0;
            }
            continue;
        }
        let mut store = |r: usize, lanes: &[f32]| {
            let n = (cols.end - j0).min(lanes.len());
            let dst = &mut outs[r][o..][..n];
            for (c, (dst, &v)) in dst.iter_mut().zip(lanes).enumerate() {
                *dst = match bias {
                    Some(b) => v + b[j0 + c],
                    None => v,
                };
            }
        };
        if isa == Variant::Avx512Vnni && j0 + TILE < cols.end {
            // Two tiles per 512-bit vector; eight rows fit the 32 vector registers.
            passes!(
                pair_lanes,
                2 * TILE,
                [8, 4, 2, 1],
                store,
                ahead(t + 1, distance),
                |g, m, l, p| tile_pair(g, m, w, t, l, p)
            );
            j0 += 2 * TILE;
            continue;
        }
        passes!(
            tile_lanes,
            TILE,
            [4, 2, 1],
            store,
            ahead(t, 1),
            |g, _m, l, p| tile(g, w, t, l, isa.ymm(), p)
        );
        j0 += TILE;
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (rows, meta, w, bias, cols, outs, isa, prefetch);
        unreachable!("supported() is false off x86-64, so nothing is packed");
    }
}
