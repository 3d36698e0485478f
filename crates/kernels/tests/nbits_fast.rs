//! The fast int8-activation `MatMulNBits` kernel against its reference: the same bits for
//! odd sizes, sizes around the 8-column tile and the 32-value chunk, every zero-point kind,
//! with and without bias, any row count and thread count (DESIGN.md §6: a decode row equals
//! the same row of a prefill).

use oxgen_kernels::ThreadPool;
use oxgen_kernels::cpu;
use oxgen_kernels::int8::Variant;
use oxgen_kernels::nbits::{
    NBitsLayout, PackedNBits, QuantWeights, ZeroPoints, matmul_nbits_int8,
    matmul_nbits_int8_reference, matmul_nbits_int8_variant, matmul_packed, matmul_packed_glu,
    matmul_packed_parts,
};
use oxgen_kernels::quant::code;
use oxgen_kernels::rng::Rng;
use oxgen_kernels::sigmoid::silu_mul;

/// Every (pool, ISA) pair to run a fast kernel on.
fn every_pool_and_variant(pools: &[ThreadPool]) -> impl Iterator<Item = (&ThreadPool, Variant)> {
    pools
        .iter()
        .flat_map(|p| Variant::available().iter().map(move |&i| (p, i)))
}

/// Whether `OXGEN_ISA` keeps this run below AVX2 (`scalar`): then no fast kernel runs and
/// nothing packs, so these tests have nothing to compare with the reference.
fn capped_below_avx2() -> bool {
    cpu::cap().is_some_and(|cap| cap < cpu::Level::Avx2)
}

