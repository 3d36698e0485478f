//! `MatMulNBits` weights repacked once at load into column-interleaved tiles, and the
//! int8-activation matmul over them: the same arithmetic as [`crate::matmul_nbits_int8`]'s
//! reference, bit for bit. This file packs and splits the work (rows in passes, columns over
//! the pool); the x86 tile kernels themselves are in `nbits_tiles.rs`.
//!
//! Layout: output columns in tiles of eight (the last padded with zero codes and zero scales).
//! Within a tile, block after block in K order; within a block, 32-value chunks; a chunk holds
//! the eight columns' codes in groups of four consecutive `k`:
//! - 8-bit: eight 32-byte rows, row `g` byte `j` = column `j / 4`, `k = 4g + j % 4`;
//! - 4-bit: four 32-byte rows, row `i` byte `j` = that code for group `2i` in the low nibble
//!   and for group `2i + 1` in the high nibble.
//!
//! So one 32-byte load (and a nibble split) gives, per i32 lane, the four codes of one column
//! that meet the same four activations: `vpdpbusd` (or `vpmaddubsw` + `vpmaddwd`) with those
//! four activations broadcast adds each column's partial dot into its own lane. The lanes hold
//! output columns from the start: no horizontal sums, and the scales and zero points of a tile's
//! block are one contiguous load. Integer dots are exact in any order; the float part per
//! column is the reference's, operation for operation (its fused multiply-adds included).

use std::ops::Range;

use crate::ThreadPool;
use crate::activation;
use crate::layout::LayoutError;
use crate::layout::{check_len, numel};
use crate::matmul_nbits::{NBitsLayout, QuantWeights, ZeroPoints};
use crate::matmul_nbits_int8::block_offset;
use crate::nbits_avx2::{Isa, QuantizedRow, TILE, supported, with_rows_and_meta};
#[cfg(target_arch = "x86_64")]
use crate::nbits_tiles::{Ahead, tile, tile_glu, tile_pair};
use crate::par::{Shared, par_row_blocks_spans, parts_for};
use crate::pool::Prelude;
use crate::quant::code;

/// Float values in tile order, `[tile][block][8]`: as f16 when every value is exactly an f16
/// (weights imported from GGUF keep f16 scales), which halves their memory and converts back
/// to the same f32 bits; else as f32.
#[derive(Debug, Clone)]
pub(crate) enum Floats {
    F32(Vec<f32>),
    F16(Vec<u16>),
}

impl Floats {
    fn new(values: Vec<f32>) -> Floats {
        let exact = values
            .iter()
            .all(|&v| half::f16::from_f32(v).to_f32().to_bits() == v.to_bits());
        if exact {
            Floats::F16(
                values
                    .iter()
                    .map(|&v| half::f16::from_f32(v).to_bits())
                    .collect(),
            )
        } else {
            Floats::F32(values)
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Floats::F32(v) => v.len(),
            Floats::F16(v) => v.len(),
        }
    }

    fn nbytes(&self) -> usize {
        match self {
            Floats::F32(v) => 4 * v.len(),
            Floats::F16(v) => 2 * v.len(),
        }
    }

    /// The f32 or f16 data, for the kernel's unchecked loads (length checked by the caller).
    pub(crate) fn ptrs(&self) -> (*const f32, *const u16) {
        match self {
            Floats::F32(v) => (v.as_ptr(), std::ptr::null()),
            Floats::F16(v) => (std::ptr::null(), v.as_ptr()),
        }
    }
}

/// Zero points in tile order.
#[derive(Debug, Clone)]
pub(crate) enum PackedZp {
    /// `2^(bits-1)` for every block.
    Default,
    /// Integer codes (from packed uint8 zero points), `[tile][block][8]`.
    Codes(Vec<u8>),
    /// Float zero points, as the blocks' offsets `snap(−(z·s))` (see
    /// [`crate::matmul_nbits_int8`]).
    Float(Floats),
}

/// A weight matrix in the kernel's tile layout (see the module doc): one matrix, or several
/// with the same K, bit width, block size and kind of zero points packed side by side (the
/// `MatMulNBits` nodes that read one input: a layer's Q, K and V projections), so one call
/// quantizes the input once and computes every part in one parallel region.
#[derive(Debug, Clone)]
pub struct PackedNBits {
    /// `n` is the width of the whole column space (the parts and the gaps between them).
    pub(crate) layout: NBitsLayout,
    /// Each part's columns; each starts on a tile, the gap before the next holds padding.
    pub(crate) spans: Vec<Range<usize>>,
    /// Two matrices of one shape, a gated MLP's gate and up projections, packed tile by tile
    /// in turn ([`PackedNBits::pack_glu`]); `spans` is then the one output's columns.
    pub(crate) glu: bool,
    pub(crate) tiles: usize,
    pub(crate) data: Vec<u8>,
    pub(crate) scales: Floats,
    pub(crate) zero_points: PackedZp,
}

