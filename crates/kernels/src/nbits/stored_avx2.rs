//! AVX2 `MatMulNBits` with int8 activations, 4- or 8-bit weights and blocks of a multiple of
//! 32: the same arithmetic as [`super::int8_reference`], bit for bit. AVX2 alone or with
//! AVX-VNNI: an AVX-512 variant runs its 256-bit sibling here ([`Variant::ymm`]).
//!
//! Why it is bit-identical: a block's dot product `Σ q_w·q_a` is an exact integer in any
//! order, so it may be computed 32 products at a time (`vpmaddubsw` of the unsigned weight
//! codes with the signed activation codes, then `vpmaddwd` by ones; a pair sum is at most
//! 2·15·127, far from i16 saturation). The float part runs with eight output columns in the
//! eight lanes and does exactly the reference's operations per column, in its order: the
//! product `scale = s·scale_a`, then the same fused multiply-adds block after block in K
//! order, the bias last.
//!
//! 8-bit codes (0..=255) times int8 activations would saturate `vpmaddubsw`'s pair sums, so
//! they are recentred to `w - 128` (signed) and multiplied as `|w - 128|` (unsigned, at most
//! 128) by the activation carrying the sign of `w - 128` (`vpsignb`): pair sums stay within
//! 2·128·127. The exact dot is then `Σ (w - 128)·a + 128·Σ a`.
//!
//! Layout trick: a 4-bit blob stores element `2i` in the low nibble of byte `i` and `2i + 1`
//! in the high one. Instead of interleaving nibbles for every weight block, each row's
//! activation codes are permuted once per 32-value chunk into `[even | odd]` order, so a
//! chunk's weights are just `[bytes & 15 | bytes >> 4]`.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::ops::Range;

use super::int8_reference::{block_offset, row_part as reference_row_part};
use super::layout::{QuantWeights, ZeroPoints};
use crate::int8::QuantizedRow;
use crate::int8::Variant;
use crate::quant::code;

/// How far ahead of the current block each weight stream is prefetched, in bytes.
const PREFETCH_AHEAD: usize = 512;