/// Whether two results are equal bit for bit.
fn same_bits(want: &[f32], got: &[f32]) -> bool {
    want.len() == got.len()
        && want
            .iter()
            .zip(got)
            .all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Says which MatMulNBits variants this machine runs (so a run's log shows what the bit-exact
/// tests below covered: AVX-512/VNNI only where the CPU has it), and that the AVX2 one is
/// among them wherever AVX2 with FMA is there and not capped off. scripts/test.sh runs it
/// uncaptured.
#[test]
fn reports_the_variants_it_covers() {
    let f = cpu::features();
    let names: Vec<String> = Variant::available()
        .iter()
        .map(|i| format!("{i:?}"))
        .collect();
    eprintln!(
        "kernels: CPU level {:?} (cap {:?}); MatMulNBits variants checked against the scalar \
         reference here: {}",
        f.level,
        cpu::cap(),
        if names.is_empty() {
            "none (scalar only)".to_string()
        } else {
            names.join(", ")
        }
    );
    if f.avx2_fma() && f.f16c {
        assert_eq!(Variant::available().first(), Some(&Variant::Avx2));
    }
}

#[test]
fn fast_kernel_equals_the_reference_bit_for_bit() {
    if capped_below_avx2() {
        return;
    }
    let mut rng = Rng::new(7);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let mut cases = 0;
    for &(n, k) in &[
        (1, 32),
        (7, 33),
        (8, 64),
        (9, 96),
        (16, 100),
        (17, 160),
        (63, 576),
        (64, 31),
        (65, 257),
    ] {
        for (bits, block) in [(4, 32), (4, 64), (4, 128), (8, 32), (8, 64)] {
            let layout = NBitsLayout::new(n, k, bits, block).unwrap();
            let data: Vec<u8> = (0..n * layout.k_blocks * layout.blob_size)
                .map(|_| rng.next_u64() as u8)
                .collect();
            let scales: Vec<f32> = (0..n * layout.k_blocks)
                .map(|_| 0.001 + 0.02 * rng.uniform().abs())
                .collect();
            let zp_packed: Vec<u8> = (0..n * layout.zp_row_bytes)
                .map(|_| rng.next_u64() as u8)
                .collect();
            let zp_float: Vec<f32> = (0..n * layout.k_blocks)
                .map(|_| (1 << (bits - 1)) as f32 + 4.0 * rng.uniform())
                .collect();
            // Every code the default (Q8_0 imports), which the packed layout drops.
            let zp_default = vec![if bits == 4 { 0x88u8 } else { 0x80 }; n * layout.zp_row_bytes];
            let bias: Vec<f32> = (0..n).map(|_| rng.uniform()).collect();
            // Half the shapes get f16 scales and the zero points of a GGUF Q4_1 import,
            // `fl(-m / d)` of an f16 minimum `m`, whose offsets the packed layout stores as
            // f16 (two bytes a block each for scales and offsets).
            let gguf = (n + k).is_multiple_of(2);
            let (scales, zp_float) = if gguf {
                let f16 = |x: f32| half::f16::from_f32(x).to_f32();
                let scales: Vec<f32> = scales.iter().map(|&d| f16(d)).collect();
                let zp = scales
                    .iter()
                    .map(|&d| -f16(-0.02 * rng.uniform().abs()) / d)
                    .collect();
                (scales, zp)
            } else {
                (scales, zp_float)
            };
            for m in [1, 2, 5, 7, 9] {
                // Large and tiny activations, and an all-zero row.
                let mut a: Vec<f32> = (0..m * k).map(|_| 5.0 * rng.uniform()).collect();
                if m > 1 {
                    a[k..2 * k].fill(0.0);
                }
                for zp in [
                    ZeroPoints::Default,
                    ZeroPoints::Packed(&zp_packed),
                    ZeroPoints::Packed(&zp_default),
                    ZeroPoints::Float(&zp_float),
                ] {
                    let w = QuantWeights {
                        layout,
                        data: &data,
                        scales: &scales,
                        zero_points: zp,
                    };
                    for bias in [None, Some(&bias[..])] {
                        let mut want = vec![0f32; m * n];
                        matmul_nbits_int8_reference(&a, m, &w, bias, &mut want, &pools[0]).unwrap();
                        for (pool, isa) in every_pool_and_variant(&pools) {
                            let mut got = vec![f32::NAN; m * n];
                            matmul_nbits_int8_variant(&a, m, &w, bias, &mut got, pool, isa)
                                .unwrap();
                            let same = same_bits(&want, &got);
                            assert!(
                                same,
                                "n {n} k {k} block {block} m {m} zp {zp:?}: {want:?} vs {got:?}"
                            );
                        }
                        // The column-interleaved repack gives the same bits too.
                        let packed = PackedNBits::pack(&w)
                            .unwrap()
                            .expect("AVX2 runs this layout");
                        // Stored bytes: codes, scales, and zero points unless all default.
                        let blocks = n.next_multiple_of(8) * layout.k_blocks;
                        let f16_or_f32 = if gguf { 2 } else { 4 };
                        let all_default = |z: &[u8]| {
                            (0..n).all(|j| {
                                (0..layout.k_blocks).all(|b| {
                                    code(&z[j * layout.zp_row_bytes..], bits, b) == 1 << (bits - 1)
                                })
                            })
                        };
                        let zp_bytes = match zp {
                            ZeroPoints::Float(_) => blocks * f16_or_f32,
                            ZeroPoints::Packed(z) if !all_default(z) => blocks,
                            _ => 0,
                        };
                        assert_eq!(
                            packed.nbytes(),
                            blocks * (layout.block_size * bits as usize / 8 + f16_or_f32)
                                + zp_bytes,
                            "stored sizes, n {n} k {k} bits {bits} zp {zp:?}"
                        );
                        for (pool, isa) in every_pool_and_variant(&pools) {
                            let mut got = vec![f32::NAN; m * n];
                            matmul_packed(&a, m, &packed, bias, &mut got, pool, isa).unwrap();
                            let same = same_bits(&want, &got);
                            assert!(
                                same,
                                "packed {isa:?} bits {bits} n {n} k {k} block {block} m {m} zp {zp:?}: {want:?} vs {got:?}"
                            );
                        }
                        // Each row alone equals its row of the batch.
                        let mut one = vec![0f32; n];
                        matmul_nbits_int8(&a[(m - 1) * k..], 1, &w, bias, &mut one, &pools[1])
                            .unwrap();
                        assert_eq!(one, want[(m - 1) * n..]);
                        cases += 1;
                    }
                }
            }
        }
    }
    assert_eq!(cases, 9 * 5 * 5 * 4 * 2);
    // On an x86-64 machine at least the AVX2 kernel ran (CI machines have AVX2).
    #[cfg(target_arch = "x86_64")]
    assert!(Variant::available().contains(&Variant::Avx2));
}

/// Random codes, scales and float zero points for an `n × k` matrix.
fn matrix(rng: &mut Rng, layout: &NBitsLayout) -> (Vec<u8>, Vec<f32>, Vec<u8>, Vec<f32>) {
    let n = layout.n;
    let data = (0..n * layout.k_blocks * layout.blob_size)
        .map(|_| rng.next_u64() as u8)
        .collect();
    let scales = (0..n * layout.k_blocks)
        .map(|_| 0.001 + 0.02 * rng.uniform().abs())
        .collect();
    let zp_packed = (0..n * layout.zp_row_bytes)
        .map(|_| rng.next_u64() as u8)
        .collect();
    let zp_float = (0..n * layout.k_blocks)
        .map(|_| (1 << (layout.bits - 1)) as f32 + 4.0 * rng.uniform())
        .collect();
    (data, scales, zp_packed, zp_float)
}

#[test]
fn matrices_packed_side_by_side_give_each_part_the_reference_bits() {
    if capped_below_avx2() {
        return;
    }
    let mut rng = Rng::new(11);
    let pools = [ThreadPool::new(1), ThreadPool::new(3)];
    let (k, widths) = (160, [20, 8, 37]);
    for (bits, block) in [(4, 32), (4, 64), (8, 32)] {
        let layouts: Vec<NBitsLayout> = widths
            .iter()
            .map(|&n| NBitsLayout::new(n, k, bits, block).unwrap())
            .collect();
        let mats: Vec<_> = layouts.iter().map(|l| matrix(&mut rng, l)).collect();
        for zp in 0..3 {
            let parts: Vec<QuantWeights<f32>> = layouts
                .iter()
                .zip(&mats)
                .map(
                    |(&layout, (data, scales, zp_packed, zp_float))| QuantWeights {
                        layout,
                        data,
                        scales,
                        zero_points: match zp {
                            0 => ZeroPoints::Default,
                            1 => ZeroPoints::Packed(zp_packed),
                            _ => ZeroPoints::Float(zp_float),
                        },
                    },
                )
                .collect();
            let packed = PackedNBits::pack_parts(&parts)
                .unwrap()
                .expect("AVX2 runs this");
            assert_eq!(packed.spans().len(), 3);
            for m in [1, 4, 9] {
                let a: Vec<f32> = (0..m * k).map(|_| 3.0 * rng.uniform()).collect();
                let want: Vec<Vec<f32>> = parts
                    .iter()
                    .map(|w| {
                        let mut out = vec![0f32; m * w.layout.n];
                        matmul_nbits_int8_reference(&a, m, w, None, &mut out, &pools[0]).unwrap();
                        out
                    })
                    .collect();
                for (pool, isa) in every_pool_and_variant(&pools) {
                    let mut got: Vec<Vec<f32>> =
                        want.iter().map(|w| vec![f32::NAN; w.len()]).collect();
                    let mut outs: Vec<&mut [f32]> = got.iter_mut().map(Vec::as_mut_slice).collect();
                    matmul_packed_parts(&a, m, &packed, &mut outs, pool, isa).unwrap();
                    for (p, (want, got)) in want.iter().zip(&got).enumerate() {
                        let same = same_bits(want, got);
                        assert!(same, "{isa:?} bits {bits} zp {zp} m {m} part {p}");
                    }
                }
            }
            // One matrix packed from parts is not one matrix.
            let mut out = vec![0f32; 65];
            let a = vec![0f32; k];
            assert!(
                matmul_packed(&a, 1, &packed, None, &mut out, &pools[0], Variant::Avx2).is_err()
            );
        }
        // Parts that disagree on K are refused.
        let other = NBitsLayout::new(8, k + 32, bits, block).unwrap();
        let (data, scales, _, _) = matrix(&mut rng, &other);
        let odd = QuantWeights {
            layout: other,
            data: &data,
            scales: &scales,
            zero_points: ZeroPoints::Default,
        };
        let first = QuantWeights {
            layout: layouts[0],
            data: &mats[0].0,
            scales: &mats[0].1,
            zero_points: ZeroPoints::Default,
        };
        assert!(PackedNBits::pack_parts(&[first, odd]).is_err());
    }
}

/// `m` (from [`matrix`]) as weights with default (0), packed (1) or float (2) zero points.
fn weights<'a>(
    layout: NBitsLayout,
    m: &'a (Vec<u8>, Vec<f32>, Vec<u8>, Vec<f32>),
    zp: usize,
) -> QuantWeights<'a, f32> {
    QuantWeights {
        layout,
        data: &m.0,
        scales: &m.1,
        zero_points: match zp {
            0 => ZeroPoints::Default,
            1 => ZeroPoints::Packed(&m.2),
            _ => ZeroPoints::Float(&m.3),
        },
    }
}

