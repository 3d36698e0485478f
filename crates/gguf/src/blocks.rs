//! ggml block formats and their dequantization to f32.
//!
//! Each quantized block is a `#[repr(C)]` struct with the exact size and field order of its
//! ggml definition in `ggml/src/ggml-common.h` (`block_q4_0`, `block_q4_1`, `block_q8_0`, and
//! the K-quants' super-blocks of 256 `block_q4_K`, `block_q5_K`, `block_q6_K`);
//! dequantization follows `dequantize_row_*` in `ggml/src/ggml-quants.c` and gguf-py's
//! `gguf/quants.py`, operation for operation, so results are bit-identical to both (tests
//! compare with gguf-py 0.19.0). All multi-byte fields are little-endian.
//!
//! The plain element types (F32, F16, BF16) are blocks of one element; they implement
//! [`Block`] directly on `f32`, [`half::f16`] and [`half::bf16`] rather than through a
//! one-field wrapper, which would add nothing.
//!
//! Blocks in a file need not be aligned for their struct (alignment 2 for the f16 fields), so
//! [`dequantize_blocks`] reads each block with an unaligned copy.

use std::mem::size_of;

use half::{bf16, f16};

use crate::GgmlType;

/// A ggml block: `ELEMS` consecutive elements of a row in `size_of::<Self>()` bytes.
pub trait Block: bytemuck::Pod {
    /// The tensor type whose data is an array of these blocks.
    const GGML_TYPE: GgmlType;
    /// Elements per block.
    const ELEMS: usize;
    /// Writes the block's `ELEMS` values to `out[..ELEMS]`.
    fn dequantize(&self, out: &mut [f32]);
}

/// Elements per block of the 4- and 8-bit formats (`QK4_0`, `QK4_1`, `QK8_0` in ggml).
pub const QK: usize = 32;

/// ggml `block_q4_0`: 32 weights as 4-bit codes sharing one f16 scale (18 bytes).
///
/// ```text
/// bytes 0..2   d   f16 scale
/// bytes 2..18  qs  16 bytes: byte j = element j (low nibble) | element j + 16 (high nibble)
/// value[i] = (q[i] - 8) * d          q[i] in 0..=15
/// ```
///
/// Note the nibble order: the low nibbles hold the first half of the block and the high
/// nibbles the second half — not elements 2j and 2j + 1 as ONNX packs int4
/// (see [`crate::repack`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_0>() == 18);

/// ggml `block_q4_1`: 32 weights as 4-bit codes with an f16 scale and an f16 minimum
/// (20 bytes).
///
/// ```text
/// bytes 0..2   d   f16 scale
/// bytes 2..4   m   f16 minimum (the value of code 0)
/// bytes 4..20  qs  16 bytes: byte j = element j (low nibble) | element j + 16 (high nibble)
/// value[i] = q[i] * d + m            q[i] in 0..=15
/// ```
///
/// In f32, `q * d` is exact (an 11-bit significand times a 4-bit integer), so the add is the
/// only rounding and a fused multiply-add gives the same bits.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_1>() == 20);

/// ggml `block_q8_0`: 32 weights as signed 8-bit codes sharing one f16 scale (34 bytes).
///
/// ```text
/// bytes 0..2   d   f16 scale
/// bytes 2..34  qs  32 × i8, element i in byte i
/// value[i] = q[i] * d                q[i] in -128..=127
/// ```
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8_0>() == 34);

/// ggml `block_mxfp4` (OCP MXFP4): 32 weights as e2m1 codes sharing one e8m0 exponent
/// (17 bytes).
///
/// ```text
/// byte 0       e   scale exponent: 2^(e - 127)
/// bytes 1..17  qs  16 bytes: byte j = element j (low nibble) | element j + 16 (high nibble)
/// value[i] = E2M1[q[i]] * 2^(e - 127)     E2M1 = ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}, bit 3 the sign
/// ```
///
/// Dequantized as ggml does it (`dequantize_row_mxfp4`): `kvalues_mxfp4[q] * 2^(e - 128)`
/// with the doubled values `±{0, 1, 2, 3, 4, 6, 8, 12}` — the same numbers, exactly, except
/// that ggml's exponent 255 is `2^127` (the MX spec's NaN; `oxgen_kernels::mxfp4` follows the
/// spec). The nibble order is Q4_0's.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockMxfp4 {
    pub e: u8,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockMxfp4>() == 17);

impl BlockMxfp4 {
    /// Element `i`'s 4-bit code.
    pub fn code(&self, i: usize) -> u8 {
        nibble(&self.qs, i)
    }

    /// ggml's half scale `2^(e - 128)` (`GGML_E8M0_TO_FP32_HALF`, from the bits).
    pub fn half_scale(&self) -> f32 {
        let e = u32::from(self.e);
        f32::from_bits(if e < 2 {
            0x0020_0000 << e
        } else {
            (e - 1) << 23
        })
    }
}

