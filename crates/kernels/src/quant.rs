//! Block-quantized integer codes: the bit packing that `MatMulNBits` and
//! `GatherBlockQuantized` share, and the scalar reference of `GatherBlockQuantized` (a gather
//! of quantized rows that dequantizes what it copies).
//!
//! # Packing
//!
//! Codes are unsigned integers of `bits` ∈ {2, 4, 8} bits packed into bytes low bits first:
//! element `e` of a packed run sits in byte `e * bits / 8` at bit offset `(e * bits) % 8`. For
//! 4 bits, element `2j` is the low nibble of byte `j` and element `2j + 1` its high nibble;
//! for 8 bits each byte is one code. Packed uint8 zero points use the same packing, one run
//! per row (a row's run is padded to whole bytes, so rows start on byte boundaries).
//!
//! # Dequantization
//!
//! `value = (q - zero_point) * scale`, computed in f32 — `q - zero_point` is an exact small
//! integer, so this is one rounding — then rounded once to the output type. Without zero
//! points, `zero_point = 2^(bits - 1)` (8 for 4 bits, 128 for 8 bits).
//!
//! References: onnxruntime `docs/ContribOperators.md` (`com.microsoft.MatMulNBits`,
//! `com.microsoft.GatherBlockQuantized`) and its CPU kernel
//! `onnxruntime/contrib_ops/cpu/quantization/gather_block_quantized.cc`, which this kernel
//! reproduces bit for bit (same f32 expression, same single rounding).

use crate::ThreadPool;
use crate::acc::Accum;
use crate::error::{KernelError, check_len, numel};
use crate::par::{par_chunks, parts_for};

/// Code widths the kernels unpack: those that divide 8, so no code straddles two bytes.
pub const SUPPORTED_BITS: [u32; 3] = [2, 4, 8];

/// Checks `bits` is one of [`SUPPORTED_BITS`].
pub fn check_bits(bits: u32) -> Result<(), KernelError> {
    if SUPPORTED_BITS.contains(&bits) {
        Ok(())
    } else {
        Err(KernelError::Shape(format!(
            "{bits}-bit codes are not supported (supported: {SUPPORTED_BITS:?})"
        )))
    }
}

/// The zero point used when none is given: the middle of the code range, `2^(bits - 1)`.
pub const fn default_zero_point(bits: u32) -> u8 {
    1 << (bits - 1)
}

/// Bytes holding `count` packed `bits`-bit codes (the last byte may be partly used).
pub fn packed_bytes(count: usize, bits: u32) -> Result<usize, KernelError> {
    count
        .checked_mul(bits as usize)
        .map(|b| b.div_ceil(8))
        .ok_or_else(|| KernelError::Shape(format!("{count} codes of {bits} bits overflow")))
}

/// Code `e` of a packed run. `bits` must be one of [`SUPPORTED_BITS`] and `e * bits / 8` in
/// bounds (callers validate lengths once, before their loops).
#[inline(always)]
pub fn code(packed: &[u8], bits: u32, e: usize) -> u8 {
    let bit = e * bits as usize;
    let mask = ((1u16 << bits) - 1) as u8;
    (packed[bit / 8] >> (bit % 8)) & mask
}

/// Rows of codes quantized in blocks along the row: a matrix of `rows × cols` codes stored
/// row by row, each row packed into `cols * bits / 8` bytes, with one scale (and zero point)
/// per block of `block_size` consecutive codes of a row (the last block of a row may be
/// short).
#[derive(Debug, Clone, Copy)]
pub struct QuantRows<'a, S> {
    /// `rows × cols * bits / 8` bytes.
    pub data: &'a [u8],
    /// `rows × ceil(cols / block_size)` scales.
    pub scales: &'a [S],
    /// Packed zero points, `ceil(ceil(cols / block_size) * bits / 8)` bytes per row; `None`
    /// for the default [`default_zero_point`].
    pub zero_points: Option<&'a [u8]>,
    pub rows: usize,
    pub cols: usize,
    pub bits: u32,
    pub block_size: usize,
}