#[test]
fn gate_and_up_packed_in_turn_give_the_reference_gated_silu_bits() {
    if capped_below_avx2() {
        return;
    }
    let mut rng = Rng::new(13);
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    let k = 96;
    // Widths around the 8-column tile and the 16-column AVX-512 pair.
    for n in [1, 8, 13, 16, 37, 64] {
        for (bits, block) in [(4, 32), (8, 32)] {
            let layout = NBitsLayout::new(n, k, bits, block).unwrap();
            let (gate_m, up_m) = (matrix(&mut rng, &layout), matrix(&mut rng, &layout));
            for zp in 0..3 {
                let (gate, up) = (weights(layout, &gate_m, zp), weights(layout, &up_m, zp));
                let packed = PackedNBits::pack_glu(&gate, &up)
                    .unwrap()
                    .expect("AVX2 runs this");
                for m in [1, 2, 5, 9] {
                    // Activations wide enough that the sigmoid sees both signs and its tails.
                    let a: Vec<f32> = (0..m * k).map(|_| 8.0 * rng.uniform()).collect();
                    let product = |w: &QuantWeights<f32>| {
                        let mut out = vec![0f32; m * n];
                        matmul_nbits_int8_reference(&a, m, w, None, &mut out, &pools[0]).unwrap();
                        out
                    };
                    let (g, u) = (product(&gate), product(&up));
                    let mut want = vec![0f32; m * n];
                    silu_mul(&g, &u, &mut want);
                    for (pool, isa) in every_pool_and_variant(&pools) {
                        let mut got = vec![f32::NAN; m * n];
                        matmul_packed_glu(&a, m, &packed, &mut got, pool, isa).unwrap();
                        let same = same_bits(&want, &got);
                        assert!(
                            same,
                            "{isa:?} n {n} bits {bits} zp {zp} m {m} threads {}",
                            pool.threads()
                        );
                    }
                }
                // A gate/up pair is not one matrix, nor parts.
                let a = vec![0f32; k];
                let mut out = vec![0f32; 2 * n];
                assert!(
                    matmul_packed(
                        &a,
                        1,
                        &packed,
                        None,
                        &mut out[..n],
                        &pools[0],
                        Variant::Avx2
                    )
                    .is_err()
                );
                let (lo, hi) = out.split_at_mut(n);
                assert!(
                    matmul_packed_parts(&a, 1, &packed, &mut [lo, hi], &pools[0], Variant::Avx2)
                        .is_err()
                );
            }
        }
    }
    // Gate and up of different widths are refused.
    let (l8, l9) = (
        NBitsLayout::new(8, k, 4, 32).unwrap(),
        NBitsLayout::new(9, k, 4, 32).unwrap(),
    );
    let (m8, m9) = (matrix(&mut rng, &l8), matrix(&mut rng, &l9));
    assert!(PackedNBits::pack_glu(&weights(l8, &m8, 0), &weights(l9, &m9, 0)).is_err());
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..proptest::prelude::ProptestConfig::default()
    })]

    /// Any shape, not only the hand-picked ones above: every fast path here (each variant on
    /// the stored layout, and the packed layout) gives the reference's bits, for any row
    /// count, column count, depth (whole blocks or not), code width, block size, zero-point
    /// kind and bias.
    #[test]
    fn any_shape_gives_the_reference_bits(
        n in 1usize..80,
        k in 1usize..400,
        m in 1usize..10,
        wide in proptest::bool::ANY,
        block_log in 5u32..8,
        zp_kind in 0usize..3,
        with_bias in proptest::bool::ANY,
        seed in proptest::num::u64::ANY,
    ) {
        if capped_below_avx2() {
            return Ok(());
        }
        let bits = if wide { 8 } else { 4 };
        let layout = NBitsLayout::new(n, k, bits, 1 << block_log).unwrap();
        let mut rng = Rng::new(seed);
        let (data, scales, zp_packed, zp_float) = matrix(&mut rng, &layout);
        let zero_points = match zp_kind {
            0 => ZeroPoints::Default,
            1 => ZeroPoints::Packed(&zp_packed),
            _ => ZeroPoints::Float(&zp_float),
        };
        let w = QuantWeights { layout, data: &data, scales: &scales, zero_points };
        let bias: Vec<f32> = (0..n).map(|_| rng.uniform()).collect();
        let bias = with_bias.then_some(&bias[..]);
        let a: Vec<f32> = (0..m * k).map(|_| 5.0 * rng.uniform()).collect();
        let pools = [ThreadPool::new(1), ThreadPool::new(2)];
        let mut want = vec![0f32; m * n];
        matmul_nbits_int8_reference(&a, m, &w, bias, &mut want, &pools[0]).unwrap();
        let packed = PackedNBits::pack(&w).unwrap().expect("AVX2 runs this layout");
        for (pool, variant) in every_pool_and_variant(&pools) {
            let mut got = vec![f32::NAN; m * n];
            matmul_nbits_int8_variant(&a, m, &w, bias, &mut got, pool, variant).unwrap();
            proptest::prop_assert!(same_bits(&want, &got), "stored, {variant:?}");
            got.fill(f32::NAN);
            matmul_packed(&a, m, &packed, bias, &mut got, pool, variant).unwrap();
            proptest::prop_assert!(same_bits(&want, &got), "packed, {variant:?}");
        }
    }
}