/// ggml's `kvalues_mxfp4`: twice the e2m1 values.
const MXFP4_KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

impl Block for BlockMxfp4 {
    const GGML_TYPE: GgmlType = GgmlType::MXFP4;
    const ELEMS: usize = QK;
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.half_scale();
        for (i, o) in out[..QK].iter_mut().enumerate() {
            *o = f32::from(MXFP4_KVALUES[self.code(i) as usize]) * d;
        }
    }
}

/// Elements per K-quant super-block (`QK_K` in ggml).
pub const QK_K: usize = 256;

/// ggml `block_q4_K`: 256 weights in 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit
/// minimum under the super-block's f16 `d` and `dmin` (144 bytes).
///
/// ```text
/// bytes 0..2     d       f16 scale of the sub-block scales
/// bytes 2..4     dmin    f16 scale of the sub-block minimums
/// bytes 4..16    scales  sub-block j < 4: scale = b[j] & 63, min = b[j + 4] & 63;
///                        j >= 4: scale = b[j + 4] & 15 | (b[j - 4] >> 6) << 4,
///                                min   = b[j + 4] >> 4 | (b[j] >> 6) << 4
/// bytes 16..144  qs      4 groups of 32 bytes: group g holds sub-block 2g in its low
///                        nibbles and 2g + 1 in its high nibbles, element i in byte i
/// value = (d·scale)·q - dmin·min     q in 0..=15
/// ```
///
/// `d·scale` and `dmin·min` are exact in f32 (11- by 6-bit significands), and so is their
/// product with a 4-bit `q`: the subtraction is the only rounding.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ4K>() == 144);

/// ggml `block_q5_K`: as [`BlockQ4K`] with a fifth bit per weight (176 bytes).
///
/// ```text
/// bytes 0..16    d, dmin, scales as Q4_K
/// bytes 16..48   qh      bit j of byte i: the high bit of element i of sub-block j
/// bytes 48..176  qs      low 4 bits, laid out as Q4_K's
/// value = (d·scale)·q - dmin·min     q in 0..=31
/// ```
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ5K>() == 176);

/// ggml `block_q6_K`: 256 weights as 6-bit codes in 16 sub-blocks of 16, each with a signed
/// 8-bit scale under the f16 `d` (210 bytes).
///
/// ```text
/// bytes 0..128    ql      low 4 bits: element t (half h = t / 128, r = t % 128) is in byte
///                         64h + r % 64, low nibble for r < 64, high nibble otherwise
/// bytes 128..192  qh      high 2 bits: element t in byte 32h + t % 32, bits 2·(r / 32)
/// bytes 192..208  scales  i8, one per 16 elements
/// bytes 208..210  d       f16
/// value = (d·scale)·(q - 32)         q in 0..=63
/// ```
///
/// Every product is exact in f32 (11 + 7 + 6 significant bits), so values are exact.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}
const _: () = assert!(size_of::<BlockQ6K>() == 210);

// SAFETY (the K-quants): `#[repr(C)]` structs of Pod fields whose sizes sum to the struct's
// (asserted above; every field is at an offset aligned for it), so there is no padding.
unsafe impl bytemuck::Zeroable for BlockQ4K {}
unsafe impl bytemuck::Pod for BlockQ4K {}
unsafe impl bytemuck::Zeroable for BlockQ5K {}
unsafe impl bytemuck::Pod for BlockQ5K {}
unsafe impl bytemuck::Zeroable for BlockQ6K {}
unsafe impl bytemuck::Pod for BlockQ6K {}

