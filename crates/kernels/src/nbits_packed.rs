//! `MatMulNBits` weights repacked once at load into column-interleaved tiles, and the AVX2 /
//! AVX-VNNI int8-activation kernel over them: the same arithmetic as
//! [`crate::matmul_nbits_int8`]'s reference, bit for bit.
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

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::ops::Range;

use crate::ThreadPool;
use crate::activation;
use crate::layout::LayoutError;
use crate::layout::{check_len, numel};
use crate::matmul_nbits::{NBitsLayout, QuantWeights, ZeroPoints};
use crate::matmul_nbits_int8::block_offset;
use crate::nbits_avx2::{Isa, QuantizedRow, TILE, supported, with_rows};
use crate::par::{par_chunks, par_row_blocks_spans, parts_for};
use crate::quant::code;

/// Float values in tile order, `[tile][block][8]`: as f16 when every value is exactly an f16
/// (weights imported from GGUF keep f16 scales), which halves their memory and converts back
/// to the same f32 bits; else as f32.
#[derive(Debug, Clone)]
enum Floats {
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

    fn len(&self) -> usize {
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
    fn ptrs(&self) -> (*const f32, *const u16) {
        match self {
            Floats::F32(v) => (v.as_ptr(), std::ptr::null()),
            Floats::F16(v) => (std::ptr::null(), v.as_ptr()),
        }
    }
}

/// Zero points in tile order.
#[derive(Debug, Clone)]
enum PackedZp {
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
    layout: NBitsLayout,
    /// Each part's columns; each starts on a tile, the gap before the next holds padding.
    spans: Vec<Range<usize>>,
    /// Two matrices of one shape, a gated MLP's gate and up projections, packed tile by tile
    /// in turn ([`PackedNBits::pack_glu`]); `spans` is then the one output's columns.
    glu: bool,
    tiles: usize,
    data: Vec<u8>,
    scales: Floats,
    zero_points: PackedZp,
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
            if !supported(a) {
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
    with_rows(m, |rows| {
        // Each row alone (a batch's rows are worth spreading: ~0.6 µs per row of 576).
        let per_part = m.div_ceil(parts_for(pool, m, l.k.saturating_mul(QUANTIZE_WORK)));
        par_chunks(pool, rows, per_part, |first, part| {
            for (i, row) in part.iter_mut().enumerate() {
                row.quantize(&a[(first + i) * l.k..][..l.k], &l, false);
            }
        });
        let rows = &*rows;
        let parts = parts_for(pool, w.tiles, m * l.k).max(if m > 1 { l.n.div_ceil(64) } else { 1 });
        par_row_blocks_spans(
            pool,
            outs,
            &w.spans,
            TILE,
            ROW_BLOCK,
            parts,
            |first, _, cols, outs| {
                row_block_tiles(&rows[first..first + outs.len()], w, bias, cols, outs, isa);
            },
        );
    });
    Ok(())
}

/// Work per activation value quantized, in [`parts_for`]'s simple operations.
const QUANTIZE_WORK: usize = 16;

/// Rows a task takes at once (each weight tile it loads serves all of them).
const ROW_BLOCK: usize = 8;

/// Columns `cols` (whole tiles, the last possibly short) of the output rows `outs` (one per
/// row of `rows`): tile by tile, four rows per pass over the tile's weights, then one at a
/// time. Each row's arithmetic is the single-row kernel's, so the bits do not depend on how
/// many rows share the call. For a gate and up pair (`w.glu`), `cols` are output columns and
/// each tile's gate and up sums become gated SiLUs there.
fn row_block_tiles(
    rows: &[QuantizedRow],
    w: &PackedNBits,
    bias: Option<&[f32]>,
    cols: Range<usize>,
    outs: &mut [&mut [f32]],
    isa: Isa,
) {
    #[cfg(target_arch = "x86_64")]
    let mut j0 = cols.start;
    #[cfg(target_arch = "x86_64")]
    while j0 < cols.end {
        let t = j0 / TILE;
        let o = j0 - cols.start;
        // The rows in passes of `$n` (the first count that fits, in order) over the tile's
        // weights, each pass one kernel call that uses every weight load for its rows; `$store`
        // takes each row's lanes.
        macro_rules! passes {
            ($width:expr, [$($n:literal),*], $store:ident, |$g:ident, $l:ident, $p:ident| $call:expr) => {{
                let mut r = 0;
                $(
                    while rows.len() - r >= $n {
                        let mut lanes = [[0f32; $width]; $n];
                        let group: [&QuantizedRow; $n] = std::array::from_fn(|i| &rows[r + i]);
                        // SAFETY: `run` checked the ISA is available; the tiles read exist
                        // (`t < w.tiles`; `t + 1` for a pair, whose first column is inside
                        // `cols`; `2t + 1` for a gate and up pair); the rows' buffers hold
                        // whole blocks (asserted inside).
                        unsafe {
                            let ($g, $l, $p) = (group, &mut lanes, r == 0);
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
            // A gate and up tile pair's sixteen sums → this tile's eight gated SiLUs.
            let mut store = |r: usize, lanes: &[f32]| {
                let n = (cols.end - j0).min(TILE);
                activation::silu_mul(&lanes[..n], &lanes[TILE..][..n], &mut outs[r][o..][..n]);
            };
            // Output tile t is gate tile 2t beside up tile 2t + 1.
            if isa == Isa::Avx512Vnni {
                passes!(2 * TILE, [8, 4, 2, 1], store, |g, l, p| {
                    tile_pair(g, w, 2 * t, l, p)
                });
            } else {
                passes!(2 * TILE, [4, 2, 1], store, |g, l, p| {
                    tile_glu(g, w, t, l, isa.ymm(), p)
                });
            }
            j0 += TILE;
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
            passes!(2 * TILE, [8, 4, 2, 1], store, |g, l, p| tile_pair(
                g, w, t, l, p
            ));
            j0 += 2 * TILE;
            continue;
        }
        passes!(TILE, [4, 2, 1], store, |g, l, p| tile(
            g,
            w,
            t,
            l,
            isa.ymm(),
            p
        ));
        j0 += TILE;
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (rows, w, bias, cols, outs, isa);
        unreachable!("supported() is false off x86-64, so nothing is packed");
    }
}

/// Tile `t`'s eight column sums (before the bias) for each of `R` rows, on `isa` (a
/// 256-bit variant); `prefetch` asks for the next tile meanwhile.
///
/// # Safety
/// `isa` must be available and `t < w.tiles`.
#[cfg(target_arch = "x86_64")]
unsafe fn tile<const R: usize>(
    rows: [&QuantizedRow; R],
    w: &PackedNBits,
    t: usize,
    out: &mut [[f32; TILE]; R],
    isa: Isa,
    prefetch: bool,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match (w.layout.bits, isa) {
            (4, Isa::AvxVnni) => tile_vnni::<4, R>(rows, w, t, out, prefetch),
            (4, Isa::Avx2) => tile_avx2::<4, R>(rows, w, t, out, prefetch),
            (_, Isa::AvxVnni) => tile_vnni::<8, R>(rows, w, t, out, prefetch),
            (4, _) => tile_avx2::<4, R>(rows, w, t, out, prefetch),
            (_, _) => tile_avx2::<8, R>(rows, w, t, out, prefetch),
        }
    }
}

/// Gate tile `2t` and up tile `2t + 1` of a [`PackedNBits::pack_glu`] matrix side by side,
/// for each of `R` rows, on `isa` (a 256-bit variant).
///
/// # Safety
/// `isa` must be available and `2t + 1 < w.tiles`.
#[cfg(target_arch = "x86_64")]
unsafe fn tile_glu<const R: usize>(
    rows: [&QuantizedRow; R],
    w: &PackedNBits,
    t: usize,
    out: &mut [[f32; 2 * TILE]; R],
    isa: Isa,
    prefetch: bool,
) {
    let (mut gate, mut up) = ([[0f32; TILE]; R], [[0f32; TILE]; R]);
    // SAFETY: forwarded from the caller.
    unsafe {
        tile(rows, w, 2 * t, &mut gate, isa, prefetch);
        tile(rows, w, 2 * t + 1, &mut up, isa, prefetch);
    }
    for ((o, g), u) in out.iter_mut().zip(&gate).zip(&up) {
        o[..TILE].copy_from_slice(g);
        o[TILE..].copy_from_slice(u);
    }
}

/// Tiles `t` and `t + 1` (sixteen column sums before the bias) for each of `R` rows;
/// `prefetch` asks for the next pair meanwhile.
///
/// # Safety
/// AVX-512 VNNI must be available and `t + 1 < w.tiles`.
#[cfg(target_arch = "x86_64")]
unsafe fn tile_pair<const R: usize>(
    rows: [&QuantizedRow; R],
    w: &PackedNBits,
    t: usize,
    out: &mut [[f32; 2 * TILE]; R],
    prefetch: bool,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match w.layout.bits {
            4 => tile_pair_avx512::<4, R>(rows, w, t, out, prefetch),
            _ => tile_pair_avx512::<8, R>(rows, w, t, out, prefetch),
        }
    }
}

/// The VNNI tile kernel on two tiles at once: the low 256 bits of every vector are tile `t`,
/// the high ones tile `t + 1`, so each lane does exactly what the 256-bit kernel's lane does
/// for its column (the same integer dots, the same float operations in the same order).
///
/// # Safety
/// AVX-512 F, BW and VNNI must be available and `t + 1 < w.tiles`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_pair_avx512<const BITS: u32, const R: usize>(
    rows: [&QuantizedRow; R],
    w: &PackedNBits,
    t: usize,
    out: &mut [[f32; 2 * TILE]; R],
    prefetch: bool,
) {
    let l = &w.layout;
    let (kb, bs) = (l.k_blocks, l.block_size);
    let chunk_bytes = 32 * BITS as usize;
    let TileIo {
        naturals,
        scale_ptrs,
        zp_floats,
        zp_ptrs,
        tile_bytes,
    } = tile_io(rows, w, t, 2, BITS);
    // Sixteen f32 lanes: eight at `a` (tile t) then eight at `b` (tile t + 1), from f32 or
    // f16 storage.
    let load16 = |(p32, p16): (*const f32, *const u16), a: usize, b: usize| {
        // SAFETY: the callers pass offsets of whole 8-value groups inside the storage
        // (asserted above).
        unsafe {
            if p16.is_null() {
                let lo = _mm512_castps256_ps512(_mm256_loadu_ps(p32.add(a)));
                let hi = _mm256_castps_pd(_mm256_loadu_ps(p32.add(b)));
                _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(lo), hi))
            } else {
                let lo = _mm256_castsi128_si256(_mm_loadu_si128(p16.add(a).cast()));
                let both = _mm256_inserti128_si256::<1>(lo, _mm_loadu_si128(p16.add(b).cast()));
                _mm512_cvtph_ps(both)
            }
        }
    };
    // SAFETY: `32 * i` plus a chunk offset stays inside each tile (asserted above).
    let pair = |p: *const u8| unsafe {
        let lo = _mm512_castsi256_si512(_mm256_loadu_si256(p.cast()));
        _mm512_inserti64x4::<1>(lo, _mm256_loadu_si256(p.add(tile_bytes).cast()))
    };
    let data = w.data.as_ptr().wrapping_add(t * tile_bytes);
    let low = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..kb {
        if prefetch {
            // The next pair.
            let at = b * (bs / 32) * chunk_bytes;
            prefetch_block(data.wrapping_add(2 * tile_bytes), at, bs, BITS);
            prefetch_block(data.wrapping_add(3 * tile_bytes), at, bs, BITS);
        }
        let mut dots = [_mm512_setzero_si512(); R];
        for sub in 0..bs / 32 {
            let chunk = data.wrapping_add((b * (bs / 32) + sub) * chunk_bytes);
            let at = b * bs + sub * 32;
            // SAFETY: the 32 activations of each row at `at` lie inside its buffer (asserted
            // above).
            let group = |r: usize, g: usize| unsafe {
                _mm512_set1_epi32(std::ptr::read_unaligned(
                    naturals[r].add(at + 4 * g).cast::<i32>(),
                ))
            };
            if BITS == 4 {
                for i in 0..4 {
                    let x = pair(chunk.wrapping_add(32 * i));
                    let lo = _mm512_and_si512(x, low);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(x), low);
                    for (r, dot) in dots.iter_mut().enumerate() {
                        *dot = _mm512_dpbusd_epi32(*dot, lo, group(r, 2 * i));
                        *dot = _mm512_dpbusd_epi32(*dot, hi, group(r, 2 * i + 1));
                    }
                }
            } else {
                for g in 0..8 {
                    let x = pair(chunk.wrapping_add(32 * g));
                    for (r, dot) in dots.iter_mut().enumerate() {
                        *dot = _mm512_dpbusd_epi32(*dot, x, group(r, g));
                    }
                }
            }
        }
        let (a0, a1) = ((t * kb + b) * TILE, ((t + 1) * kb + b) * TILE);
        let sw = load16(scale_ptrs, a0, a1);
        let z = match &w.zero_points {
            PackedZp::Codes(z) => {
                let (lo, hi) = (&z[a0..a0 + TILE], &z[a1..a1 + TILE]);
                // SAFETY: `lo` and `hi` hold 8 bytes each.
                let both = unsafe {
                    _mm_unpacklo_epi64(
                        _mm_loadl_epi64(lo.as_ptr().cast()),
                        _mm_loadl_epi64(hi.as_ptr().cast()),
                    )
                };
                Some(_mm512_cvtepu8_epi32(both))
            }
            _ => None,
        };
        let offsets = zp_floats.map(|_| load16(zp_ptrs, a0, a1));
        for (row, (dot, acc)) in rows.iter().zip(dots.iter().zip(acc.iter_mut())) {
            let sum_a = row.sums()[b];
            let scale = _mm512_mul_ps(sw, _mm512_set1_ps(row.scales()[b]));
            let centered = |zs| _mm512_cvtepi32_ps(_mm512_sub_epi32(*dot, zs));
            *acc = match (z, offsets) {
                (Some(z), _) => {
                    let zs = _mm512_mullo_epi32(z, _mm512_set1_epi32(sum_a));
                    _mm512_fmadd_ps(scale, centered(zs), *acc)
                }
                (_, Some(o)) => {
                    let acc = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(*dot), *acc);
                    _mm512_fmadd_ps(o, _mm512_set1_ps(row.scaled_sums()[b]), acc)
                }
                _ => {
                    let zs = _mm512_set1_epi32((1 << (BITS - 1)) * sum_a);
                    _mm512_fmadd_ps(scale, centered(zs), *acc)
                }
            };
        }
    }
    for (o, acc) in out.iter_mut().zip(acc) {
        // SAFETY: `o` holds 16 f32.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), acc) };
    }
}