/// The extreme integer sums: every 4-bit code 15 against activations that all quantize to
/// +127 (or all to -127), so each chunk's eight pair sums reach their largest magnitude
/// (8 · 2 · 15 · 127 = 30480, which the AVX2 kernel adds in i16 lanes). Every variant, packed
/// and stored, gives the reference's bits.
#[test]
fn the_largest_4_bit_dot_products_are_exact() {
    if capped_below_avx2() {
        return;
    }
    let (n, k, m) = (16, 256, 8);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    for block in [32, 64, 256] {
        let layout = NBitsLayout::new(n, k, 4, block).unwrap();
        let data = vec![0xFFu8; n * layout.k_blocks * layout.blob_size];
        let scales = vec![0.01f32; n * layout.k_blocks];
        let w = QuantWeights {
            layout,
            data: &data,
            scales: &scales,
            zero_points: ZeroPoints::Default,
        };
        for sign in [1.0f32, -1.0] {
            let a = vec![sign * 3.0; m * k];
            let mut want = vec![0f32; m * n];
            matmul_nbits_int8_reference(&a, m, &w, None, &mut want, &pools[0]).unwrap();
            // Σ (15 - 8) · 127 per column, times the scales: far from zero, one sign.
            assert!(want.iter().all(|&v| v * sign > 50.0), "{want:?}");
            let packed = PackedNBits::pack(&w)
                .unwrap()
                .expect("AVX2 runs this layout");
            for (pool, isa) in every_pool_and_variant(&pools) {
                let mut got = vec![f32::NAN; m * n];
                matmul_packed(&a, m, &packed, None, &mut got, pool, isa).unwrap();
                assert!(
                    same_bits(&want, &got),
                    "packed {isa:?} block {block} sign {sign}"
                );
                got.fill(f32::NAN);
                matmul_nbits_int8_variant(&a, m, &w, None, &mut got, pool, isa).unwrap();
                assert!(
                    same_bits(&want, &got),
                    "stored {isa:?} block {block} sign {sign}"
                );
            }
        }
    }
}
