//! `MatMulNBits` with f32 activations over the stored (ONNX) layout, eight output columns at a
//! time on AVX2: each lane is one column's reference arithmetic ([`super::reference`]:
//! `w = (q - zp) · scale` rounded, then `acc = acc + a · w` in K order, the bias last), so the
//! bits are the reference's. Per block, the eight rows' codes are gathered into one buffer,
//! code `e` of the block then being eight consecutive bytes (4-bit: a nibble of each).
//!
//! Takes 4- and 8-bit codes with default or packed zero points and blocks of at most
//! [`MAX_BLOB`] bytes; [`supported`] says when.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::ops::Range;

use super::layout::{QuantWeights, ZeroPoints};
use crate::cpu;
use crate::quant::{code, default_zero_point};

/// Output columns a vector takes.
pub(super) const COLS: usize = 8;

/// The most bytes a block of one row may take here (a 256-code 8-bit block).
const MAX_BLOB: usize = 256;

/// Whether the vector columns run `w` on this CPU.
pub(super) fn supported(w: &QuantWeights<'_, f32>) -> bool {
    cfg!(target_arch = "x86_64")
        && cpu::isa() >= cpu::Isa::Avx2
        && matches!(w.layout.bits, 4 | 8)
        && w.layout.blob_size <= MAX_BLOB
        && !matches!(w.zero_points, ZeroPoints::Float(_))
}

/// Columns `cols` (a whole number of vectors) of one output row.
///
/// # Safety
/// AVX2 must be available and `w` [`supported`] and checked; `cols` inside `n`,
/// `out.len() == cols.len()`, `a_row.len() == k`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn columns(
    a_row: &[f32],
    w: &QuantWeights<'_, f32>,
    bias: Option<&[f32]>,
    cols: Range<usize>,
    out: &mut [f32],
) {
    let l = &w.layout;
    let row_bytes = l.k_blocks * l.blob_size;
    let default_zp = _mm256_set1_ps(default_zero_point(l.bits) as f32);
    let nibble = _mm256_set1_epi32(0xF);
    // Block `b`'s codes of the eight rows: byte `i` of row `r` at `i * 8 + r`.
    let mut gathered = [0u8; MAX_BLOB * COLS];
    for (j0, out) in cols.step_by(COLS).zip(out.chunks_exact_mut(COLS)) {
        let mut acc = _mm256_setzero_ps();
        for (b, a_block) in a_row.chunks(l.block_size).enumerate() {
            let mut scale = [0f32; COLS];
            let mut zp = [0f32; COLS];
            let blob_at = |r: usize| (j0 + r) * row_bytes + b * l.blob_size;
            if l.blob_size.is_multiple_of(16) {
                for i0 in (0..l.blob_size).step_by(16) {
                    // SAFETY: each row's blob holds 16 bytes from `i0`; `gathered` holds the
                    // block's 8 x blob_size bytes.
                    unsafe {
                        transpose_8x16(
                            std::array::from_fn(|r| w.data.as_ptr().add(blob_at(r) + i0)),
                            gathered.as_mut_ptr().add(i0 * COLS),
                        )
                    };
                }
            } else {
                for r in 0..COLS {
                    let blob = &w.data[blob_at(r)..][..l.blob_size];
                    for (i, &byte) in blob.iter().enumerate() {
                        gathered[i * COLS + r] = byte;
                    }
                }
            }
            for r in 0..COLS {
                let j = j0 + r;
                scale[r] = w.scales[j * l.k_blocks + b];
                if let ZeroPoints::Packed(z) = w.zero_points {
                    zp[r] = code(&z[j * l.zp_row_bytes..], l.bits, b) as f32;
                }
            }
            // SAFETY: both arrays hold one vector.
            let (scale, zp) = unsafe {
                (
                    _mm256_loadu_ps(scale.as_ptr()),
                    match w.zero_points {
                        ZeroPoints::Packed(_) => _mm256_loadu_ps(zp.as_ptr()),
                        _ => default_zp,
                    },
                )
            };
            // Codes `e` in order; a 4-bit byte holds two (the even one low).
            let per_byte = if l.bits == 4 { 2 } else { 1 };
            for (i, a_pair) in a_block.chunks(per_byte).enumerate() {
                // SAFETY: `i < blob_size <= MAX_BLOB`: eight bytes lie in `gathered`.
                let bytes = unsafe { _mm_loadl_epi64(gathered.as_ptr().add(i * COLS).cast()) };
                let bytes = _mm256_cvtepu8_epi32(bytes);
                for (half, &av) in a_pair.iter().enumerate() {
                    let codes = match (l.bits, half) {
                        (4, 0) => _mm256_and_si256(bytes, nibble),
                        (4, _) => _mm256_srli_epi32::<4>(bytes),
                        _ => bytes,
                    };
                    let weight = _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(codes), zp), scale);
                    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(av), weight));
                }
            }
        }
        if let Some(bias) = bias {
            // SAFETY: the columns lie inside `n`, the bias's length.
            acc = _mm256_add_ps(acc, unsafe { _mm256_loadu_ps(bias.as_ptr().add(j0)) });
        }
        // SAFETY: `out` is one vector's chunk.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), acc) };
    }
}

/// Eight rows of 16 bytes (`rows[r]`) to 16 columns of 8 bytes: `out[i * 8 + r] = rows[r][i]`,
/// by three rounds of unpacks.
///
/// # Safety
/// AVX2 (for SSE2) must be available; each `rows[r]` readable for 16 bytes, `out` writable
/// for 128.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose_8x16(rows: [*const u8; COLS], out: *mut u8) {
    // SAFETY: the caller's contract.
    let r: [__m128i; COLS] = std::array::from_fn(|i| unsafe { _mm_loadu_si128(rows[i].cast()) });
    // Bytes of row pairs interleaved: (r0, r1) bytes 0-7, then 8-15, for each pair.
    let a = [
        _mm_unpacklo_epi8(r[0], r[1]),
        _mm_unpackhi_epi8(r[0], r[1]),
        _mm_unpacklo_epi8(r[2], r[3]),
        _mm_unpackhi_epi8(r[2], r[3]),
        _mm_unpacklo_epi8(r[4], r[5]),
        _mm_unpackhi_epi8(r[4], r[5]),
        _mm_unpacklo_epi8(r[6], r[7]),
        _mm_unpackhi_epi8(r[6], r[7]),
    ];
    // Four rows' byte i together: bytes 0-3, 4-7, 8-11, 12-15, for rows 0-3 then 4-7.
    let b = [
        _mm_unpacklo_epi16(a[0], a[2]),
        _mm_unpackhi_epi16(a[0], a[2]),
        _mm_unpacklo_epi16(a[1], a[3]),
        _mm_unpackhi_epi16(a[1], a[3]),
        _mm_unpacklo_epi16(a[4], a[6]),
        _mm_unpackhi_epi16(a[4], a[6]),
        _mm_unpacklo_epi16(a[5], a[7]),
        _mm_unpackhi_epi16(a[5], a[7]),
    ];
    // All eight rows' byte i: two columns per vector.
    for q in 0..4 {
        let lo = _mm_unpacklo_epi32(b[q], b[q + 4]);
        let hi = _mm_unpackhi_epi32(b[q], b[q + 4]);
        // SAFETY: the caller's contract: columns 4q..4q+4 are bytes 32q..32q+32 of `out`.
        unsafe {
            _mm_storeu_si128(out.add(32 * q).cast(), lo);
            _mm_storeu_si128(out.add(32 * q + 16).cast(), hi);
        }
    }
}