/// Asks for block `at` (a byte offset) of the tile starting at `tile`: the tile a task takes
/// next, while this one computes (only in a tile's first pass over its rows). A decode token streams every weight once from a cache the
/// machine shares, and the hardware prefetcher restarts at every matrix and page; fetching
/// the next tile ahead gained 4-12% decode here. A prefetch never faults, so `tile` may lie
/// past the last tile.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_block(tile: *const u8, at: usize, bs: usize, bits: u32) {
    let bytes = bs * bits as usize; // 8 columns x bs codes x bits / 8
    for line in (0..bytes).step_by(64) {
        // SAFETY: prefetching is a hint that never reads memory architecturally or faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(tile.wrapping_add(at + line).cast()) };
    }
}

/// What a tile kernel reads, after the checks that make its raw loads sound.
struct TileIo<'a, const R: usize> {
    /// Each row's activation codes, in K order, whole blocks.
    naturals: [*const i8; R],
    scale_ptrs: (*const f32, *const u16),
    zp_floats: Option<&'a Floats>,
    zp_ptrs: (*const f32, *const u16),
    tile_bytes: usize,
}

/// Checks that tiles `t..t + count` of `w` exist with their scales (and float zero points)
/// and that every row holds whole blocks; panics otherwise (a caller bug, never input).
fn tile_io<'a, const R: usize>(
    rows: [&QuantizedRow; R],
    w: &'a PackedNBits,
    t: usize,
    count: usize,
    bits: u32,
) -> TileIo<'a, R> {
    let l = &w.layout;
    let (kb, bs) = (l.k_blocks, l.block_size);
    let tile_bytes = kb * (bs / 32) * 32 * bits as usize;
    assert!(
        t + count <= w.tiles
            && w.data.len() >= (t + count) * tile_bytes
            && w.scales.len() >= (t + count) * kb * TILE,
        "packed tile arguments are consistent"
    );
    for row in rows {
        assert!(
            row.natural().len() >= kb * bs
                && row.sums().len() >= kb
                && row.scaled_sums().len() >= kb
                && row.scales().len() >= kb,
            "quantized rows hold whole blocks"
        );
    }
    let zp_floats = match &w.zero_points {
        PackedZp::Float(z) => Some(z),
        _ => None,
    };
    assert!(
        zp_floats.is_none_or(|z| z.len() == w.scales.len()),
        "float zero points come one per scale"
    );
    TileIo {
        naturals: rows.map(|r| r.natural().as_ptr()),
        scale_ptrs: w.scales.ptrs(),
        zp_floats,
        zp_ptrs: zp_floats.map_or((std::ptr::null(), std::ptr::null()), Floats::ptrs),
        tile_bytes,
    }
}

