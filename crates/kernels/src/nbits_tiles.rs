//! The x86 tile kernels over [`crate::nbits_packed`]'s layout: AVX2, AVX-VNNI (eight columns
//! per 256-bit vector) and AVX-512 VNNI (two tiles per 512-bit vector), each row's arithmetic
//! that of [`crate::matmul_nbits_int8`]'s reference, bit for bit (see `nbits_packed`'s module
//! doc for the layout and why the lanes hold output columns). `nbits_packed` chooses which to
//! call for which rows and columns.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use std::ops::Range;

use crate::nbits_avx2::{Isa, QuantizedRow, TILE};
use crate::nbits_packed::{Floats, Meta, PackedNBits, PackedZp};

/// The kinds of [`PackedZp`], as a kernel's const parameter: each kernel instance then holds
/// only its own block epilogue, with no branch per block or row.
const ZP_DEFAULT: u8 = 0;
const ZP_CODES: u8 = 1;
const ZP_FLOAT: u8 = 2;

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

/// Tile `t`'s eight column sums (before the bias) for each of `R` rows, on `isa` (a
/// 256-bit variant), prefetching tile `t + ahead.tiles` meanwhile.
///
/// # Safety
/// `isa` must be available and `t < w.tiles`.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn tile<const R: usize>(
    rows: [&QuantizedRow; R],
    w: &PackedNBits,
    t: usize,
    out: &mut [[f32; TILE]; R],
    isa: Isa,
    ahead: Ahead,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match (w.layout.bits, isa) {
            (4, Isa::AvxVnni) => with_zp!(tile_vnni::<4, R>(rows, w, t, out, ahead)),
            (4, _) => with_zp!(tile_avx2::<4, R>(rows, w, t, out, ahead)),
            (_, Isa::AvxVnni) => with_zp!(tile_vnni::<8, R>(rows, w, t, out, ahead)),
            (_, _) => with_zp!(tile_avx2::<8, R>(rows, w, t, out, ahead)),
        }
    }
}

/// Gate tile `2t` and up tile `2t + 1` of a [`PackedNBits::pack_glu`] matrix side by side,
/// for each of `R` rows, on `isa` (a 256-bit variant), each prefetching `ahead.tiles` ahead.
///
/// # Safety
/// `isa` must be available and `2t + 1 < w.tiles`.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn tile_glu<const R: usize>(
    rows: [&QuantizedRow; R],
    w: &PackedNBits,
    t: usize,
    out: &mut [[f32; 2 * TILE]; R],
    isa: Isa,
    ahead: Ahead,
) {
    let (mut gate, mut up) = ([[0f32; TILE]; R], [[0f32; TILE]; R]);
    // SAFETY: forwarded from the caller.
    unsafe {
        tile(rows, w, 2 * t, &mut gate, isa, ahead);
        tile(rows, w, 2 * t + 1, &mut up, isa, ahead);
    }
    for ((o, g), u) in out.iter_mut().zip(&gate).zip(&up) {
        o[..TILE].copy_from_slice(g);
        o[TILE..].copy_from_slice(u);
    }
}

