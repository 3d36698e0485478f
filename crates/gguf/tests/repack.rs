//! Property tests: a repacked weight, dequantized by the onnxruntime operator's own formula
//! (`(q - zero_point) * scale` in f32, codes unpacked low bits first — written out here from
//! `docs/ContribOperators.md` and `gather_block_quantized.cc`, independently of the crate),
//! equals ggml's dequantization of the original blocks: bit for bit for Q4_0 and Q8_0, within
//! the documented bounds for Q4_1 (see `oxgen_gguf::repack`), under the operator's formula and
//! under onnxruntime's CPU evaluation order.
//!
//! Blocks are random bytes with finite f16 scales drawn to include ±0, subnormals, negative
//! minimums and the f16 extremes.

use half::f16;
use oxgen_gguf::blocks::{self, AffineSubBlocks, BlockQ4K, QK, QK_K};
use oxgen_gguf::repack::{gather_block_quantized, matmul_nbits, q4_to_onnx_order};
use oxgen_gguf::{GgmlType, GgufError};
use oxgen_tensor::{DType, Tensor};
use proptest::prelude::*;

/// Finite f16 bit patterns, weighted towards the awkward ones.
fn f16_bits() -> impl Strategy<Value = u16> {
    prop_oneof![
        3 => any::<u16>().prop_map(|b| if b & 0x7C00 == 0x7C00 { b & 0xBFFF } else { b }),
        1 => prop::sample::select(vec![0x0000u16, 0x8000, 0x0001, 0x8001, 0x7BFF, 0xFBFF, 0x3C00]),
    ]
}

/// `n` random blocks of `ty` (`n_f16` leading f16 fields), as raw bytes.
fn blocks(ty: GgmlType, n_f16: usize, n: usize) -> impl Strategy<Value = Vec<u8>> {
    let size = ty.block_bytes() as usize;
    let block = (
        prop::collection::vec(f16_bits(), n_f16),
        prop::collection::vec(any::<u8>(), size - 2 * n_f16),
    )
        .prop_map(|(h, q)| {
            let mut b: Vec<u8> = h.iter().flat_map(|x| x.to_le_bytes()).collect();
            b.extend(q);
            b
        });
    prop::collection::vec(block, n).prop_map(|v| v.concat())
}

/// `(k_blocks, n, data)` for a `[K, N]` weight of `ty`.
fn weight(ty: GgmlType, n_f16: usize) -> impl Strategy<Value = (usize, usize, Vec<u8>)> {
    (1usize..6, 1usize..6)
        .prop_flat_map(move |(kb, n)| (Just(kb), Just(n), blocks(ty, n_f16, kb * n)))
}

fn ggml(ty: GgmlType, kb: usize, n: usize, data: &[u8]) -> Vec<f32> {
    let mut out = vec![f32::NAN; kb * QK * n];
    assert!(blocks::dequantize(ty, data, &mut out));
    out
}

fn f32s(t: &Tensor) -> &[f32] {
    t.as_slice::<f32>().unwrap()
}

/// Code `e` of a run packed low bits first.
fn code(packed: &[u8], bits: u32, e: usize) -> u8 {
    match bits {
        4 => (packed[e / 2] >> (4 * (e % 2))) & 0x0F,
        8 => packed[e],
        _ => unreachable!(),
    }
}

/// MatMulNBits' dequantized weight, `[N][K]` row-major.
fn matmul_nbits_reference(w: &oxgen_gguf::MatMulNBitsWeight) -> Vec<f32> {
    let (k, n, bits) = (w.k, w.n, w.bits);
    let kb = k / w.block_size;
    let blob = w.block_size * bits as usize / 8;
    assert_eq!(w.b.dtype(), DType::U8);
    assert_eq!(w.b.dims(), [n, kb, blob]);
    assert_eq!(w.scales.dims(), [n * kb]);
    let b = w.b.as_bytes();
    let scales = f32s(&w.scales);
    let mut out = Vec::with_capacity(n * k);
    for row in 0..n {
        for e in 0..k {
            let blk = e / w.block_size;
            let q = code(&b[(row * kb + blk) * blob..], bits, e % w.block_size);
            let zp = match &w.zero_points {
                None => (1u32 << (bits - 1)) as f32,
                Some(z) if z.dtype() == DType::F32 => f32s(z)[row * kb + blk],
                Some(z) => {
                    assert_eq!(z.dtype(), DType::U8);
                    let row_bytes = (kb * bits as usize).div_ceil(8);
                    assert_eq!(z.dims(), [n * row_bytes]);
                    code(&z.as_bytes()[row * row_bytes..], bits, blk) as f32
                }
            };
            out.push((q as f32 - zp) * scales[row * kb + blk]);
        }
    }
    out
}