/// Defines the tile kernel for AVX2 alone or with AVX-VNNI (see [`crate::nbits_avx2`]).
macro_rules! packed_tile {
    ($name:ident, $features:literal, $vnni:literal) => {
        /// Tile `t`'s eight column sums (before the bias) for each of the `R` rows into
        /// `out`: each 32-byte weight load serves every row; `prefetch` asks for the next
        /// tile meanwhile.
        ///
        /// # Safety
        /// The named CPU features must be available and `t < w.tiles`.
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name<const BITS: u32, const R: usize>(
            rows: [&QuantizedRow; R],
            w: &PackedNBits,
            t: usize,
            out: &mut [[f32; TILE]; R],
            prefetch: bool,
        ) {
            let l = &w.layout;
            let (kb, bs) = (l.k_blocks, l.block_size);
            let chunk_bytes = 32 * BITS as usize;
            let TileIo {
                naturals,
                scale_ptrs,
                zp_floats,
                zp_ptrs,
                tile_bytes,
            } = tile_io(rows, w, t, 1, BITS);
            // Eight f32 lanes at `at` from f32 or f16 storage (the branch is the same for the
            // whole call).
            macro_rules! load8 {
                ($ptrs:expr, $at:expr) => {{
                    let (p32, p16): (*const f32, *const u16) = $ptrs;
                    if p16.is_null() {
                        _mm256_loadu_ps(p32.add($at))
                    } else {
                        _mm256_cvtph_ps(_mm_loadu_si128(p16.add($at).cast()))
                    }
                }};
            }
            let data = w.data.as_ptr().wrapping_add(t * tile_bytes);
            let low = _mm256_set1_epi8(0x0F);
            let flip = _mm256_set1_epi8(-128);
            let ones = _mm256_set1_epi16(1);
            let mut acc = [_mm256_setzero_ps(); R];
            for b in 0..kb {
                if prefetch {
                    prefetch_block(
                        data.wrapping_add(tile_bytes),
                        b * (bs / 32) * chunk_bytes,
                        bs,
                        BITS,
                    );
                }
                let mut dots = [_mm256_setzero_si256(); R];
                for sub in 0..bs / 32 {
                    let chunk = data.wrapping_add((b * (bs / 32) + sub) * chunk_bytes);
                    let at = b * bs + sub * 32;
                    // SAFETY: the chunk and the 32 activations of each row lie inside the
                    // buffers asserted above; unaligned loads.
                    unsafe {
                        macro_rules! group {
                            ($r:expr, $g:expr) => {
                                _mm256_set1_epi32(std::ptr::read_unaligned(
                                    naturals[$r].add(at + 4 * $g).cast::<i32>(),
                                ))
                            };
                        }
                        macro_rules! mul {
                            ($dot:expr, $w:expr, $r:expr, $g:expr) => {
                                if $vnni {
                                    _mm256_dpbusd_avx_epi32($dot, $w, group!($r, $g))
                                } else if BITS == 4 {
                                    let pairs = _mm256_maddubs_epi16($w, group!($r, $g));
                                    _mm256_add_epi32($dot, _mm256_madd_epi16(pairs, ones))
                                } else {
                                    // 8-bit codes: recentred to signed, as in nbits_avx2.
                                    let signed = _mm256_xor_si256($w, flip);
                                    let pairs = _mm256_maddubs_epi16(
                                        _mm256_abs_epi8(signed),
                                        _mm256_sign_epi8(group!($r, $g), signed),
                                    );
                                    _mm256_add_epi32($dot, _mm256_madd_epi16(pairs, ones))
                                }
                            };
                        }
                        if BITS == 4 {
                            for i in 0..4 {
                                let x = _mm256_loadu_si256(chunk.add(32 * i).cast());
                                let lo = _mm256_and_si256(x, low);
                                let hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), low);
                                for (r, dot) in dots.iter_mut().enumerate() {
                                    *dot = mul!(*dot, lo, r, 2 * i);
                                    *dot = mul!(*dot, hi, r, 2 * i + 1);
                                }
                            }
                        } else {
                            for g in 0..8 {
                                let x = _mm256_loadu_si256(chunk.add(32 * g).cast());
                                for (r, dot) in dots.iter_mut().enumerate() {
                                    *dot = mul!(*dot, x, r, g);
                                }
                            }
                        }
                    }
                }
                let at = (t * kb + b) * TILE;
                // SAFETY: `at + 8 <= (t + 1) * kb * 8 <= len` (asserted above).
                let sw = unsafe { load8!(scale_ptrs, at) };
                let z = match &w.zero_points {
                    PackedZp::Codes(z) => {
                        let z = &z[at..at + TILE];
                        // SAFETY: `z` holds 8 bytes.
                        Some(_mm256_cvtepu8_epi32(unsafe {
                            _mm_loadl_epi64(z.as_ptr().cast())
                        }))
                    }
                    _ => None,
                };
                // SAFETY: `at + 8 <= len`, as for the scales (asserted above).
                let offsets = zp_floats.map(|_| unsafe { load8!(zp_ptrs, at) });
                for (row, (dot, acc)) in rows.iter().zip(dots.iter().zip(acc.iter_mut())) {
                    let mut dot = *dot;
                    let sum_a = row.sums()[b];
                    if BITS == 8 && !$vnni {
                        // Σ w·a = Σ (w - 128)·a + 128·Σ a.
                        dot = _mm256_add_epi32(dot, _mm256_set1_epi32(128 * sum_a));
                    }
                    let scale = _mm256_mul_ps(sw, _mm256_set1_ps(row.scales()[b]));
                    let centered = |zs| _mm256_cvtepi32_ps(_mm256_sub_epi32(dot, zs));
                    *acc = match (z, offsets) {
                        (Some(z), _) => {
                            let zs = _mm256_mullo_epi32(z, _mm256_set1_epi32(sum_a));
                            _mm256_fmadd_ps(scale, centered(zs), *acc)
                        }
                        (_, Some(o)) => {
                            let acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot), *acc);
                            _mm256_fmadd_ps(o, _mm256_set1_ps(row.scaled_sums()[b]), acc)
                        }
                        _ => {
                            let zs = _mm256_set1_epi32((1 << (BITS - 1)) * sum_a);
                            _mm256_fmadd_ps(scale, centered(zs), *acc)
                        }
                    };
                }
            }
            for (o, acc) in out.iter_mut().zip(acc) {
                // SAFETY: `o` holds 8 f32.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr(), acc) };
            }
        }
    };
}

packed_tile!(tile_avx2, "avx2,fma,f16c", false);
packed_tile!(tile_vnni, "avx2,avxvnni,fma,f16c", true);

// The padded columns of the last tile carry zero codes and zero scales; their lanes are never
// stored, so their values do not matter.
const _: () = assert!(
    TILE == 8,
    "the tile kernels hold eight columns in one 256-bit vector"
);