/// Sub-block `j`'s 6-bit scale and minimum (ggml `get_scale_min_k4`).
fn scale_min_k4(scales: &[u8; 12], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// The K-quants' affine sub-blocks of 32: scale and minimum, and each element's code.
pub trait AffineSubBlocks {
    /// Sub-block `j` (0..8): `(d·scale, dmin·min)`, so that value = scale·q - min.
    fn sub_block(&self, j: usize) -> (f32, f32);
    /// Code `i` (0..32) of sub-block `j`.
    fn code(&self, j: usize, i: usize) -> u8;
}

fn sub_block(d: f16, dmin: f16, scales: &[u8; 12], j: usize) -> (f32, f32) {
    let (sc, m) = scale_min_k4(scales, j);
    (d.to_f32() * f32::from(sc), dmin.to_f32() * f32::from(m))
}

impl AffineSubBlocks for BlockQ4K {
    fn sub_block(&self, j: usize) -> (f32, f32) {
        sub_block(self.d, self.dmin, &self.scales, j)
    }

    #[inline]
    fn code(&self, j: usize, i: usize) -> u8 {
        (self.qs[j / 2 * 32 + i] >> (4 * (j % 2))) & 0x0F
    }
}

impl AffineSubBlocks for BlockQ5K {
    fn sub_block(&self, j: usize) -> (f32, f32) {
        sub_block(self.d, self.dmin, &self.scales, j)
    }

    #[inline]
    fn code(&self, j: usize, i: usize) -> u8 {
        let low = (self.qs[j / 2 * 32 + i] >> (4 * (j % 2))) & 0x0F;
        low | ((self.qh[i] >> j) & 1) << 4
    }
}

/// `(d·scale)·q - dmin·min` over the 8 sub-blocks, as ggml evaluates it.
fn dequantize_affine<B: AffineSubBlocks>(b: &B, out: &mut [f32]) {
    for (j, sub) in out[..QK_K].chunks_exact_mut(QK).enumerate() {
        let (scale, min) = b.sub_block(j);
        for (i, o) in sub.iter_mut().enumerate() {
            *o = scale * f32::from(b.code(j, i)) - min;
        }
    }
}

impl BlockQ6K {
    /// Code `t` (0..256) minus 32, in -32..=31.
    #[inline]
    pub fn code(&self, t: usize) -> i8 {
        let (h, r) = (t / 128, t % 128);
        let low = (self.ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
        let high = (self.qh[32 * h + t % 32] >> (2 * (r / 32))) & 3;
        (low | high << 4) as i8 - 32
    }

    /// The scale of element `t`: `d·scales[t / 16]`.
    #[inline]
    pub fn scale(&self, t: usize) -> f32 {
        self.d.to_f32() * f32::from(self.scales[t / 16])
    }
}

// SAFETY (all four): `#[repr(C)]` structs of Pod fields (`f16` is Pod through half's
// `bytemuck` feature; arrays of u8/i8) whose size equals the sum of their field sizes (the
// asserts above), so there is no padding and every bit pattern is a valid value.
unsafe impl bytemuck::Zeroable for BlockQ4_0 {}
unsafe impl bytemuck::Pod for BlockQ4_0 {}
unsafe impl bytemuck::Zeroable for BlockQ4_1 {}
unsafe impl bytemuck::Pod for BlockQ4_1 {}
unsafe impl bytemuck::Zeroable for BlockQ8_0 {}
unsafe impl bytemuck::Pod for BlockQ8_0 {}
unsafe impl bytemuck::Zeroable for BlockMxfp4 {}
unsafe impl bytemuck::Pod for BlockMxfp4 {}

impl BlockQ4_0 {
    /// Code `i` (0..32) of the block, in 0..=15.
    #[inline]
    pub fn code(&self, i: usize) -> u8 {
        nibble(&self.qs, i)
    }
}

impl BlockQ4_1 {
    /// Code `i` (0..32) of the block, in 0..=15.
    #[inline]
    pub fn code(&self, i: usize) -> u8 {
        nibble(&self.qs, i)
    }
}

/// ggml's 4-bit order: element `i < 16` is the low nibble of byte `i`, element `i >= 16` the
/// high nibble of byte `i - 16`.
#[inline]
fn nibble(qs: &[u8; QK / 2], i: usize) -> u8 {
    if i < QK / 2 {
        qs[i] & 0x0F
    } else {
        qs[i - QK / 2] >> 4
    }
}

impl Block for BlockQ4_0 {
    const GGML_TYPE: GgmlType = GgmlType::Q4_0;
    const ELEMS: usize = QK;
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let (lo, hi) = out[..QK].split_at_mut(QK / 2);
        for ((&q, l), h) in self.qs.iter().zip(lo).zip(hi) {
            *l = ((q & 0x0F) as i32 - 8) as f32 * d;
            *h = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

impl Block for BlockQ4_1 {
    const GGML_TYPE: GgmlType = GgmlType::Q4_1;
    const ELEMS: usize = QK;
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let m = self.m.to_f32();
        let (lo, hi) = out[..QK].split_at_mut(QK / 2);
        for ((&q, l), h) in self.qs.iter().zip(lo).zip(hi) {
            *l = (q & 0x0F) as f32 * d + m;
            *h = (q >> 4) as f32 * d + m;
        }
    }
}

impl Block for BlockQ8_0 {
    const GGML_TYPE: GgmlType = GgmlType::Q8_0;
    const ELEMS: usize = QK;
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, &q) in out[..QK].iter_mut().zip(&self.qs) {
            *o = q as f32 * d;
        }
    }
}

impl Block for BlockQ4K {
    const GGML_TYPE: GgmlType = GgmlType::Q4_K;
    const ELEMS: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        dequantize_affine(self, out);
    }
}

impl Block for BlockQ5K {
    const GGML_TYPE: GgmlType = GgmlType::Q5_K;
    const ELEMS: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        dequantize_affine(self, out);
    }
}