/// Columns `cols` of one output row from its quantized activations. The caller checked
/// [`super::isa::supported`].
pub(crate) fn row_part(
    row: &QuantizedRow,
    w: &QuantWeights<'_, f32>,
    bias: Option<&[f32]>,
    cols: Range<usize>,
    out: &mut [f32],
    isa: Variant,
) {
    #[cfg(target_arch = "x86_64")]
    {
        let mut j = cols.start;
        let mut o = 0;
        while j + 8 <= cols.end {
            // SAFETY: `supported` checked AVX2 at run time and the caller passes an `isa`
            // from `Variant::available`; the tile asserts its bounds (the caller validated the
            // weight lengths with `check_args`).
            unsafe {
                let out = &mut out[o..o + 8];
                match (w.layout.bits, isa.ymm()) {
                    (4, Variant::AvxVnni) => tile8_vnni::<4>(row, w, bias, j, out),
                    (4, _) => tile8_avx2::<4>(row, w, bias, j, out),
                    (_, Variant::AvxVnni) => tile8_vnni::<8>(row, w, bias, j, out),
                    (_, _) => tile8_avx2::<8>(row, w, bias, j, out),
                }
            };
            j += 8;
            o += 8;
        }
        // The columns that don't fill a tile run the reference.
        reference_row_part(
            &row.natural,
            &row.scales,
            w,
            bias,
            j..cols.end,
            &mut out[o..],
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        reference_row_part(&row.natural, &row.scales, w, bias, cols, out);
    }
}

/// Defines a kernel over eight output columns `j0..j0 + 8`, for AVX2 alone or with AVX-VNNI
/// (`vpdpbusd` does the multiply, pair sums and accumulation of the AVX2 sequence in one
/// instruction, in i32, so 8-bit codes need no recentring). Both give the same integers.
///
/// # Safety
/// The named CPU features must be available, `j0 + 8 <= n`, `out` must hold 8 values, and `w`
/// must have passed `check_args` (so every pointer below stays inside its slice).
macro_rules! tile8_kernel {
    ($name:ident, $features:literal, $vnni:literal) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name<const BITS: u32>(
            row: &QuantizedRow,
            w: &QuantWeights<'_, f32>,
            bias: Option<&[f32]>,
            j0: usize,
            out: &mut [f32],
        ) {
            let l = &w.layout;
            let (kb, blob, bs) = (l.k_blocks, l.blob_size, l.block_size);
            let row_bytes = kb * blob;
            assert!(
                (j0 + 8) * row_bytes <= w.data.len()
                    && (j0 + 8) * kb <= w.scales.len()
                    && row.q.len() >= kb * bs
                    && row.natural.len() >= kb * bs
                    && row.sums.len() >= kb
                    && row.scaled_sums.len() >= kb
                    && row.scales.len() >= kb
                    && out.len() >= 8,
                "tile8 arguments were checked by check_args"
            );
            let data = w.data.as_ptr().wrapping_add(j0 * row_bytes);
            let scales = w.scales.as_ptr().wrapping_add(j0 * kb);
            // Column c's value for block b sits at `c * kb + b` in the scales and float zero points.
            let stride = kb as i32;
            let gather_idx = _mm256_setr_epi32(
                0,
                stride,
                2 * stride,
                3 * stride,
                4 * stride,
                5 * stride,
                6 * stride,
                7 * stride,
            );
            let low = _mm256_set1_epi8(0x0F);
            // XOR with 0x80 turns an unsigned code w into the signed byte w - 128.
            let flip = _mm256_set1_epi8(-128);
            let ones = _mm256_set1_epi16(1);
            let mut acc = _mm256_setzero_ps();
            let mut zp_int = [0i32; 8];
            let mut offsets = [0f32; 8];
            for b in 0..kb {
                // Eight weight streams, one per column: ask for each stream's data a few cache lines
                // ahead (a hint only; never faults, so the address may run past the row).
                if (b * blob).is_multiple_of(64) {
                    for c in 0..8 {
                        _mm_prefetch::<_MM_HINT_T0>(
                            data.wrapping_add(c * row_bytes + b * blob + PREFETCH_AHEAD)
                                .cast(),
                        );
                    }
                }
                let mut dots = [_mm256_setzero_si256(); 8];
                for chunk in 0..bs / 32 {
                    // SAFETY: the assert above bounds every offset: `b * bs + chunk * 32 + 32 <= kb * bs`
                    // and `c * row_bytes + b * blob + chunk * BITS * 4 + BITS * 4 <= 8 * row_bytes`.
                    unsafe {
                        if BITS == 4 {
                            let a =
                                _mm256_loadu_si256(row.q.as_ptr().add(b * bs + chunk * 32).cast());
                            let wb = data.add(b * blob + chunk * 16);
                            for (c, dot) in dots.iter_mut().enumerate() {
                                let packed = _mm_loadu_si128(wb.add(c * row_bytes).cast());
                                let wide = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
                                let codes = _mm256_and_si256(wide, low);
                                *dot = if $vnni {
                                    _mm256_dpbusd_avx_epi32(*dot, codes, a)
                                } else {
                                    let pairs = _mm256_maddubs_epi16(codes, a);
                                    _mm256_add_epi32(*dot, _mm256_madd_epi16(pairs, ones))
                                };
                            }
                        } else {
                            let a = _mm256_loadu_si256(
                                row.natural.as_ptr().add(b * bs + chunk * 32).cast(),
                            );
                            let wb = data.add(b * blob + chunk * 32);
                            for (c, dot) in dots.iter_mut().enumerate() {
                                let codes = _mm256_loadu_si256(wb.add(c * row_bytes).cast());
                                *dot = if $vnni {
                                    // Four-product sums in i32: no saturation, no recentring.
                                    _mm256_dpbusd_avx_epi32(*dot, codes, a)
                                } else {
                                    let signed = _mm256_xor_si256(codes, flip);
                                    let pairs = _mm256_maddubs_epi16(
                                        _mm256_abs_epi8(signed),
                                        _mm256_sign_epi8(a, signed),
                                    );
                                    _mm256_add_epi32(*dot, _mm256_madd_epi16(pairs, ones))
                                };
                            }
                        }
                    }
                }
                let sum_a = row.sums[b];
                let dot = if BITS == 4 || $vnni {
                    hsum8(&dots)
                } else {
                    // Σ w·a = Σ (w - 128)·a + 128·Σ a.
                    _mm256_add_epi32(hsum8(&dots), _mm256_set1_epi32(128 * sum_a))
                };
                // SAFETY: indices below `(j0 + 8) * kb` (asserted above).
                let sw = unsafe { _mm256_i32gather_ps::<4>(scales.add(b), gather_idx) };
                let scale = _mm256_mul_ps(sw, _mm256_set1_ps(row.scales[b]));
                let centered = |zs: __m256i| _mm256_cvtepi32_ps(_mm256_sub_epi32(dot, zs));
                acc = match w.zero_points {
                    ZeroPoints::Default => {
                        let zs = (1 << (BITS - 1)) * sum_a;
                        _mm256_fmadd_ps(scale, centered(_mm256_set1_epi32(zs)), acc)
                    }
                    ZeroPoints::Packed(z) => {
                        for (c, v) in zp_int.iter_mut().enumerate() {
                            *v = code(&z[(j0 + c) * l.zp_row_bytes..], BITS, b) as i32 * sum_a;
                        }
                        // SAFETY: `zp_int` holds 8 i32.
                        let zs = unsafe { _mm256_loadu_si256(zp_int.as_ptr().cast()) };
                        _mm256_fmadd_ps(scale, centered(zs), acc)
                    }
                    ZeroPoints::Float(z) => {
                        assert!(
                            (j0 + 8) * kb <= z.len(),
                            "zero points checked by check_args"
                        );
                        for (c, o) in offsets.iter_mut().enumerate() {
                            let at = (j0 + c) * kb + b;
                            *o = block_offset(z[at], w.scales[at]);
                        }
                        // SAFETY: `offsets` holds 8 f32.
                        let o = unsafe { _mm256_loadu_ps(offsets.as_ptr()) };
                        let acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot), acc);
                        _mm256_fmadd_ps(o, _mm256_set1_ps(row.scaled_sums[b]), acc)
                    }
                };
            }
            if let Some(bias) = bias {
                let bias = &bias[j0..j0 + 8];
                // SAFETY: `bias` holds 8 f32.
                acc = _mm256_add_ps(acc, unsafe { _mm256_loadu_ps(bias.as_ptr()) });
            }
            // SAFETY: `out` holds at least 8 f32 (asserted above).
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), acc) };
        }
    };
}

tile8_kernel!(tile8_avx2, "avx2,fma", false);
tile8_kernel!(tile8_vnni, "avx2,avxvnni,fma", true);

/// The eight lane sums of eight vectors: lane `c` of the result is `Σ dots[c]`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn hsum8(d: &[__m256i; 8]) -> __m256i {
    let s01 = _mm256_hadd_epi32(d[0], d[1]);
    let s23 = _mm256_hadd_epi32(d[2], d[3]);
    let s45 = _mm256_hadd_epi32(d[4], d[5]);
    let s67 = _mm256_hadd_epi32(d[6], d[7]);
    let s0123 = _mm256_hadd_epi32(s01, s23);
    let s4567 = _mm256_hadd_epi32(s45, s67);
    let lo = _mm256_permute2x128_si256(s0123, s4567, 0x20);
    let hi = _mm256_permute2x128_si256(s0123, s4567, 0x31);
    _mm256_add_epi32(lo, hi)
}