/// Tiles `t` and `t + 1` (sixteen column sums before the bias) for each of `R` rows, whose
/// block statistics `meta` holds from the first row's on (see [`Meta`]); meanwhile tiles
/// `t + ahead.tiles` and the one after are prefetched.
///
/// # Safety
/// AVX-512 VNNI must be available and `t + 1 < w.tiles`.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn tile_pair<const R: usize>(
    rows: [&QuantizedRow; R],
    meta: &[f32],
    w: &PackedNBits,
    t: usize,
    out: &mut [[f32; 2 * TILE]; R],
    ahead: Ahead,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match w.layout.bits {
            4 => with_zp!(tile_pair_avx512::<4, R>(rows, w, meta, t, out, ahead)),
            _ => with_zp!(tile_pair_avx512::<8, R>(rows, w, meta, t, out, ahead)),
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
unsafe fn tile_pair_avx512<const BITS: u32, const R: usize, const ZP: u8>(
    rows: [&QuantizedRow; R],
    w: &PackedNBits,
    meta: &[f32],
    t: usize,
    out: &mut [[f32; 2 * TILE]; R],
    ahead: Ahead,
) {
    let l = &w.layout;
    let (kb, bs) = (l.k_blocks, l.block_size);
    let chunk_bytes = 32 * BITS as usize;
    let TileIo {
        naturals,
        scale_ptrs,
        zp_ptrs,
        codes,
        tile_bytes,
        ..
    } = tile_io(rows, w, t, 2, BITS);
    assert!(
        R <= Meta::ROWS && meta.len() >= (kb - 1) * Meta::BLOCK + 2 * Meta::ROWS + R,
        "block statistics for every row and block"
    );
    let meta = meta.as_ptr();
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
    // Tiles `t + ahead.tiles` and the one after.
    let (first, last) = (t + ahead.tiles, t + ahead.tiles + 2);
    let stats_per_block = ahead.tiles > 0 && ahead.stats && R == 1;
    if ahead.tiles > 0 && ahead.stats && R > 1 {
        prefetch_stats(w, first..last, 0..kb);
    }
    let data = w.data.as_ptr().wrapping_add(t * tile_bytes);
    let low = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..kb {
        if ahead.tiles > 0 {
            prefetch_block(w, first, b);
            prefetch_block(w, first + 1, b);
        }
        if stats_per_block {
            // The lines holding block b's scales and zero points (pointers already in
            // registers: one address each).
            for tile in first..last {
                let at = (tile * kb + b) * TILE;
                for (p, _) in [scale_ptrs, zp_ptrs]
                    .into_iter()
                    .filter_map(|f| float_at(f, at))
                {
                    crate::mem::prefetch_lines(p, 1);
                }
                if !codes.is_empty() {
                    crate::mem::prefetch_lines(codes.as_ptr().wrapping_add(at), 1);
                }
            }
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
        // The block's zero points: integer codes (as f32) or float offsets, per ZP.
        let (z, offsets) = match ZP {
            ZP_CODES => {
                let (lo, hi) = (&codes[a0..a0 + TILE], &codes[a1..a1 + TILE]);
                // SAFETY: `lo` and `hi` hold 8 bytes each.
                let both = unsafe {
                    _mm_unpacklo_epi64(
                        _mm_loadl_epi64(lo.as_ptr().cast()),
                        _mm_loadl_epi64(hi.as_ptr().cast()),
                    )
                };
                (
                    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(both)),
                    _mm512_setzero_ps(),
                )
            }
            ZP_FLOAT => (_mm512_setzero_ps(), load16(zp_ptrs, a0, a1)),
            _ => (
                _mm512_set1_ps((1 << (BITS - 1)) as f32),
                _mm512_setzero_ps(),
            ),
        };
        for r in 0..R {
            // SAFETY: `meta` holds `kb` blocks of statistics for these rows (asserted above).
            let (row_scale, sum_a, scaled_sum) = unsafe {
                let m = meta.add(b * Meta::BLOCK + r);
                (*m, *m.add(Meta::ROWS), *m.add(2 * Meta::ROWS))
            };
            let scale = _mm512_mul_ps(sw, _mm512_set1_ps(row_scale));
            let dot = _mm512_cvtepi32_ps(dots[r]);
            acc[r] = match ZP {
                ZP_FLOAT => {
                    let a = _mm512_fmadd_ps(scale, dot, acc[r]);
                    _mm512_fmadd_ps(offsets, _mm512_set1_ps(scaled_sum), a)
                }
                // `dot − z·sum_a` in f32 with one rounding, of an integer no larger than
                // 2^24 (`PackedNBits` packs no block size where it could be): exact, so
                // the reference's integer difference converted.
                _ => _mm512_fmadd_ps(
                    scale,
                    _mm512_fnmadd_ps(z, _mm512_set1_ps(sum_a), dot),
                    acc[r],
                ),
            };
        }
    }
    for (o, acc) in out.iter_mut().zip(acc) {
        // SAFETY: `o` holds 16 f32.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), acc) };
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
}

impl Ahead {
    pub(crate) const NONE: Ahead = Ahead {
        tiles: 0,
        stats: false,
    };
}

/// Asks for block `b` of packed tile `tile`'s codes, a tile the task takes a few tiles later.
/// A decode token streams every weight once from a cache the machine shares, and the
/// hardware prefetcher restarts at every matrix and page: fetching the next tile's codes
/// gained 4-12% decode on a Xeon, fetching about 8 KB ahead (`nbits_packed`'s
/// `PREFETCH_BYTES`) ~4% more on a Zen 5. A prefetch never faults, so `tile` may lie past the
/// last tile.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_block(w: &PackedNBits, tile: usize, b: usize) {
    let l = &w.layout;
    // 8 columns x block_size codes x bits / 8 per tile and block.
    let block_bytes = l.block_size * l.bits as usize;
    let at = (tile * l.k_blocks + b) * block_bytes;
    crate::mem::prefetch_lines(w.data.as_ptr().wrapping_add(at), block_bytes);
}

/// Asks for the scales and zero points of blocks `blocks` of packed tiles `tiles` (a fifth
/// of a Q4_1 import's bytes, in streams of their own): another 7-13% decode on a Zen 5. The
/// single-row AVX-512 kernel asks block by block in its block loop instead; kernels of more
/// rows have no registers to spare for these pointers there (asking there cost prefill
/// 6-8%) and call this once per tile, before its blocks.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
fn prefetch_stats(w: &PackedNBits, tiles: Range<usize>, blocks: Range<usize>) {
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
            crate::mem::prefetch_lines(first as *const u8, 64 * lines);
        }
    }
}

/// Where value `at` of f32 or f16 storage `(p32, p16)` lies (the f16 when both are set, as
/// the kernels read it), and the bytes per value; `None` when there is no storage.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn float_at((p32, p16): (*const f32, *const u16), at: usize) -> Option<(*const u8, usize)> {
    match (p16.is_null(), p32.is_null()) {
        (false, _) => Some((p16.wrapping_add(at).cast(), 2)),
        (true, false) => Some((p32.wrapping_add(at).cast(), 4)),
        (true, true) => None,
    }
}