/// The same weight as onnxruntime 1.32's CPU MatMulNBits evaluates it with float zero
/// points: `q·scale + (-zp·scale)` (measured; see `oxgen_gguf::repack`).
fn matmul_nbits_ort_order(w: &oxgen_gguf::MatMulNBitsWeight) -> Vec<f32> {
    let kb = w.k / w.block_size;
    let zps = f32s(w.zero_points.as_ref().unwrap());
    let scales = f32s(&w.scales);
    let b = w.b.as_bytes();
    let blob = w.block_size * w.bits as usize / 8;
    let mut out = Vec::with_capacity(w.n * w.k);
    for row in 0..w.n {
        for e in 0..w.k {
            let blk = row * kb + e / w.block_size;
            let q = code(&b[blk * blob..], w.bits, e % w.block_size);
            out.push(q as f32 * scales[blk] + -zps[blk] * scales[blk]);
        }
    }
    out
}

/// GatherBlockQuantized's dequantized table (default zero points), `[rows][K]`.
fn gather_reference(w: &oxgen_gguf::GatherBlockQuantizedWeight) -> Vec<f32> {
    let (rows, k, bits) = (w.rows, w.k, w.bits);
    assert_eq!(w.data.dims(), [rows, k * bits as usize / 8]);
    assert_eq!(w.scales.dims(), [rows, k / w.block_size]);
    let row_bytes = k * bits as usize / 8;
    let zp = (1u32 << (bits - 1)) as f32;
    let scales = f32s(&w.scales);
    let mut out = Vec::with_capacity(rows * k);
    for r in 0..rows {
        for e in 0..k {
            let q = code(&w.data.as_bytes()[r * row_bytes..], bits, e);
            out.push((q as f32 - zp) * scales[r * (k / w.block_size) + e / w.block_size]);
        }
    }
    out
}

fn assert_bitwise(got: &[f32], want: &[f32]) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        prop_assert!(
            g.to_bits() == w.to_bits(),
            "element {}: {:e} != ggml {:e}",
            i,
            g,
            w
        );
    }
    Ok(())
}

fn dims(kb: usize, n: usize) -> [u64; 2] {
    [(kb * QK) as u64, n as u64]
}

/// `(super-blocks along K, n, data)` for a `[K, N]` K-quant weight (`n_f16` leading f16s).
fn k_weight(ty: GgmlType, n_f16: usize) -> impl Strategy<Value = (usize, usize, Vec<u8>)> {
    (1usize..3, 1usize..4)
        .prop_flat_map(move |(kb, n)| (Just(kb), Just(n), blocks(ty, n_f16, kb * n)))
}

/// As [`k_weight`] for Q6_K, whose one f16 (`d`) ends the block.
fn q6_k_weight() -> impl Strategy<Value = (usize, usize, Vec<u8>)> {
    (1usize..3, 1usize..4).prop_flat_map(|(kb, n)| {
        let block = (prop::collection::vec(any::<u8>(), 208), f16_bits());
        let blocks = prop::collection::vec(block, kb * n).prop_map(|v| {
            v.into_iter()
                .flat_map(|(mut b, d)| {
                    b.extend(d.to_le_bytes());
                    b
                })
                .collect::<Vec<u8>>()
        });
        (Just(kb), Just(n), blocks)
    })
}

fn k_dims(kb: usize, n: usize) -> [u64; 2] {
    [(kb * QK_K) as u64, n as u64]
}

fn k_ggml(ty: GgmlType, kb: usize, n: usize, data: &[u8]) -> Vec<f32> {
    let mut out = vec![f32::NAN; kb * QK_K * n];
    assert!(blocks::dequantize(ty, data, &mut out));
    out
}

