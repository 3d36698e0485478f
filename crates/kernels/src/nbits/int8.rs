//! `MatMulNBits` with int8 activations, the entry points: the fast kernel over the stored
//! layout ([`super::stored_avx2`], AVX2 or AVX-VNNI) where [`super::isa`] finds the CPU and
//! the layout fit, else the reference ([`super::int8_reference`], whose module doc gives the
//! arithmetic). Every path gives the same bits.

use super::int8_reference::matmul_nbits_int8_reference;
use super::layout::{QuantWeights, TILE, check_args, par_output_rows};
use super::stored_avx2;
use super::support::supported;
use crate::ThreadPool;
use crate::error::KernelError;
use crate::int8::Variant;
use crate::int8::with_rows;
use crate::par::{par_row_tiles, parts_for};

/// `out = a · dequant(w)ᵀ + bias` with `a` (`m × K`, f32) quantized to int8 per block: the
/// AVX2 kernel (`nbits/stored_avx2.rs`, with AVX-VNNI where present) where the CPU and layout
/// allow, else [`matmul_nbits_int8_reference`]. Every path gives the same bits.
pub fn matmul_nbits_int8(
    a: &[f32],
    m: usize,
    w: &QuantWeights<'_, f32>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    if !supported(&w.layout) {
        return matmul_nbits_int8_reference(a, m, w, bias, out, pool);
    }
    matmul_nbits_int8_variant(a, m, w, bias, out, pool, Variant::best())
}

/// [`matmul_nbits_int8`] on one kernel variant (`isa` from [`Variant::available`], and a
/// layout [`supported`] accepts), to test each against the reference.
pub fn matmul_nbits_int8_variant(
    a: &[f32],
    m: usize,
    w: &QuantWeights<'_, f32>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    pool: &ThreadPool,
    isa: Variant,
) -> Result<(), KernelError> {
    check_args(a.len(), m, w, bias.map(<[f32]>::len), out.len())?;
    if !supported(&w.layout) || !Variant::available().contains(&isa) {
        return Err(KernelError::Shape(format!(
            "the {isa:?} kernel does not run {}-bit blocks of {} on this CPU",
            w.layout.bits, w.layout.block_size
        )));
    }
    let k = w.layout.k;
    with_rows(m, |rows| {
        for (i, row) in rows.iter_mut().enumerate() {
            row.quantize(&a[i * k..][..k], w.layout.block_size, true);
        }
        let rows = &*rows;
        if m == 1 {
            par_output_rows(pool, m, w.layout, out, |i, cols, out_row| {
                stored_avx2::row_part(&rows[i], w, bias, cols, out_row, isa);
            });
        } else {
            // Tasks take column blocks in whole tiles and walk every row over their block, so
            // its weights (64 columns: 18 KiB at K = 576) stay in cache across the rows.
            let n = w.layout.n;
            let tiles = n.div_ceil(TILE);
            let parts = parts_for(pool, tiles, m * k).max(n.div_ceil(64));
            par_row_tiles(pool, out, n, TILE, m, parts, |i, cols, out_row| {
                stored_avx2::row_part(&rows[i], w, bias, cols, out_row, isa);
            });
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nbits::int8_reference::block_offset;
    use crate::nbits::layout::{NBitsLayout, ZeroPoints};
    use crate::rng::Rng;

    struct Case {
        layout: NBitsLayout,
        data: Vec<u8>,
        scales: Vec<f32>,
        zp_packed: Vec<u8>,
        zp_float: Vec<f32>,
        a: Vec<f32>,
        m: usize,
    }

    fn case(m: usize, n: usize, k: usize, bits: u32, block: usize) -> Case {
        let layout = NBitsLayout::new(n, k, bits, block).unwrap();
        let mut rng = Rng::new(11);
        let data = rng.bytes(n * layout.k_blocks * layout.blob_size);
        let scales = rng.floats(n * layout.k_blocks, 0.01, 0.03);
        let zp_packed = rng.bytes(n * layout.zp_row_bytes);
        let zp_float = rng.floats(n * layout.k_blocks, 6.0, 8.0);
        let a = rng.values(m * k, 3.0);
        Case {
            layout,
            data,
            scales,
            zp_packed,
            zp_float,
            a,
            m,
        }
    }

    fn weights<'a>(c: &'a Case, zp: usize) -> QuantWeights<'a, f32> {
        let zero_points = match zp {
            0 => ZeroPoints::Default,
            1 => ZeroPoints::Packed(&c.zp_packed),
            _ => ZeroPoints::Float(&c.zp_float),
        };
        QuantWeights {
            layout: c.layout,
            data: &c.data,
            scales: &c.scales,
            zero_points,
        }
    }

    #[test]
    fn close_to_the_f32_path_for_every_zero_point_kind() {
        let pool = ThreadPool::new(1);
        for (bits, block) in [(4, 32), (8, 16), (4, 128)] {
            let c = case(3, 13, 160, bits, block);
            for zp in 0..3 {
                let w = weights(&c, zp);
                let (mut exact, mut int8) = (vec![0f32; c.m * 13], vec![0f32; c.m * 13]);
                crate::nbits::matmul_nbits(&c.a, c.m, &w, None, &mut exact, &pool).unwrap();
                matmul_nbits_int8(&c.a, c.m, &w, None, &mut int8, &pool).unwrap();
                let scale = exact.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (x, y) in exact.iter().zip(&int8) {
                    // int8 rounding of activations: relative error ~ 1/254 per term.
                    assert!(
                        (x - y).abs() <= 0.02 * scale,
                        "bits {bits} zp {zp}: {x} vs {y}"
                    );
                }
            }
        }
    }

    #[test]
    fn offsets_of_gguf_q4_1_zero_points_are_the_f16_minimums() {
        let mut rng = Rng::new(5);
        let f16 = |x: f32| half::f16::from_f32(x).to_f32();
        let mut snapped = 0;
        for _ in 0..100_000 {
            let d = f16(0.05 * rng.uniform());
            let m = f16(0.2 * rng.uniform());
            if d == 0.0 {
                continue;
            }
            // The importer's zero point; `-(z·d)` is `m` or one of its f32 neighbours.
            let z = -m / d;
            snapped += usize::from(-(z * d) != m);
            assert_eq!(block_offset(z, d).to_bits(), m.to_bits(), "d {d} m {m}");
        }
        assert!(snapped > 1000, "the neighbours occur ({snapped})");
        // An offset that is no f16's neighbour stays as computed; NaN stays NaN.
        let (z, s) = (7.3f32, 0.0123f32);
        assert_eq!(block_offset(z, s), -(z * s));
        assert!(block_offset(f32::NAN, 1.0).is_nan());
    }

    #[test]
    fn bitwise_independent_of_threads_and_rows() {
        let c = case(5, 37, 96, 4, 32);
        let w = weights(&c, 2);
        let run = |threads: usize, m: usize, a: &[f32]| {
            let mut out = vec![0f32; m * 37];
            matmul_nbits_int8(a, m, &w, None, &mut out, &ThreadPool::new(threads)).unwrap();
            out
        };
        let all = run(1, 5, &c.a);
        assert_eq!(all, run(3, 5, &c.a));
        for i in 0..5 {
            assert_eq!(&all[i * 37..][..37], &run(1, 1, &c.a[i * 96..][..96])[..]);
        }
    }
}
