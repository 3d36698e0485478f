//! Round-to-nearest block quantization for `MatMulNBits` and `GatherBlockQuantized`, as
//! onnxruntime's quantizer does it (`MlasQuantizeBlockwise`, symmetric, which
//! onnxruntime-genai's model builder runs for `-p int4`): per block of `block` inputs of an
//! output row, the value of largest magnitude `m` (the smaller one on a tie of magnitudes)
//! gives the scale `-m / 2^(bits-1)`, and each value becomes
//! `clamp(round(v · (1 / scale)) + 2^(bits-1), 0, 2^bits - 1)`, rounding half away from zero.
//! The same float operations in the same order give the same bytes as the builder's package
//! (the family tests compare them).

/// A quantized `[n, k]` matrix: codes `[n, blocks, block · bits / 8]` (two 4-bit codes a
/// byte, the even input in the low nibble) and f32 scales `[n, blocks]`.
pub struct Quantized {
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    pub blocks: usize,
}

/// Quantizes `w`, `n` rows of `k` values, to `bits` (4 or 8) in blocks of `block` inputs
/// (a multiple of 2); a last partial block is padded with zeros.
pub fn symmetric(w: &[f32], n: usize, k: usize, bits: u32, block: usize) -> Quantized {
    debug_assert_eq!(w.len(), n * k);
    debug_assert!(matches!(bits, 4 | 8) && block.is_multiple_of(2));
    let blocks = k.div_ceil(block);
    let block_bytes = block * bits as usize / 8;
    let mid = (1u32 << (bits - 1)) as f32;
    let max_code = ((1u32 << bits) - 1) as f32;
    let mut codes = vec![0u8; n * blocks * block_bytes];
    let mut scales = vec![0f32; n * blocks];
    let mut q = vec![0u8; block];
    for (r, row) in w.chunks_exact(k.max(1)).enumerate().take(n) {
        for (b, values) in row.chunks(block).enumerate() {
            let (mut min, mut max) = (f32::MAX, -f32::MAX);
            for &v in values {
                if v < min {
                    min = v;
                }
                if v > max {
                    max = v;
                }
            }
            let m = if max.abs() > min.abs() { max } else { min };
            let scale = -m / mid;
            let reciprocal = if scale != 0.0 { 1.0 / scale } else { 0.0 };
            q.fill(mid as u8);
            for (code, &v) in q.iter_mut().zip(values) {
                *code = (v * reciprocal + mid).round().clamp(0.0, max_code) as u8;
            }
            scales[r * blocks + b] = scale;
            let out = &mut codes[(r * blocks + b) * block_bytes..][..block_bytes];
            match bits {
                4 => {
                    for (byte, pair) in out.iter_mut().zip(q.chunks_exact(2)) {
                        *byte = (pair[0] & 0x0F) | (pair[1] << 4);
                    }
                }
                _ => out.copy_from_slice(&q),
            }
        }
    }
    Quantized {
        codes,
        scales,
        blocks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_magnitude_maps_to_the_lowest_code_and_zero_to_the_middle() {
        // One block of 4: -2 has the largest magnitude, so scale = 2 / 8 = 0.25.
        let q = symmetric(&[-2.0, 0.0, 0.3, 1.0], 1, 4, 4, 4);
        assert_eq!(q.scales, [0.25]);
        // codes: -2 -> 0, 0 -> 8, 0.3 / 0.25 = 1.2 -> 9, 1 -> 12.
        assert_eq!(q.codes, [0x80, 0xC9]);
        // A tie of magnitudes takes the negative end; the positive one clamps to 15.
        let q = symmetric(&[1.0, -1.0], 1, 2, 4, 2);
        assert_eq!((q.scales[0], q.codes[0]), (0.125, 0x0F));
        // 8 bits: scale -m / 128; halves round away from zero.
        let q = symmetric(&[0.0, 64.0, -128.0, 1.5], 1, 4, 8, 4);
        assert_eq!(q.scales, [1.0]);
        assert_eq!(q.codes, [128, 192, 0, 130]);
    }

    #[test]
    fn a_partial_last_block_is_padded_with_zero_codes() {
        let q = symmetric(&[1.0, 2.0, 4.0], 1, 3, 4, 2);
        assert_eq!(q.blocks, 2);
        assert_eq!(q.scales, [-0.25, -0.5]);
        // 4 / -0.5 = -8 -> 0; the pad is the middle code 8.
        assert_eq!(q.codes[1], 0x80);
    }
}