impl Block for BlockQ6K {
    const GGML_TYPE: GgmlType = GgmlType::Q6_K;
    const ELEMS: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        for (t, o) in out[..QK_K].iter_mut().enumerate() {
            *o = self.scale(t) * f32::from(self.code(t));
        }
    }
}

impl Block for f32 {
    const GGML_TYPE: GgmlType = GgmlType::F32;
    const ELEMS: usize = 1;
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = *self;
    }
}

impl Block for f16 {
    const GGML_TYPE: GgmlType = GgmlType::F16;
    const ELEMS: usize = 1;
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = self.to_f32();
    }
}

/// BF16 widens exactly (the 16 bits become the high half of the f32), NaN payloads kept.
impl Block for bf16 {
    const GGML_TYPE: GgmlType = GgmlType::BF16;
    const ELEMS: usize = 1;
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = f32::from_bits(u32::from(self.to_bits()) << 16);
    }
}

/// Reads block `i` of `data` (any alignment).
///
/// # Panics
/// If `data` holds fewer than `i + 1` blocks.
#[inline]
pub fn read_block<B: Block>(data: &[u8], i: usize) -> B {
    let size = size_of::<B>();
    bytemuck::pod_read_unaligned(&data[i * size..(i + 1) * size])
}

/// Dequantizes `data`, an array of `B` blocks, into `out`.
///
/// # Panics
/// If `data.len()` is not `out.len() / B::ELEMS` blocks (callers size both from a validated
/// tensor info).
pub fn dequantize_blocks<B: Block>(data: &[u8], out: &mut [f32]) {
    let size = size_of::<B>();
    assert!(
        out.len().is_multiple_of(B::ELEMS) && data.len() == out.len() / B::ELEMS * size,
        "{} bytes of {} data cannot fill {} values",
        data.len(),
        B::GGML_TYPE,
        out.len()
    );
    for (bytes, o) in data.chunks_exact(size).zip(out.chunks_exact_mut(B::ELEMS)) {
        bytemuck::pod_read_unaligned::<B>(bytes).dequantize(o);
    }
}

/// Dequantizes `data` of type `ty` into `out`; `false` (and `out` untouched) when `ty` is not
/// one of the formats of this module.
///
/// # Panics
/// Like [`dequantize_blocks`], on a length mismatch.
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> bool {
    match ty {
        GgmlType::F32 => dequantize_blocks::<f32>(data, out),
        GgmlType::F16 => dequantize_blocks::<f16>(data, out),
        GgmlType::BF16 => dequantize_blocks::<bf16>(data, out),
        GgmlType::Q8_0 => dequantize_blocks::<BlockQ8_0>(data, out),
        GgmlType::Q4_0 => dequantize_blocks::<BlockQ4_0>(data, out),
        GgmlType::Q4_1 => dequantize_blocks::<BlockQ4_1>(data, out),
        GgmlType::Q4_K => dequantize_blocks::<BlockQ4K>(data, out),
        GgmlType::Q5_K => dequantize_blocks::<BlockQ5K>(data, out),
        GgmlType::Q6_K => dequantize_blocks::<BlockQ6K>(data, out),
        GgmlType::MXFP4 => dequantize_blocks::<BlockMxfp4>(data, out),
        _ => return false,
    }
    true
}

/// The types [`dequantize`] handles.
pub const DEQUANTIZABLE: [GgmlType; 10] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::MXFP4,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_sizes_match_the_type_table() {
        assert_eq!(size_of::<BlockQ4_0>() as u32, GgmlType::Q4_0.block_bytes());
        assert_eq!(size_of::<BlockQ4_1>() as u32, GgmlType::Q4_1.block_bytes());
        assert_eq!(size_of::<BlockQ8_0>() as u32, GgmlType::Q8_0.block_bytes());
        assert_eq!(size_of::<BlockQ4K>() as u32, GgmlType::Q4_K.block_bytes());
        assert_eq!(size_of::<BlockQ5K>() as u32, GgmlType::Q5_K.block_bytes());
        assert_eq!(size_of::<BlockQ6K>() as u32, GgmlType::Q6_K.block_bytes());
    }

    #[test]
    fn hand_made_q4_0_block_puts_low_nibbles_first() {
        // d = 1.0; byte 0 = 0x9A: element 0 = 0xA - 8 = 2, element 16 = 0x9 - 8 = 1.
        let mut bytes = vec![0x00, 0x3C];
        bytes.extend([0x9A; 1].iter().chain([0x88; 15].iter()));
        let mut out = [f32::NAN; 32];
        dequantize_blocks::<BlockQ4_0>(&bytes, &mut out);
        assert_eq!(out[0], 2.0);
        assert_eq!(out[16], 1.0);
        assert!(
            out.iter()
                .enumerate()
                .all(|(i, &v)| i == 0 || i == 16 || v == 0.0)
        );
    }
}
