//! `MatMulNBits` weights repacked once at load into column-interleaved tiles
//! ([`PackedNBits`]), for the int8-activation matmul over them: the same arithmetic as
//! [`super::int8_reference`], bit for bit. This file packs; [`super::packed_matmul`] splits
//! the work (rows in passes, columns over the pool) and the x86 tile kernels are in
//! [`super::packed_avx2`] and [`super::packed_avx512`].
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

use super::int8_reference::block_offset;
use super::layout::{NBitsLayout, QuantWeights, TILE, ZeroPoints};
use super::support::supported;
use crate::error::KernelError;
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
    /// [`super::int8_reference`]).
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
    /// Columns the kernel has streamed this matrix for, counted as each task finishes its
    /// columns (a row block of up to eight rows reads its columns' tiles once).
    streamed: StreamedColumns,
}

/// A count of columns streamed, shared by the tasks of a call; a clone starts from the same
/// count.
#[derive(Debug, Default)]
struct StreamedColumns(std::sync::atomic::AtomicU64);

impl Clone for StreamedColumns {
    fn clone(&self) -> Self {
        StreamedColumns(std::sync::atomic::AtomicU64::new(
            self.0.load(std::sync::atomic::Ordering::Relaxed),
        ))
    }
}

impl PackedNBits {
    /// Repacks `w`; `None` when the tile kernel does not run this layout on this CPU.
    pub fn pack(w: &QuantWeights<'_, f32>) -> Result<Option<PackedNBits>, KernelError> {
        Self::pack_parts(std::slice::from_ref(w))
    }

    /// Repacks `parts` side by side (see [`super::matmul_packed_parts`]); `None` when the tile kernel
    /// does not run their layout on this CPU. The parts must agree on K, bits, block size and
    /// the kind of zero points.
    pub fn pack_parts(parts: &[QuantWeights<'_, f32>]) -> Result<Option<PackedNBits>, KernelError> {
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
    /// [`super::matmul_packed_glu`]: gate tile `t` then up tile `t`, for each `t` in turn, so the
    /// thread that computes a tile of one has the other's matching tile at hand. `None` when
    /// the tile kernel does not run their layout on this CPU.
    pub fn pack_glu(
        gate: &QuantWeights<'_, f32>,
        up: &QuantWeights<'_, f32>,
    ) -> Result<Option<PackedNBits>, KernelError> {
        let n = gate.layout.n;
        if up.layout.n != n {
            return Err(KernelError::Shape(format!(
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
    ) -> Result<Option<PackedNBits>, KernelError> {
        let Some(first) = parts.first() else {
            return Err(KernelError::Shape("no matrices to pack".into()));
        };
        for w in parts {
            w.check()?;
            let (a, b) = (&w.layout, &first.layout);
            if (a.k, a.bits, a.block_size) != (b.k, b.bits, b.block_size)
                || std::mem::discriminant(&w.zero_points)
                    != std::mem::discriminant(&first.zero_points)
            {
                return Err(KernelError::Shape(format!(
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
            streamed: StreamedColumns::default(),
        }))
    }

    /// Counts a task's pass over `columns` of the parts' columns.
    pub(crate) fn count_streamed(&self, columns: usize) {
        self.streamed
            .0
            .fetch_add(columns as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Bytes of this matrix the kernel has read since it was packed: its size for every pass
    /// over all its columns (one per call of up to eight rows, one per block of eight rows
    /// beyond), in proportion for part of them.
    pub fn streamed_bytes(&self) -> u64 {
        let columns = self.streamed.0.load(std::sync::atomic::Ordering::Relaxed);
        // A pass covers the parts' columns (the kernel skips the gaps between them).
        let width = self.spans.iter().map(|s| s.len()).sum::<usize>().max(1) as u128;
        (columns as u128 * self.nbytes() as u128 / width) as u64
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
