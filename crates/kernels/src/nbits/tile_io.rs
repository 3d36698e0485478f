//! What the packed tile kernels ([`super::packed_avx2`], [`super::packed_avx512`]) share: the
//! kinds of zero points as a const parameter, the checked pointers a kernel reads
//! ([`TileIo`]), the block statistics of a batch's rows ([`Meta`]), and the prefetches that
//! run ahead of the weight stream.

#[cfg(target_arch = "x86_64")]
use std::ops::Range;

use super::layout::TILE;
use super::packed::{Floats, PackedNBits, PackedZp};
use crate::int8::QuantizedRow;
use crate::par::Shared;

/// The kinds of [`PackedZp`], as a kernel's const parameter: each kernel instance then holds
/// only its own block epilogue, with no branch per block or row.
pub(super) const ZP_DEFAULT: u8 = 0;
pub(super) const ZP_CODES: u8 = 1;
pub(super) const ZP_FLOAT: u8 = 2;

/// Calls the kernel instance for `w`'s kind of zero points (`w` the call's second argument).
macro_rules! with_zp {
    ($f:ident::<$bits:literal, $r:ident>($rows:expr, $w:expr, $($arg:expr),*)) => {
        match &$w.zero_points {
            PackedZp::Default => $f::<$bits, $r, ZP_DEFAULT>($rows, $w, $($arg),*),
            PackedZp::Codes(_) => $f::<$bits, $r, ZP_CODES>($rows, $w, $($arg),*),
            PackedZp::Float(_) => $f::<$bits, $r, ZP_FLOAT>($rows, $w, $($arg),*),
        }
    };
}

pub(super) use with_zp;

/// Rows a task takes at once (each weight tile it loads serves all of them).
pub(super) const ROW_BLOCK: usize = 8;

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
    pub(super) unsafe fn write(meta: &Shared<f32>, r: usize, kb: usize, row: &QuantizedRow) {
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

/// What a tile kernel prefetches while it computes (only in a tile's first pass over its
/// rows).
#[derive(Clone, Copy)]
pub(crate) struct Ahead {
    /// How many tiles ahead of the first one computed; none when 0.
    pub(crate) tiles: usize,
    /// Whether the tiles' scales and zero points come too, or only their codes.
    pub(crate) stats: bool,
    /// Whether the call reads the weights once (one pass of a few rows over each tile, a
    /// decode step): their codes are then asked for past the outer caches (`prefetchnta`),
    /// which streamed 10-15% more of a 3B-shaped model's matrices on a Zen 2 than into L2.
    /// Rows in several passes read each tile again, a prompt's row blocks each matrix again,
    /// from those caches: for them, into L2 (NTA cost 8 rows on the 1.5B shape 3%).
    pub(crate) once: bool,
}

impl Ahead {
    pub(crate) const NONE: Ahead = Ahead {
        tiles: 0,
        stats: false,
        once: false,
    };
}

/// Asks for block `b` of packed tile `tile`'s codes, a tile the task takes a few tiles later.
/// A decode token streams every weight once from a cache the machine shares, and the
/// hardware prefetcher restarts at every matrix and page: fetching the next tile's codes
/// gained 4-12% decode on a Xeon, fetching about 8 KB ahead (`packed_matmul`'s
/// `PREFETCH_BYTES`) ~4% more on a Zen 5. A prefetch never faults, so `tile` may lie past the
/// last tile.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn prefetch_block(w: &PackedNBits, tile: usize, b: usize) {
    let l = &w.layout;
    // 8 columns x block_size codes x bits / 8 per tile and block.
    let block_bytes = l.block_size * l.bits as usize;
    let at = (tile * l.k_blocks + b) * block_bytes;
    crate::mem::prefetch_lines(w.data.as_ptr().wrapping_add(at), block_bytes);
}

/// Asks for the cache line at `at`, into L1 past the outer caches when it is read `once`,
/// else into L2 (a prefetch never faults, so `at` may lie past the data).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn prefetch_line(at: *const u8, once: bool) {
    use std::arch::x86_64::{_MM_HINT_NTA, _MM_HINT_T1, _mm_prefetch};
    // SAFETY: a prefetch never faults, whatever the address.
    unsafe {
        if once {
            _mm_prefetch::<_MM_HINT_NTA>(at.cast());
        } else {
            _mm_prefetch::<_MM_HINT_T1>(at.cast());
        }
    }
}