impl<S> QuantRows<'_, S> {
    /// Validates the lengths; returns `(bytes per data row, blocks per row, zero-point bytes
    /// per row)`.
    fn layout(&self) -> Result<(usize, usize, usize), KernelError> {
        check_bits(self.bits)?;
        if self.block_size == 0 {
            return Err(KernelError::Shape("block_size must be positive".into()));
        }
        let row_bits = self
            .cols
            .checked_mul(self.bits as usize)
            .ok_or_else(|| KernelError::Shape(format!("row of {} codes overflows", self.cols)))?;
        if !row_bits.is_multiple_of(8) {
            return Err(KernelError::Shape(format!(
                "a row of {} {}-bit codes does not fill whole bytes",
                self.cols, self.bits
            )));
        }
        let row_bytes = row_bits / 8;
        let blocks = self.cols.div_ceil(self.block_size);
        let zp_bytes = packed_bytes(blocks, self.bits)?;
        check_len("data", self.data.len(), numel(&[self.rows, row_bytes])?)?;
        check_len("scales", self.scales.len(), numel(&[self.rows, blocks])?)?;
        if let Some(zp) = self.zero_points {
            check_len("zero points", zp.len(), numel(&[self.rows, zp_bytes])?)?;
        }
        Ok((row_bytes, blocks, zp_bytes))
    }
}

/// Index `i` into an axis of `dim` (negative counts from the end), or `None` out of range.
fn resolve(i: i64, dim: usize) -> Option<usize> {
    let r = if i < 0 { i.checked_add(dim as i64)? } else { i };
    usize::try_from(r).ok().filter(|&r| r < dim)
}