/// Q4_K: within Q4_1's bound, with each sub-block's `d·sc` and `dmin·m`.
fn affine_k_quant_is_within_the_bound<B: AffineSubBlocks + blocks::Block>(
    ty: GgmlType,
    bits: u32,
    kb: usize,
    n: usize,
    data: &[u8],
) -> Result<(), TestCaseError> {
    let w = matmul_nbits("w", ty, &k_dims(kb, n), data).unwrap();
    prop_assert_eq!((w.bits, w.block_size, w.k, w.n), (bits, 32, kb * QK_K, n));
    prop_assert_eq!(w.zero_points.as_ref().unwrap().dtype(), DType::F32);
    prop_assert!(w.requantized.is_none());
    let spec_order = matmul_nbits_reference(&w);
    let ort_order = matmul_nbits_ort_order(&w);
    let want = k_ggml(ty, kb, n, data);
    let u = f64::from(f32::EPSILON) / 2.0;
    for (i, &g) in want.iter().enumerate() {
        let b: B = blocks::read_block(data, i / QK_K);
        let (scale, min) = b.sub_block(i % QK_K / QK);
        let m = f64::from(min).abs();
        for (order, r, bound) in [
            (
                "(q - z)·s",
                spec_order[i],
                u * (m + 3.0 * f64::from(g).abs()),
            ),
            (
                "q·s + (-z·s)",
                ort_order[i],
                2.0 * u * (m + f64::from(g).abs()),
            ),
        ] {
            if scale == 0.0 {
                prop_assert!(
                    r.to_bits() == g.to_bits(),
                    "{} element {}: {:e} != ggml {:e}",
                    order,
                    i,
                    r,
                    g
                );
                continue;
            }
            let bound = bound * (1.0 + 8.0 * u);
            let err = (f64::from(r) - f64::from(g)).abs();
            prop_assert!(
                err <= bound,
                "{} element {}: {:e} vs ggml {:e}: error {:e} > bound {:e}",
                order,
                i,
                r,
                g,
                err,
                bound
            );
        }
    }
    Ok(())
}