/// Asks for the scales and zero points of blocks `blocks` of packed tiles `tiles` (a fifth
/// of a Q4_1 import's bytes, in streams of their own): another 7-13% decode on a Zen 5. The
/// single-row AVX-512 kernel asks block by block in its block loop instead; kernels of more
/// rows have no registers to spare for these pointers there (asking there cost prefill
/// 6-8%) and call this once per tile, before its blocks. The single-row 256-bit kernel of a
/// call that reads its weights `once` asks past the outer caches (default model decode
/// +6-14% on a Zen 2); every other kernel asks into L2, as before.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
pub(super) fn prefetch_stats(
    w: &PackedNBits,
    tiles: Range<usize>,
    blocks: Range<usize>,
    once: bool,
) {
    let kb = w.layout.k_blocks;
    for tile in tiles {
        let values = (tile * kb + blocks.start) * TILE..(tile * kb + blocks.end) * TILE;
        let floats =
            |f: &Floats| float_at(f.ptrs(), values.start).map(|(p, size)| (p, size * values.len()));
        let zero_points = match &w.zero_points {
            PackedZp::Float(z) => floats(z),
            PackedZp::Codes(c) => Some((c.as_ptr().wrapping_add(values.start), values.len())),
            PackedZp::Default => None,
        };
        for (start, bytes) in [floats(&w.scales), zero_points].into_iter().flatten() {
            // From the line holding the first byte to the one holding the last.
            let first = start as usize & !63;
            let lines = (start as usize + bytes).div_ceil(64) - first / 64;
            // Into L2 through `prefetch_lines` as before: one loop for both hints cost
            // prefill 5-7% on a Zen 2.
            if once {
                for line in 0..lines {
                    prefetch_line((first + 64 * line) as *const u8, true);
                }
            } else {
                crate::mem::prefetch_lines(first as *const u8, 64 * lines);
            }
        }
    }
}

/// Where value `at` of f32 or f16 storage `(p32, p16)` lies (the f16 when both are set, as
/// the kernels read it), and the bytes per value; `None` when there is no storage.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn float_at(
    (p32, p16): (*const f32, *const u16),
    at: usize,
) -> Option<(*const u8, usize)> {
    match (p16.is_null(), p32.is_null()) {
        (false, _) => Some((p16.wrapping_add(at).cast(), 2)),
        (true, false) => Some((p32.wrapping_add(at).cast(), 4)),
        (true, true) => None,
    }
}

/// What a tile kernel reads, after the checks that make its raw loads sound.
pub(super) struct TileIo<'a, const R: usize> {
    /// Each row's activation codes, in K order, whole blocks.
    pub(super) naturals: [*const i8; R],
    pub(super) scale_ptrs: (*const f32, *const u16),
    /// Float zero points (null when there are none).
    pub(super) zp_ptrs: (*const f32, *const u16),
    /// Integer zero-point codes (empty when there are none).
    pub(super) codes: &'a [u8],
    /// Each row's per-block scales, `Σ q_a` and `scale_a · Σ q_a`, `k_blocks` of each.
    pub(super) row_scales: [*const f32; R],
    pub(super) row_sums: [*const i32; R],
    pub(super) row_scaled_sums: [*const f32; R],
    pub(super) tile_bytes: usize,
}

/// Checks that tiles `t..t + count` of `w` exist with their scales (and float zero points)
/// and that every row holds whole blocks; panics otherwise (a caller bug, never input).
#[inline(always)]
pub(super) fn tile_io<'a, const R: usize>(
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
        zp_ptrs: zp_floats.map_or((std::ptr::null(), std::ptr::null()), Floats::ptrs),
        codes: match &w.zero_points {
            PackedZp::Codes(z) => z,
            _ => &[],
        },
        row_scales: rows.map(|r| r.scales().as_ptr()),
        row_sums: rows.map(|r| r.sums().as_ptr()),
        row_scaled_sums: rows.map(|r| r.scaled_sums().as_ptr()),
        tile_bytes,
    }
}
