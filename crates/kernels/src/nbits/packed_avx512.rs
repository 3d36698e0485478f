//! The AVX-512 VNNI tile kernel over [`super::packed`]'s layout: two tiles per 512-bit vector,
//! each lane's arithmetic that of the 256-bit kernel ([`super::packed_avx2`]) for its column,
//! so each row's bits are [`super::int8_reference`]'s.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::layout::TILE;
use super::packed::{PackedNBits, PackedZp};
use super::tile_io::{
    Ahead, Meta, TileIo, ZP_CODES, ZP_DEFAULT, ZP_FLOAT, float_at, prefetch_block, prefetch_stats,
    tile_io, with_zp,
};
use crate::int8::QuantizedRow;

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
        prefetch_stats(w, first..last, 0..kb, false);
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