/// Q5_K and Q6_K are requantized to int8 blocks of 32 with uint8 zero points: each weight
/// moves by at most half a step of its new scale, and the reported cost is the largest move
/// and weight.
fn requantized_moves_each_weight_at_most_half_a_step(
    ty: GgmlType,
    kb: usize,
    n: usize,
    data: &[u8],
) -> Result<(), TestCaseError> {
    let w = matmul_nbits("w", ty, &k_dims(kb, n), data).unwrap();
    prop_assert_eq!((w.bits, w.block_size), (8, 32));
    prop_assert_eq!(w.zero_points.as_ref().unwrap().dtype(), DType::U8);
    let got = matmul_nbits_reference(&w);
    let want = k_ggml(ty, kb, n, data);
    let scales = f32s(&w.scales);
    let (mut worst, mut largest) = (0f32, 0f32);
    for (i, (&r, &g)) in got.iter().zip(&want).enumerate() {
        let s = scales[i / QK];
        let err = (r - g).abs();
        prop_assert!(
            err <= s * (0.5 + 1e-4),
            "element {}: {:e} vs ggml {:e} (scale {:e})",
            i,
            r,
            g,
            s
        );
        worst = worst.max(err);
        largest = largest.max(g.abs());
    }
    let cost = w.requantized.unwrap();
    prop_assert!(
        cost.max_abs_error >= worst * (1.0 - 1e-5) && cost.max_abs == largest,
        "{:?} vs {} {}",
        cost,
        worst,
        largest
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn q4_k_matmul_nbits_is_within_the_bound((kb, n, data) in k_weight(GgmlType::Q4_K, 2)) {
        affine_k_quant_is_within_the_bound::<BlockQ4K>(GgmlType::Q4_K, 4, kb, n, &data)?;
    }

    #[test]
    fn q5_k_requantized_moves_each_weight_at_most_half_a_step((kb, n, data) in k_weight(GgmlType::Q5_K, 2)) {
        requantized_moves_each_weight_at_most_half_a_step(GgmlType::Q5_K, kb, n, &data)?;
    }

    #[test]
    fn q6_k_requantized_moves_each_weight_at_most_half_a_step((kb, n, data) in q6_k_weight()) {
        requantized_moves_each_weight_at_most_half_a_step(GgmlType::Q6_K, kb, n, &data)?;
    }

    /// K-quant embedding tables become symmetric int8 `GatherBlockQuantized` tables: each value
    /// within half a step of its block's new scale, the reported cost the largest move.
    #[test]
    fn k_quant_tables_requantized_for_gather_block_quantized(
        (kb, n, data) in k_weight(GgmlType::Q4_K, 2),
        (kb6, n6, data6) in q6_k_weight(),
    ) {
        for (ty, kb, n, data) in [(GgmlType::Q4_K, kb, n, &data), (GgmlType::Q6_K, kb6, n6, &data6)] {
            let w = gather_block_quantized("t", ty, &k_dims(kb, n), data).unwrap();
            prop_assert_eq!((w.bits, w.block_size, w.rows, w.k), (8, 32, n, kb * QK_K));
            let got = gather_reference(&w);
            let want = k_ggml(ty, kb, n, data);
            let scales = f32s(&w.scales);
            let mut worst = 0f32;
            for (i, (&r, &g)) in got.iter().zip(&want).enumerate() {
                let s = scales[i / QK];
                prop_assert!((r - g).abs() <= s * (0.5 + 1e-4), "{} element {}: {:e} vs {:e}", ty, i, r, g);
                worst = worst.max((r - g).abs());
            }
            prop_assert!(w.requantized.unwrap().max_abs_error >= worst * (1.0 - 1e-5));
        }
    }

    #[test]
    fn q4_0_matmul_nbits_is_exact((kb, n, data) in weight(GgmlType::Q4_0, 1)) {
        let w = matmul_nbits("w", GgmlType::Q4_0, &dims(kb, n), &data).unwrap();
        prop_assert_eq!((w.bits, w.block_size, w.k, w.n), (4, 32, kb * QK, n));
        prop_assert!(w.zero_points.is_none());
        assert_bitwise(&matmul_nbits_reference(&w), &ggml(GgmlType::Q4_0, kb, n, &data))?;
    }

    #[test]
    fn q8_0_matmul_nbits_is_exact((kb, n, data) in weight(GgmlType::Q8_0, 1)) {
        let w = matmul_nbits("w", GgmlType::Q8_0, &dims(kb, n), &data).unwrap();
        prop_assert_eq!((w.bits, w.block_size), (8, 32));
        prop_assert!(w.zero_points.as_ref().unwrap().as_bytes().iter().all(|&z| z == 128));
        assert_bitwise(&matmul_nbits_reference(&w), &ggml(GgmlType::Q8_0, kb, n, &data))?;
    }

    #[test]
    fn q4_1_matmul_nbits_is_within_the_bound((kb, n, data) in weight(GgmlType::Q4_1, 2)) {
        let w = matmul_nbits("w", GgmlType::Q4_1, &dims(kb, n), &data).unwrap();
        prop_assert_eq!(w.zero_points.as_ref().unwrap().dtype(), DType::F32);
        let spec_order = matmul_nbits_reference(&w);
        let ort_order = matmul_nbits_ort_order(&w);
        let want = ggml(GgmlType::Q4_1, kb, n, &data);
        let u = f64::from(f32::EPSILON) / 2.0;
        for (i, &g) in want.iter().enumerate() {
            let block = &data[i / QK * 20..][..20];
            let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
            let m = f64::from(f16::from_le_bytes([block[2], block[3]]).to_f32()).abs();
            for (order, r, bound) in [
                ("(q - z)·d", spec_order[i], u * (m + 3.0 * f64::from(g).abs())),
                ("q·d + (-z·d)", ort_order[i], 2.0 * u * (m + f64::from(g).abs())),
            ] {
                if d == 0.0 {
                    // Zero-scale blocks are rewritten to give the minimum exactly.
                    prop_assert!(r.to_bits() == g.to_bits(), "{} element {}: {:e} != ggml {:e}", order, i, r, g);
                    continue;
                }
                // `(1 + 8u)` covers the second-order terms.
                let bound = bound * (1.0 + 8.0 * u);
                let err = (f64::from(r) - f64::from(g)).abs();
                prop_assert!(err <= bound, "{} element {}: {:e} vs ggml {:e}: error {:e} > bound {:e} (d {:e}, m {:e})", order, i, r, g, err, bound, d, m);
            }
        }
    }

    #[test]
    fn q4_0_gather_block_quantized_is_exact((kb, n, data) in weight(GgmlType::Q4_0, 1)) {
        let w = gather_block_quantized("e", GgmlType::Q4_0, &dims(kb, n), &data).unwrap();
        prop_assert_eq!((w.bits, w.block_size, w.rows, w.k), (4, 32, n, kb * QK));
        assert_bitwise(&gather_reference(&w), &ggml(GgmlType::Q4_0, kb, n, &data))?;
    }

    #[test]
    fn q8_0_gather_block_quantized_is_exact((kb, n, data) in weight(GgmlType::Q8_0, 1)) {
        let w = gather_block_quantized("e", GgmlType::Q8_0, &dims(kb, n), &data).unwrap();
        prop_assert_eq!((w.bits, w.block_size), (8, 32));
        assert_bitwise(&gather_reference(&w), &ggml(GgmlType::Q8_0, kb, n, &data))?;
    }

    #[test]
    fn nibble_repairing_moves_element_j_to_its_onnx_slot(qs in prop::array::uniform16(any::<u8>())) {
        let onnx = q4_to_onnx_order(&qs);
        for e in 0..32 {
            let ggml_code = if e < 16 { qs[e] & 0x0F } else { qs[e - 16] >> 4 };
            prop_assert_eq!(code(&onnx, 4, e), ggml_code, "element {}", e);
        }
    }
}

#[test]
fn q4_1_zero_scale_block_gives_its_minimum_exactly() {
    // d = +0, m = -0: ggml gives +0 · q + -0 = +0 for every element.
    // d = -0, m = -0: ggml gives -0 · q + -0 = -0 (regression: a rewrite to `m + 0` gave +0).
    // d = -0, m = -2.5: every element is -2.5.
    let mut data = Vec::new();
    for (d, m, qs) in [
        (0.0f32, -0.0f32, 0xA5u8),
        (-0.0, -0.0, 0x17),
        (-0.0, -2.5, 0x3C),
    ] {
        data.extend(f16::from_f32(d).to_le_bytes());
        data.extend(f16::from_f32(m).to_le_bytes());
        data.extend([qs; 16]);
    }
    let w = matmul_nbits("w", GgmlType::Q4_1, &[32, 3], &data).unwrap();
    let got = matmul_nbits_reference(&w);
    let want = ggml(GgmlType::Q4_1, 1, 3, &data);
    assert!(want[..32].iter().all(|v| v.to_bits() == 0), "ggml gives +0");
    assert!(
        want[32..64].iter().all(|v| v.to_bits() == 0x8000_0000),
        "ggml gives -0"
    );
    assert!(want[64..].iter().all(|&v| v == -2.5));
    let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&want), "(q - z)·d");
    // Regression: a zero point of +0 gave +0 here for the (-0, -0) block.
    assert_eq!(
        bits(&matmul_nbits_ort_order(&w)),
        bits(&want),
        "q·d + (-z·d)"
    );
}

