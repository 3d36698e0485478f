//! [`Mxfp4Packed`]: an MXFP4 matrix repacked at load into the int8 kernels' tiles of 16
//! columns by one block (the layout `int8`'s module doc describes), and the gathering of one
//! such tile from the stored layout, which the kernels also do on the fly.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::{BLOCK, Mxfp4Weights};
use crate::error::{KernelError, numel};

/// Columns of a tile.
pub(super) const TILE_COLS: usize = 16;
/// Bytes of one group of four inputs of a tile.
pub(super) const GROUP_BYTES: usize = 32;
/// Bytes of a tile's block: eight groups, then the scales.
pub(super) const TILE_BYTES: usize = (BLOCK / 4) * GROUP_BYTES + TILE_COLS;

/// An MXFP4 matrix repacked at load into the kernels' tiles (see the module doc): the same
/// codes and scales, read in order. A last tile past `n` holds zero codes.
#[derive(Debug, Clone)]
pub struct Mxfp4Packed {
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) bytes: Vec<u8>,
}

impl Mxfp4Packed {
    /// `w` in tiles, each tile's blocks in K order.
    pub fn pack(w: &Mxfp4Weights) -> Result<Mxfp4Packed, KernelError> {
        w.check()?;
        let blocks = w.k / BLOCK;
        let tiles = w.n.div_ceil(TILE_COLS);
        let mut bytes = vec![0u8; numel(&[tiles, blocks, TILE_BYTES])?];
        for (i, chunk) in bytes.chunks_exact_mut(TILE_BYTES).enumerate() {
            gather(w, i / blocks.max(1), i % blocks.max(1), chunk);
        }
        Ok(Mxfp4Packed {
            n: w.n,
            k: w.k,
            bytes,
        })
    }

    /// The packed bytes (what a pass over the matrix reads).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// `(n, k)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }
}

/// Block `b` of tile `tile` of the stored matrix `w`, in the packed form, into `out`
/// (`TILE_BYTES`).
pub(super) fn gather(w: &Mxfp4Weights, tile: usize, b: usize, out: &mut [u8]) {
    let (n, blocks) = (w.n, w.k / BLOCK);
    let cols = tile * TILE_COLS..((tile + 1) * TILE_COLS).min(n);
    let (codes, scales) = out.split_at_mut(TILE_BYTES - TILE_COLS);
    let rows = |kk: usize| &w.codes[(b * BLOCK + kk) * (n / 2) + cols.start / 2..];
    #[cfg(target_arch = "x86_64")]
    if cols.len() == TILE_COLS {
        for (g, group) in codes.chunks_exact_mut(GROUP_BYTES).enumerate() {
            let four = [
                rows(4 * g),
                rows(4 * g + 1),
                rows(4 * g + 2),
                rows(4 * g + 3),
            ];
            transpose_group(four, group);
        }
    } else {
        gather_scalar(rows, cols.len(), codes);
    }
    #[cfg(not(target_arch = "x86_64"))]
    gather_scalar(rows, cols.len(), codes);
    scales.fill(127);
    for (s, col) in scales.iter_mut().zip(cols) {
        *s = w.scales[col * blocks + b];
    }
}

/// [`gather`]'s codes for the first `width` columns of a tile, one nibble at a time;
/// `rows(kk)` is input `kk`'s stored codes from the tile's first column.
fn gather_scalar<'a>(rows: impl Fn(usize) -> &'a [u8], width: usize, codes: &mut [u8]) {
    codes.fill(0);
    for kk in 0..BLOCK {
        let row = rows(kk);
        let group = &mut codes[(kk / 4) * GROUP_BYTES..][..GROUP_BYTES];
        for i in 0..width {
            let code = (row[i / 2] >> ((i % 2) * 4)) & 0xF;
            group[4 * (i % 8) + kk % 4] |= code << (4 * (i / 8));
        }
    }
}

/// One group of a whole tile into `out` (`GROUP_BYTES`) from its four inputs' stored codes
/// (from the tile's first column: column `2p` in byte `p`'s low nibble, `2p + 1` in its high
/// one): byte `4i + r` of `out` is input `r`'s code of column `i` in the low nibble and of
/// column `8 + i` in the high one.
#[cfg(target_arch = "x86_64")]
#[inline]
fn transpose_group(rows: [&[u8]; 4], out: &mut [u8]) {
    let out = &mut out[..GROUP_BYTES];
    // SAFETY: SSE2 is part of x86-64; each load reads 8 bytes of a slice checked to hold
    // them, the stores 32 bytes of `out`.
    unsafe {
        let nibble = _mm_set1_epi8(0x0F);
        // Per input: the codes of columns i and 8 + i in byte i.
        let pairs = rows.map(|row| {
            let v = _mm_loadl_epi64(row[..8].as_ptr().cast());
            let low = _mm_and_si128(v, nibble);
            let high = _mm_and_si128(_mm_srli_epi16::<4>(v), nibble);
            // Byte c: column c's code.
            let codes = _mm_unpacklo_epi8(low, high);
            // Codes are under 16, so a 16-bit shift moves each byte's into its high nibble.
            _mm_or_si128(codes, _mm_slli_epi16::<4>(_mm_srli_si128::<8>(codes)))
        });
        let even = _mm_unpacklo_epi8(pairs[0], pairs[1]);
        let odd = _mm_unpacklo_epi8(pairs[2], pairs[3]);
        _mm_storeu_si128(out.as_mut_ptr().cast(), _mm_unpacklo_epi16(even, odd));
        _mm_storeu_si128(
            out.as_mut_ptr().add(16).cast(),
            _mm_unpackhi_epi16(even, odd),
        );
    }
}