/// `GatherBlockQuantized` with `gather_axis` 0 and the last axis quantized: the quantized
/// rows are grouped `group` at a time (the trailing axes of the data other than the last),
/// and output slice `t` is the dequantized group `indices[t]` (`group × cols` values).
/// Negative indices count from the end; an index outside `-groups..groups` is an error.
pub fn gather_block_quantized<T, I>(
    src: &QuantRows<'_, T>,
    group: usize,
    indices: &[I],
    out: &mut [T],
    pool: &ThreadPool,
) -> Result<(), KernelError>
where
    T: Accum<Acc = f32>,
    I: Copy + Into<i64> + Sync,
{
    let (row_bytes, blocks, zp_bytes) = src.layout()?;
    if group == 0 || !src.rows.is_multiple_of(group) {
        return Err(KernelError::Shape(format!(
            "{} quantized rows do not split into groups of {group}",
            src.rows
        )));
    }
    let groups = src.rows / group;
    let slice = numel(&[group, src.cols])?;
    check_len("output", out.len(), numel(&[indices.len(), slice])?)?;
    // Validate every index before writing, so a bad one leaves no partial output behind.
    if let Some(&bad) = indices
        .iter()
        .find(|&&i| resolve(i.into(), groups).is_none())
    {
        return Err(KernelError::Index {
            index: bad.into(),
            axis: 0,
            dim: groups,
        });
    }
    if slice == 0 {
        return Ok(());
    }
    let parts = parts_for(pool, indices.len(), slice);
    let per_part = indices.len().div_ceil(parts).max(1);
    let bits = src.bits;
    let zp_default = default_zero_point(bits) as i32;
    par_chunks(pool, out, slice * per_part, |first, part| {
        for (s, out_slice) in part.chunks_mut(slice).enumerate() {
            let g = resolve(indices[first / slice + s].into(), groups)
                .expect("every index was validated before the parallel part");
            for (r, out_row) in out_slice.chunks_mut(src.cols).enumerate() {
                let row = g * group + r;
                let data = &src.data[row * row_bytes..][..row_bytes];
                let scales = &src.scales[row * blocks..][..blocks];
                let zps = src.zero_points.map(|z| &z[row * zp_bytes..][..zp_bytes]);
                for (b, out_block) in out_row.chunks_mut(src.block_size).enumerate() {
                    let scale = scales[b].widen();
                    let zp = zps.map_or(zp_default, |z| code(z, bits, b) as i32);
                    let e0 = b * src.block_size;
                    for (e, o) in out_block.iter_mut().enumerate() {
                        let q = code(data, bits, e0 + e) as i32;
                        *o = T::narrow((q - zp) as f32 * scale);
                    }
                }
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;

    #[test]
    fn codes_unpack_low_bits_first() {
        let packed = [0x21u8, 0x43, 0xE4];
        assert_eq!(
            (0..4).map(|e| code(&packed, 4, e)).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
        // 0xE4 = 0b11_10_01_00: 2-bit codes 0, 1, 2, 3 from the low bits up.
        assert_eq!(
            (8..12).map(|e| code(&packed, 2, e)).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        assert_eq!(code(&packed, 8, 2), 0xE4);
        assert_eq!(packed_bytes(3, 4).unwrap(), 2);
        assert_eq!(default_zero_point(4), 8);
        assert_eq!(default_zero_point(8), 128);
    }

    /// Two groups of one row of 20 4-bit codes (blocks of 16 and 4), the second with packed
    /// zero points; values are small integers times powers of two, so the result is exact.
    #[test]
    fn gather_dequantizes_selected_rows() {
        let codes: Vec<u8> = (0..40).map(|i| (i % 16) as u8).collect();
        let data: Vec<u8> = codes.chunks(2).map(|p| p[0] | (p[1] << 4)).collect();
        let scales = [0.5f32, 2.0, 1.0, 0.25];
        // Row 0: zero points 8 and 0; row 1: 3 and 15.
        let zps = [0x08u8, 0xF3];
        let src = QuantRows {
            data: &data,
            scales: &scales,
            zero_points: Some(&zps),
            rows: 2,
            cols: 20,
            bits: 4,
            block_size: 16,
        };
        let mut out = vec![0f32; 40];
        let pool = ThreadPool::new(2);
        gather_block_quantized(&src, 1, &[-1i64, 0], &mut out, &pool).unwrap();
        let want = |row: usize, e: usize| {
            let (scale, zp) = [(0.5, 8.0), (2.0, 0.0), (1.0, 3.0), (0.25, 15.0)][row * 2 + e / 16];
            (codes[row * 20 + e] as f32 - zp) * scale
        };
        for e in 0..20 {
            assert_eq!(out[e], want(1, e), "element {e} of row 1");
            assert_eq!(out[20 + e], want(0, e), "element {e} of row 0");
        }
    }

    #[test]
    fn gather_of_8_bit_rows_to_f16_uses_the_default_zero_point() {
        let data: Vec<u8> = (0..32).map(|i| 120 + i as u8).collect();
        let scales = [f16::from_f32(0.5), f16::from_f32(0.25)];
        let src = QuantRows {
            data: &data,
            scales: &scales,
            zero_points: None,
            rows: 2,
            cols: 16,
            bits: 8,
            block_size: 16,
        };
        let mut out = vec![f16::ZERO; 16];
        gather_block_quantized(&src, 1, &[1i32], &mut out, &ThreadPool::new(1)).unwrap();
        let got: Vec<f32> = out.iter().map(|v| v.to_f32()).collect();
        let want: Vec<f32> = (16..32).map(|i| (i as f32 - 8.0) * 0.25).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn out_of_range_indices_and_bad_lengths_are_errors() {
        let data = [0u8; 16];
        let scales = [1f32; 2];
        let mut src = QuantRows {
            data: &data,
            scales: &scales,
            zero_points: None,
            rows: 2,
            cols: 16,
            bits: 4,
            block_size: 16,
        };
        let pool = ThreadPool::new(1);
        let mut out = vec![7f32; 16];
        let err = gather_block_quantized(&src, 1, &[2i64], &mut out, &pool).unwrap_err();
        assert!(matches!(err, KernelError::Index { index: 2, .. }), "{err}");
        assert!(gather_block_quantized(&src, 1, &[-3i64], &mut out, &pool).is_err());
        assert!(out.iter().all(|&v| v == 7.0), "nothing written on error");
        src.cols = 18;
        assert!(gather_block_quantized(&src, 1, &[0i64], &mut out, &pool).is_err());
        src.cols = 16;
        src.bits = 3;
        assert!(gather_block_quantized(&src, 1, &[0i64], &mut out, &pool).is_err());
    }
}
