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
            for r in 0..COLS {
                let j = j0 + r;
                let blob = &w.data[j * row_bytes + b * l.blob_size..][..l.blob_size];
                for (i, &byte) in blob.iter().enumerate() {
                    gathered[i * COLS + r] = byte;
                }
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
            for (e, &av) in a_block.iter().enumerate() {
                let (i, shift) = match l.bits {
                    4 => (e / 2, (e % 2) as i32 * 4),
                    _ => (e, 0),
                };
                // SAFETY: `i < blob_size <= MAX_BLOB`: eight bytes lie in `gathered`.
                let bytes = unsafe { _mm_loadl_epi64(gathered.as_ptr().add(i * COLS).cast()) };
                let mut codes = _mm256_cvtepu8_epi32(bytes);
                if l.bits == 4 {
                    codes = _mm256_and_si256(
                        _mm256_srlv_epi32(codes, _mm256_set1_epi32(shift)),
                        nibble,
                    );
                }
                let weight = _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(codes), zp), scale);
                acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(av), weight));
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