#[test]
fn q4_0_hand_packed_block_is_repaired_not_copied() {
    // ggml: element 0 = low nibble of byte 0 (0x1), element 16 = its high nibble (0x2),
    // element 1 = low nibble of byte 1 (0x3). onnxruntime: byte 0 = element 0 | element 1 << 4.
    let mut data = vec![0x00, 0x3C, 0x21, 0x03];
    data.extend([0u8; 14]);
    let w = matmul_nbits("w", GgmlType::Q4_0, &[32, 1], &data).unwrap();
    let b = w.b.as_bytes();
    assert_eq!(b[0], 0x31, "elements 0 and 1");
    assert_eq!(b[8], 0x02, "elements 16 and 17");
}

#[test]
fn unsupported_conversions_name_the_tensor_and_type() {
    let q4_1 = vec![0u8; 20];
    let e =
        gather_block_quantized("token_embd.weight", GgmlType::Q4_1, &[32, 1], &q4_1).unwrap_err();
    assert!(matches!(e, GgufError::Unsupported { .. }), "{e}");
    let msg = e.to_string();
    for part in ["token_embd.weight", "Q4_1", "integer", "dequantize"] {
        assert!(msg.contains(part), "message should name {part:?}: {msg}");
    }
    let f32_data = vec![0u8; 32 * 4];
    let e = matmul_nbits("blk.0.attn_q.weight", GgmlType::F32, &[32, 1], &f32_data).unwrap_err();
    assert!(matches!(e, GgufError::Unsupported { .. }), "{e}");
    assert!(e.to_string().contains("blk.0.attn_q.weight") && e.to_string().contains("F32"));
}

#[test]
fn repacking_checks_shape_against_data() {
    let e = matmul_nbits("w", GgmlType::Q4_0, &[32, 2], &[0u8; 18]).unwrap_err();
    assert!(matches!(e, GgufError::BadShape { .. }), "{e}");
    let e = matmul_nbits("w", GgmlType::Q4_0, &[32, 1, 1], &[0u8; 18]).unwrap_err();
    assert!(matches!(e, GgufError::BadShape { .. }), "{e}");
    let e = matmul_nbits("w", GgmlType::Q4_0, &[u64::MAX - 31, u64::MAX], &[0u8; 18]).unwrap_err();
    assert!(matches!(e, GgufError::BadShape { .. }), "{e}");
}