/// What a tile kernel reads, after the checks that make its raw loads sound.
struct TileIo<'a, const R: usize> {
    /// Each row's activation codes, in K order, whole blocks.
    naturals: [*const i8; R],
    scale_ptrs: (*const f32, *const u16),
    /// Float zero points (null when there are none).
    zp_ptrs: (*const f32, *const u16),
    /// Integer zero-point codes (empty when there are none).
    codes: &'a [u8],
    /// Each row's per-block scales, `Σ q_a` and `scale_a · Σ q_a`, `k_blocks` of each.
    row_scales: [*const f32; R],
    row_sums: [*const i32; R],
    row_scaled_sums: [*const f32; R],
    tile_bytes: usize,
}

/// Checks that tiles `t..t + count` of `w` exist with their scales (and float zero points)
/// and that every row holds whole blocks; panics otherwise (a caller bug, never input).
#[inline(always)]
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

/// Defines the tile kernel for AVX2 alone or with AVX-VNNI (see [`crate::nbits_avx2`]).
macro_rules! packed_tile {
    ($name:ident, $features:literal, $vnni:literal) => {
        /// Tile `t`'s eight column sums (before the bias) for each of the `R` rows into
        /// `out`: each 32-byte weight load serves every row; meanwhile tile `t + ahead.tiles`
        /// is prefetched.
        ///
        /// # Safety
        /// The named CPU features must be available and `t < w.tiles`.
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name<const BITS: u32, const R: usize, const ZP: u8>(
            rows: [&QuantizedRow; R],
            w: &PackedNBits,
            t: usize,
            out: &mut [[f32; TILE]; R],
            ahead: Ahead,
        ) {
            let l = &w.layout;
            let (kb, bs) = (l.k_blocks, l.block_size);
            let chunk_bytes = 32 * BITS as usize;
            let TileIo {
                naturals,
                scale_ptrs,
                zp_ptrs,
                codes,
                row_scales,
                row_sums,
                row_scaled_sums,
                tile_bytes,
                ..
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
            if ahead.tiles > 0 && ahead.stats {
                let tile = t + ahead.tiles;
                prefetch_stats(w, tile..tile + 1, 0..kb);
            }
            let data = w.data.as_ptr().wrapping_add(t * tile_bytes);
            let low = _mm256_set1_epi8(0x0F);
            let flip = _mm256_set1_epi8(-128);
            let ones = _mm256_set1_epi16(1);
            let mut acc = [_mm256_setzero_ps(); R];
            for b in 0..kb {
                if ahead.tiles > 0 {
                    prefetch_block(w, t + ahead.tiles, b);
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
                // The block's zero points: integer codes or float offsets, per ZP.
                let (z, offsets) = match ZP {
                    ZP_CODES => {
                        let z = &codes[at..at + TILE];
                        // SAFETY: `z` holds 8 bytes.
                        let z = unsafe { _mm_loadl_epi64(z.as_ptr().cast()) };
                        (_mm256_cvtepu8_epi32(z), _mm256_setzero_ps())
                    }
                    // SAFETY: `at + 8 <= len`, as for the scales (asserted above).
                    ZP_FLOAT => (_mm256_setzero_si256(), unsafe { load8!(zp_ptrs, at) }),
                    _ => (_mm256_setzero_si256(), _mm256_setzero_ps()),
                };
                for r in 0..R {
                    // SAFETY: every row holds `kb` blocks of scales and sums (asserted by
                    // `tile_io`).
                    let (row_scale, sum_a, scaled_sum) = unsafe {
                        (
                            *row_scales[r].add(b),
                            *row_sums[r].add(b),
                            *row_scaled_sums[r].add(b),
                        )
                    };
                    let mut dot = dots[r];
                    if BITS == 8 && !$vnni {
                        // Σ w·a = Σ (w - 128)·a + 128·Σ a.
                        dot = _mm256_add_epi32(dot, _mm256_set1_epi32(128 * sum_a));
                    }
                    let scale = _mm256_mul_ps(sw, _mm256_set1_ps(row_scale));
                    let centered = |zs| _mm256_cvtepi32_ps(_mm256_sub_epi32(dot, zs));
                    acc[r] = match ZP {
                        ZP_CODES => {
                            let zs = _mm256_mullo_epi32(z, _mm256_set1_epi32(sum_a));
                            _mm256_fmadd_ps(scale, centered(zs), acc[r])
                        }
                        ZP_FLOAT => {
                            let a = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot), acc[r]);
                            _mm256_fmadd_ps(offsets, _mm256_set1_ps(scaled_sum), a)
                        }
                        _ => {
                            let zs = _mm256_set1_epi32((1 << (BITS - 1)) * sum_a);
                            _mm256_fmadd_ps(scale, centered(zs), acc[r])
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
