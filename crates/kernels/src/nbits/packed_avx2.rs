//! The AVX2 and AVX-VNNI tile kernels over [`super::packed`]'s layout (eight columns per
//! 256-bit vector), each row's arithmetic that of [`super::int8_reference`], bit for bit (see
//! `packed`'s module doc for the layout and why the lanes hold output columns).
//! [`super::packed_matmul`] chooses which to call for which rows and columns.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::layout::TILE;
use super::packed::{PackedNBits, PackedZp};
use super::tile_io::{
    Ahead, TileIo, ZP_CODES, ZP_DEFAULT, ZP_FLOAT, prefetch_line, prefetch_stats, tile_io, with_zp,
};
use crate::int8::QuantizedRow;
use crate::int8::Variant;

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
    isa: Variant,
    ahead: Ahead,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match (w.layout.bits, isa) {
            (4, Variant::AvxVnni) => with_zp!(tile_vnni::<4, R>(rows, w, t, out, ahead)),
            (4, _) => with_zp!(tile_avx2::<4, R>(rows, w, t, out, ahead)),
            (_, Variant::AvxVnni) => with_zp!(tile_vnni::<8, R>(rows, w, t, out, ahead)),
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
    isa: Variant,
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

/// Defines the tile kernel for AVX2 alone or with AVX-VNNI (see [`super::stored_avx2`]).
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
                prefetch_stats(w, tile..tile + 1, 0..kb, ahead.once && R == 1);
            }
            let data = w.data.as_ptr().wrapping_add(t * tile_bytes);
            let low = _mm256_set1_epi8(0x0F);
            let flip = _mm256_set1_epi8(-128);
            let ones = _mm256_set1_epi16(1);
            let mut acc = [_mm256_setzero_ps(); R];
            // The same chunk `ahead.tiles` tiles on: its lines are asked for as the chunk is
            // read, a constant two (4-bit) or four lines, no loop of its own.
            let ahead_bytes = ahead.tiles * tile_bytes;
            for b in 0..kb {
                let mut dots = [_mm256_setzero_si256(); R];
                for sub in 0..bs / 32 {
                    let chunk = data.wrapping_add((b * (bs / 32) + sub) * chunk_bytes);
                    if ahead.tiles > 0 {
                        for line in 0..chunk_bytes / 64 {
                            prefetch_line(chunk.wrapping_add(ahead_bytes + 64 * line), ahead.once);
                        }
                    }
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
                                } else {
                                    // 8-bit codes: recentred to signed, as in stored_avx2.
                                    let signed = _mm256_xor_si256($w, flip);
                                    let pairs = _mm256_maddubs_epi16(
                                        _mm256_abs_epi8(signed),
                                        _mm256_sign_epi8(group!($r, $g), signed),
                                    );
                                    _mm256_add_epi32($dot, _mm256_madd_epi16(pairs, ones))
                                }
                            };
                        }
                        if BITS == 4 && !$vnni {
                            // The chunk's eight pair sums per lane add up in i16: each is at
                            // most 2·15·127 in magnitude, eight of them 30480 < 2^15, so the
                            // sum is exact and one `vpmaddwd` per chunk (not per pair sum)
                            // widens it. Halves the multiplies on CPUs with one port for them.
                            let mut pairs = [_mm256_setzero_si256(); R];
                            for i in 0..4 {
                                let x = _mm256_loadu_si256(chunk.add(32 * i).cast());
                                let lo = _mm256_and_si256(x, low);
                                let hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), low);
                                for (r, sum) in pairs.iter_mut().enumerate() {
                                    let l = _mm256_maddubs_epi16(lo, group!(r, 2 * i));
                                    let h = _mm256_maddubs_epi16(hi, group!(r, 2 * i + 1));
                                    *sum = _mm256_add_epi16(*sum, _mm256_add_epi16(l, h));
                                }
                            }
                            for (dot, sum) in dots.iter_mut().zip(pairs) {
                                *dot = _mm256_add_epi32(*dot, _mm256_madd_epi16(sum, ones));
                            }
                        } else if BITS == 4 {
                            // AVX-VNNI: `vpdpbusd` adds each pair of four products itself.
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