impl PackedNBits {
    /// Repacks `w`; `None` when the tile kernel does not run this layout on this CPU.
    pub fn pack(w: &QuantWeights<'_, f32>) -> Result<Option<PackedNBits>, LayoutError> {
        Self::pack_parts(std::slice::from_ref(w))
    }

    /// Repacks `parts` side by side (see [`matmul_packed_parts`]); `None` when the tile kernel
    /// does not run their layout on this CPU. The parts must agree on K, bits, block size and
    /// the kind of zero points.
    pub fn pack_parts(parts: &[QuantWeights<'_, f32>]) -> Result<Option<PackedNBits>, LayoutError> {
        let mut spans = Vec::with_capacity(parts.len());
        let mut end = 0usize;
        for w in parts {
            let start = end.next_multiple_of(TILE);
            end = start + w.layout.n;
            spans.push(start..end);
        }
        let place = |p: usize, j: usize| spans[p].start + j;
        Self::pack_placed(parts, end, place, spans.clone(), false)
    }

    /// Repacks a gated MLP's `gate` and `up` projections (one shape) for
    /// [`matmul_packed_glu`]: gate tile `t` then up tile `t`, for each `t` in turn, so the
    /// thread that computes a tile of one has the other's matching tile at hand. `None` when
    /// the tile kernel does not run their layout on this CPU.
    pub fn pack_glu(
        gate: &QuantWeights<'_, f32>,
        up: &QuantWeights<'_, f32>,
    ) -> Result<Option<PackedNBits>, LayoutError> {
        let n = gate.layout.n;
        if up.layout.n != n {
            return Err(LayoutError::Shape(format!(
                "a gate and an up projection of {n} and {} columns: a gated MLP's two have one \
                 width",
                up.layout.n
            )));
        }
        let place = |p: usize, j: usize| (j / TILE * 2 + p) * TILE + j % TILE;
        Self::pack_placed(
            &[*gate, *up],
            2 * n.next_multiple_of(TILE),
            place,
            std::iter::once(0..n).collect(),
            true,
        )
    }

    /// Packs `parts` with column `j` of part `p` at `place(p, j)` of a column space `width`
    /// wide; the parts must agree on K, bits, block size and the kind of zero points.
    fn pack_placed(
        parts: &[QuantWeights<'_, f32>],
        width: usize,
        place: impl Fn(usize, usize) -> usize,
        spans: Vec<Range<usize>>,
        glu: bool,
    ) -> Result<Option<PackedNBits>, LayoutError> {
        let Some(first) = parts.first() else {
            return Err(LayoutError::Shape("no matrices to pack".into()));
        };
        for w in parts {
            w.check()?;
            let (a, b) = (&w.layout, &first.layout);
            if (a.k, a.bits, a.block_size) != (b.k, b.bits, b.block_size)
                || std::mem::discriminant(&w.zero_points)
                    != std::mem::discriminant(&first.zero_points)
            {
                return Err(LayoutError::Shape(format!(
                    "matrices packed together must agree on K, bits, block size and zero \
                     points: {a:?} against {b:?}"
                )));
            }
            if !supported(a) || !zero_point_terms_exact_in_f32(a) {
                return Ok(None);
            }
        }
        let l = NBitsLayout::new(
            width,
            first.layout.k,
            first.layout.bits,
            first.layout.block_size,
        )?;
        let (kb, bs, bits) = (l.k_blocks, l.block_size, l.bits);
        let tiles = l.n.div_ceil(TILE);
        let chunk_bytes = 32 * bits as usize; // 8 columns x 32 codes x bits / 8
        let mut data = vec![0u8; tiles * kb * (bs / 32) * chunk_bytes];
        // Read in full every step; one of several MiB (the output head: 28 MB for the default
        // model) gets huge pages for its whole 2 MiB stretches.
        crate::mem::advise_huge_pages(&mut data);
        let mut scales = vec![0f32; tiles * kb * TILE];
        // Padding columns get the default zero point, so a matrix whose codes all equal it
        // (8-bit GGUF Q8_0 imports: 128 everywhere) needs none stored.
        let default_zp = 1u8 << (bits - 1);
        let mut zp_codes = vec![default_zp; tiles * kb * TILE];
        let mut zp_float = vec![0f32; tiles * kb * TILE];
        let row_bytes = kb * l.blob_size;
        for (p, w) in parts.iter().enumerate() {
            for j in 0..w.layout.n {
                let (t, c) = (place(p, j) / TILE, place(p, j) % TILE);
                let codes = &w.data[j * row_bytes..][..row_bytes];
                for b in 0..kb {
                    let at = (t * kb + b) * TILE + c;
                    scales[at] = w.scales[j * kb + b];
                    match w.zero_points {
                        ZeroPoints::Default => {}
                        ZeroPoints::Packed(z) => {
                            zp_codes[at] = code(&z[j * l.zp_row_bytes..], bits, b)
                        }
                        ZeroPoints::Float(z) => {
                            zp_float[at] = block_offset(z[j * kb + b], w.scales[j * kb + b])
                        }
                    }
                    let blob = &codes[b * l.blob_size..][..l.blob_size];
                    for sub in 0..bs / 32 {
                        let chunk = &mut data[((t * kb + b) * (bs / 32) + sub) * chunk_bytes..]
                            [..chunk_bytes];
                        pack_chunk(blob, sub, bits, c, chunk);
                    }
                }
            }
        }
        let zero_points = match first.zero_points {
            ZeroPoints::Default => PackedZp::Default,
            ZeroPoints::Packed(_) if zp_codes.iter().all(|&z| z == default_zp) => PackedZp::Default,
            ZeroPoints::Packed(_) => PackedZp::Codes(zp_codes),
            ZeroPoints::Float(_) => PackedZp::Float(Floats::new(zp_float)),
        };
        Ok(Some(PackedNBits {
            layout: l,
            spans,
            glu,
            tiles,
            data,
            scales: Floats::new(scales),
            zero_points,
        }))
    }

    /// The layout of the whole column space (all parts and the gaps between them).
    pub fn layout(&self) -> &NBitsLayout {
        &self.layout
    }

    /// Each part's columns in the whole column space.
    pub fn spans(&self) -> &[Range<usize>] {
        &self.spans
    }

    /// Bytes the packed matrix holds.
    pub fn nbytes(&self) -> usize {
        self.data.len()
            + self.scales.nbytes()
            + match &self.zero_points {
                PackedZp::Default => 0,
                PackedZp::Codes(z) => z.len(),
                PackedZp::Float(z) => z.nbytes(),
            }
    }
}

/// Sub-chunk `sub` (32 codes) of column `c`'s block `blob` into its place in `chunk` (see the
/// module doc).
fn pack_chunk(blob: &[u8], sub: usize, bits: u32, c: usize, chunk: &mut [u8]) {
    if bits == 8 {
        // Group g's four codes are bytes 4g..4g + 4 of the chunk's 32.
        let src = &blob[sub * 32..][..32];
        for (g, four) in src.chunks_exact(4).enumerate() {
            chunk[g * 32 + c * 4..][..4].copy_from_slice(four);
        }
    } else {
        // Element e is the (e % 2) nibble of byte e / 2; row i pairs group 2i (elements
        // 8i..8i + 4) with group 2i + 1 (8i + 4..8i + 8).
        let src = &blob[sub * 16..][..16];
        let nibble = |e: usize| (src[e / 2] >> (4 * (e % 2))) & 0x0F;
        for i in 0..4 {
            for kk in 0..4 {
                chunk[i * 32 + c * 4 + kk] = nibble(8 * i + kk) | (nibble(8 * i + 4 + kk) << 4);
            }
        }
    }
}

/// `out = a · dequant(w)ᵀ + bias` (`a`: `m × K`) over a packed single matrix, with `isa`
/// from [`Isa::available`]. The same bits as the reference on the unpacked matrix.
pub fn matmul_packed(
    a: &[f32],
    m: usize,
    w: &PackedNBits,
    bias: Option<&[f32]>,
    out: &mut [f32],
    pool: &ThreadPool,
    isa: Isa,
) -> Result<(), LayoutError> {
    if w.spans.len() != 1 || w.glu {
        return Err(LayoutError::Shape(format!(
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
    isa: Isa,
) -> Result<(), LayoutError> {
    if outs.len() != w.spans.len() || w.glu {
        return Err(LayoutError::Shape(format!(
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
/// [`activation::silu_mul`] does, in one parallel region.
pub fn matmul_packed_glu(
    a: &[f32],
    m: usize,
    w: &PackedNBits,
    out: &mut [f32],
    pool: &ThreadPool,
    isa: Isa,
) -> Result<(), LayoutError> {
    if !w.glu {
        return Err(LayoutError::Shape(
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
    isa: Isa,
) -> Result<(), LayoutError> {
    let l = w.layout;
    check_len("A", a.len(), numel(&[m, l.k])?)?;
    for (out, span) in outs.iter().zip(&w.spans) {
        check_len("output", out.len(), numel(&[m, span.len()])?)?;
    }
    if !Isa::available().contains(&isa) {
        return Err(LayoutError::Shape(format!(
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
                row.quantize(&a[r * l.k..][..l.k], &l, false);
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
        let unit = if isa == Isa::Avx512Vnni {
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
            unit,
            ROW_BLOCK,
            parts,
            |first, _, cols, outs| {
                // SAFETY: parts run after the prelude, which wrote every row, has finished.
                let (rows, meta) = unsafe { (quantized.all(), stats.all()) };
                let meta = &meta[first / Meta::ROWS * kb * Meta::BLOCK..][..kb * Meta::BLOCK];
                let rows = &rows[first..first + outs.len()];
                // The first row block streams the weights from memory; later ones find most
                // of them in cache, where prefetching the statistics too costs more than
                // it brings (prefill 6% slower).
                row_block_tiles(rows, meta, w, bias, cols, outs, isa, first == 0);
            },
        );
    });
    Ok(())
}

/// The block statistics of a batch's quantized rows as the AVX-512 tile kernel reads them:
/// per group of [`Meta::ROWS`] rows (a task's rows) and block, the rows' scales, then their
/// `Σ q_a` as f32 (exact: at most `127 · block_size`), then their `scale_a · Σ q_a`. A
/// block's statistics for all rows are then one pointer and constant offsets away, where
/// per-row arrays took three pointers per row (24 at eight rows, more than the registers).
pub(crate) struct Meta;

impl Meta {
    pub(crate) const ROWS: usize = ROW_BLOCK;
    /// Values per block of a group.
    pub(crate) const BLOCK: usize = 3 * Self::ROWS;

    /// Writes row `r`'s `kb` blocks of statistics.
    ///
    /// # Safety
    /// No other live reference covers row `r`'s statistics.
    unsafe fn write(meta: &Shared<f32>, r: usize, kb: usize, row: &QuantizedRow) {
        let (group, i) = (r / Self::ROWS, r % Self::ROWS);
        for b in 0..kb {
            let at = (group * kb + b) * Self::BLOCK + i;
            let values = [row.scales()[b], row.sums()[b] as f32, row.scaled_sums()[b]];
            for (k, v) in values.into_iter().enumerate() {
                let at = at + k * Self::ROWS;
                // SAFETY: the caller's contract.
                unsafe { meta.range(at..at + 1)[0] = v };
            }
        }
    }
}

/// Whether a block's `dot`, `z·sum_a` and their difference are integers f32 holds exactly
/// (at most 2^24 in magnitude: `block_size · 127 · (2^bits − 1)` bounds all three), so the
/// AVX-512 kernel may compute `(dot − z·sum_a) as f32` as one fused `dot − z·sum_a` in f32:
/// every 8-bit block size up to 512, every 4-bit one up to 8192.
fn zero_point_terms_exact_in_f32(l: &NBitsLayout) -> bool {
    let most = (l.block_size as u64)
        .saturating_mul(127)
        .saturating_mul((1u64 << l.bits) - 1);
    most <= 1 << 24
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

/// Rows a task takes at once (each weight tile it loads serves all of them).
const ROW_BLOCK: usize = 8;

/// Columns of a gated MLP's output whose gated SiLUs are computed together.
const GLU_WINDOW: usize = 64;

/// Columns `cols` (whole tiles, the last possibly short) of the output rows `outs` (one per
/// row of `rows`): tile by tile, four rows per pass over the tile's weights, then one at a
/// time. Each row's arithmetic is the single-row kernel's, so the bits do not depend on how
/// many rows share the call. For a gate and up pair (`w.glu`), `cols` are output columns and
/// each tile's gate and up sums become gated SiLUs there. The kernels prefetch the weights'
/// codes a few tiles ahead, and with `stats` their scales and zero points too.
#[allow(clippy::too_many_arguments)]
fn row_block_tiles(
    rows: &[QuantizedRow],
    meta: &[f32],
    w: &PackedNBits,
    bias: Option<&[f32]>,
    cols: Range<usize>,
    outs: &mut [&mut [f32]],
    isa: Isa,
    stats: bool,
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
            stats,
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
            if isa == Isa::Avx512Vnni {
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
                    activation::silu_mul(&gate[r][..n], &up[r][..n], out);
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
        if isa == Isa::Avx512Vnni && j0 + TILE < cols.end {
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
        let _ = (rows, meta, w, bias, cols, outs, isa);
        unreachable!("supported() is false off x86-64, so nothing is packed");
    }
}
