//! MXFP4 with int8 activations (`accuracy_level` 4): the arithmetic llama.cpp runs its MXFP4
//! matrices with on CPU, integer dot products of the codes with activations quantized per
//! block, one f32 multiply-add per block.
//!
//! Each row of `A` is quantized in blocks of 32 as `MatMulNBits`' int8 path does it
//! ([`crate::int8::quantize_row`]: `scale_a = max|a| / 127`, codes `q_a`). A weight code `c`
//! is the integer `v(c) = 2 · E2M1[c]` in `[-12, 12]` at half the block's scale, so with
//! `s = e8m0(e) · 0.5` (`2^(e - 128)`, exact) and `dot = Σ v · q_a` over the block (exact in
//! i32):
//!
//! ```text
//! y = fma(s · scale_a, dot as f32, y)     blocks in K order from 0, then y + bias
//! ```
//!
//! A row's result depends on that row alone, and columns are independent: every path (the
//! scalar [`matmul_mxfp4_int8_reference`], AVX2, AVX-512 VNNI; from the stored layout or from
//! [`Mxfp4Packed`]) gives the same bits at any thread count and batch (DESIGN.md §6).
//!
//! The vector kernels compute tiles of 16 columns by one block, 272 bytes ([`Mxfp4Packed`]'s
//! layout, or gathered from the stored one on the fly): eight groups of four inputs, 32 bytes
//! each, then the 16 columns' scale bytes. Byte `j` of group `g` holds input `4g + j % 4` of
//! column `j / 4` in its low nibble and of column `8 + j / 4` in its high nibble, so a group's
//! low nibbles are eight columns' runs of four inputs, what one 32-bit lane of `vpdpbusd` (or
//! `vpmaddubsw` then `vpmaddwd`) sums, and the high nibbles the other eight columns. Weights
//! enter the unsigned side as `v + 12` in `[0, 24]`; the block's `12 · Σ q_a` comes off after.

use std::ops::Range;

use super::int8_reference::matmul_mxfp4_int8_reference;
use super::packed::{GROUP_BYTES, Mxfp4Packed, TILE_BYTES, TILE_COLS, gather};
use super::{BLOCK, E2M1, Mxfp4Weights};
#[cfg(target_arch = "x86_64")]
use super::{tile_avx2::Avx2, tile_avx512::Avx512};
use crate::ThreadPool;
use crate::error::{KernelError, check_len, numel};
use crate::int8::{QuantizedRow, Variant, with_rows};
use crate::par::{Grid, MAX_ROW_BLOCK, par_row_blocks_spans, parts_for};
use crate::pool::Prelude;

/// What the unsigned weights carry on top of `v`.
pub(super) const OFFSET: i32 = 12;
/// `v(c) + 12` by code.
pub(super) const UNSIGNED: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut c = 0;
    while c < 16 {
        t[c] = (2.0 * E2M1[c] + OFFSET as f32) as u8;
        c += 1;
    }
    t
};

/// `out (m × n) = a (m × k) · Wᵀ + bias` with int8 activations (see the module doc): the
/// fastest vector kernel here, on `packed` when given (`w` packed at load) or else on `w` as
/// stored; the scalar reference where the CPU has no kernel. The same bits every way.
pub fn matmul_mxfp4_int8(
    a: &[f32],
    m: usize,
    w: &Mxfp4Weights,
    packed: Option<&Mxfp4Packed>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    if Variant::available().is_empty() {
        return matmul_mxfp4_int8_reference(a, m, w, bias, out, pool);
    }
    matmul_mxfp4_int8_variant(a, m, (w, packed), bias, out, pool, Variant::best())
}

/// [`matmul_mxfp4_int8`] on one kernel variant (`isa` from [`Variant::available`]; AVX-VNNI runs
/// the AVX2 kernel), to test each against the reference; `w` with its packed form, if any.
pub fn matmul_mxfp4_int8_variant(
    a: &[f32],
    m: usize,
    (w, packed): (&Mxfp4Weights, Option<&Mxfp4Packed>),
    bias: Option<&[f32]>,
    out: &mut [f32],
    pool: &ThreadPool,
    isa: Variant,
) -> Result<(), KernelError> {
    check_args(a, m, w, bias, out)?;
    if !Variant::available().contains(&isa) {
        return Err(KernelError::Shape(format!(
            "the {isa:?} MXFP4 kernel does not run on this CPU"
        )));
    }
    let source = match packed {
        Some(p) if p.dims() != (w.n, w.k) => {
            return Err(KernelError::Shape(format!(
                "a packed {}x{} MXFP4 matrix for a {}x{} one",
                p.n, p.k, w.n, w.k
            )));
        }
        Some(p) => Source::Packed(&p.bytes),
        None => Source::Stored(w),
    };
    let (n, k) = (w.n, w.k);
    if m == 0 || n == 0 {
        return Ok(());
    }
    with_rows(m, |rows| {
        for (i, row) in rows.iter_mut().enumerate() {
            row.quantize(&a[i * k..][..k], BLOCK, false);
        }
        let rows = &*rows;
        // The weights' unpacking is shared by a task's rows: tasks take as many rows as they
        // can and split the columns for the parts the rows do not fill.
        let rows_per_task = m.min(MAX_ROW_BLOCK);
        let row_blocks = m.div_ceil(rows_per_task);
        let col_parts = parts_for(pool, m * n, k).div_ceil(row_blocks);
        #[allow(clippy::single_range_in_vec_init)]
        let spans = [0..n];
        let task = |first: usize, _: usize, cols: Range<usize>, outs: &mut [&mut [f32]]| {
            let rows = &rows[first..][..outs.len()];
            // SAFETY: `isa` is available (checked above); the arguments were checked; `cols`
            // starts on a whole tile (`par_row_blocks_spans` cuts at tiles).
            #[cfg(target_arch = "x86_64")]
            unsafe {
                columns(isa, source, rows, cols, bias, outs)
            };
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (isa, source, rows, cols, bias, outs);
        };
        par_row_blocks_spans(
            pool,
            Prelude::NONE,
            &mut [out],
            &spans,
            Grid {
                tile: TILE_COLS,
                rows_per_task,
                col_parts,
            },
            task,
        );
    });
    Ok(())
}

pub(super) fn check_args(
    a: &[f32],
    m: usize,
    w: &Mxfp4Weights,
    bias: Option<&[f32]>,
    out: &[f32],
) -> Result<(), KernelError> {
    w.check()?;
    check_len("MXFP4 activations", a.len(), numel(&[m, w.k])?)?;
    check_len("MXFP4 output", out.len(), numel(&[m, w.n])?)?;
    if let Some(b) = bias {
        check_len("MXFP4 bias", b.len(), w.n)?;
    }
    Ok(())
}

/// Where a kernel finds a tile's block.
#[derive(Clone, Copy)]
enum Source<'a> {
    /// Gathered from the stored layout for each use.
    Stored(&'a Mxfp4Weights<'a>),
    /// [`Mxfp4Packed::bytes`].
    Packed(&'a [u8]),
}

impl Source<'_> {
    /// Block `b` of tile `tile` (of `blocks` per tile): in the packed bytes, or gathered into
    /// `buf`.
    #[inline(always)]
    fn block<'s>(
        &'s self,
        tile: usize,
        b: usize,
        blocks: usize,
        buf: &'s mut [u8; TILE_BYTES],
    ) -> &'s [u8; TILE_BYTES] {
        match *self {
            Source::Packed(bytes) => bytes[(tile * blocks + b) * TILE_BYTES..][..TILE_BYTES]
                .try_into()
                .expect("a whole tile block"),
            Source::Stored(w) => {
                gather(w, tile, b, buf);
                buf
            }
        }
    }
}

/// Rows `rows` of columns `cols` into `outs` (one per row, `cols.len()` each), four rows at a
/// time, in passes of several tiles.
///
/// # Safety
/// `isa` must be available; the arguments checked; `cols` starting on a whole tile.
#[cfg(target_arch = "x86_64")]
unsafe fn columns(
    isa: Variant,
    source: Source,
    rows: &[QuantizedRow],
    cols: Range<usize>,
    bias: Option<&[f32]>,
    outs: &mut [&mut [f32]],
) {
    for (rows, outs) in rows.chunks(4).zip(outs.chunks_mut(4)) {
        let p = Pass {
            source,
            rows,
            cols: cols.clone(),
            bias,
            outs,
        };
        // SAFETY: the caller's contract.
        unsafe {
            match isa {
                Variant::Avx512Vnni => columns_avx512(p),
                Variant::Avx2 | Variant::AvxVnni => columns_avx2(p),
            }
        }
    }
}

/// One call's rows (at most four) over a column range.
struct Pass<'a, 'o, 'b> {
    source: Source<'a>,
    rows: &'a [QuantizedRow],
    cols: Range<usize>,
    bias: Option<&'a [f32]>,
    outs: &'o mut [&'b mut [f32]],
}

/// # Safety
/// AVX-512 F, BW and VNNI must be available; as for [`columns`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
unsafe fn columns_avx512(p: Pass) {
    // SAFETY: the features are enabled here for the inlined body.
    unsafe {
        let isa = Avx512::new();
        by_rows(&isa, p)
    }
}

/// # Safety
/// AVX2 and FMA must be available; as for [`columns`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn columns_avx2(p: Pass) {
    // SAFETY: the features are enabled here for the inlined body.
    unsafe {
        let isa = Avx2::new();
        by_rows(&isa, p)
    }
}

/// [`Pass`] with its row count as a constant.
///
/// # Safety
/// The CPU runs `I`; as for [`columns`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn by_rows<I: Tile>(isa: &I, p: Pass) {
    // SAFETY: the caller's contract, for each arm.
    unsafe {
        match p.rows.len() {
            1 => tiles::<I, 4, 1>(isa, p),
            2 => tiles::<I, 2, 2>(isa, p),
            3 => tiles::<I, 2, 3>(isa, p),
            _ => tiles::<I, 2, 4>(isa, p),
        }
    }
}

/// The pass's tiles, `T` at a time, then one at a time.
///
/// # Safety
/// As for [`by_rows`], with `p.rows.len() == R`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tiles<I: Tile, const T: usize, const R: usize>(isa: &I, mut p: Pass) {
    let tiles = p.cols.len().div_ceil(TILE_COLS);
    let first = p.cols.start / TILE_COLS;
    let wide = tiles / T * T;
    for t in (0..wide).step_by(T) {
        // SAFETY: the caller's contract; tiles `t..t + T` lie in the range.
        unsafe { tile::<I, T, R>(isa, &mut p, first + t, t * TILE_COLS) };
    }
    for t in wide..tiles {
        // SAFETY: as above.
        unsafe { tile::<I, 1, R>(isa, &mut p, first + t, t * TILE_COLS) };
    }
}

/// Tiles `tile0..tile0 + T` for the pass's `R` rows, into the outputs from `at` (each
/// tile's columns up to the range's end).
///
/// # Safety
/// As for [`tiles`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile<I: Tile, const T: usize, const R: usize>(
    isa: &I,
    p: &mut Pass,
    tile0: usize,
    at: usize,
) {
    let k = p.rows[0].natural().len();
    let blocks = k / BLOCK;
    let mut bufs = [[0u8; TILE_BYTES]; T];
    // SAFETY: the CPU runs `I` (the caller's contract), for every `I` method below.
    let mut y = [[unsafe { isa.zero_out() }; T]; R];
    for b in 0..blocks {
        let mut blocks_here: [&[u8; TILE_BYTES]; T] = [&[0; TILE_BYTES]; T];
        for (t, (buf, here)) in bufs.iter_mut().zip(blocks_here.iter_mut()).enumerate() {
            *here = p.source.block(tile0 + t, b, blocks, buf);
        }
        let mut acc = [[unsafe { isa.zero() }; T]; R];
        // Four groups (16 inputs) at a time: see `Tile::dot4`.
        for g in (0..BLOCK / 4).step_by(4) {
            let mut x = [[0i32; 4]; R];
            for (x, row) in x.iter_mut().zip(p.rows) {
                let q = &row.natural()[b * BLOCK + 4 * g..][..16];
                *x = std::array::from_fn(|i| {
                    i32::from_le_bytes(std::array::from_fn(|j| q[4 * i + j] as u8))
                });
            }
            for (t, block) in blocks_here.iter().enumerate() {
                // A loop, not `array::from_fn`: its closure would not be compiled with the
                // kernel's vector features (each intrinsic an out-of-line call).
                let group = |i: usize| &block[(g + i) * GROUP_BYTES..][..GROUP_BYTES];
                let mut w = [unsafe { isa.codes(group(0)) }; 4];
                for (i, w) in w.iter_mut().enumerate().skip(1) {
                    *w = unsafe { isa.codes(group(i)) };
                }
                for (acc, &x) in acc.iter_mut().zip(&x) {
                    acc[t] = unsafe { isa.dot4(acc[t], w, x) };
                }
            }
        }
        for (t, block) in blocks_here.iter().enumerate() {
            let s = unsafe { isa.scales(&block[TILE_BYTES - TILE_COLS..]) };
            for ((y, acc), row) in y.iter_mut().zip(&acc).zip(p.rows) {
                let offset = OFFSET * row.sums()[b];
                y[t] = unsafe { isa.block(y[t], acc[t], offset, s, row.scales()[b]) };
            }
        }
    }
    let end = p.cols.len();
    for (y, out) in y.iter().zip(p.outs.iter_mut()) {
        for (t, &y) in y.iter().enumerate() {
            let from = at + t * TILE_COLS;
            let mut lanes = [0f32; TILE_COLS];
            unsafe { isa.store(y, &mut lanes) };
            let out = &mut out[from..end.min(from + TILE_COLS)];
            let col0 = p.cols.start + from;
            match p.bias {
                Some(bias) => {
                    for ((o, &v), &b) in out.iter_mut().zip(&lanes).zip(&bias[col0..]) {
                        *o = v + b;
                    }
                }
                None => out.copy_from_slice(&lanes[..out.len()]),
            }
        }
    }
}

// A block's groups go four at a time through `Tile::dot4`.
const _: () = assert!((BLOCK / 4).is_multiple_of(4));

/// One vector width's operations on a tile of 16 columns.
#[cfg(target_arch = "x86_64")]
pub(super) trait Tile {
    /// A group's unsigned weights (`v + 12`).
    type Codes: Copy;
    /// A block's integer sums for one row.
    type Acc: Copy;
    /// A row's f32 results.
    type Out: Copy;
    /// The block's `s` per column.
    type Scale: Copy;
    unsafe fn zero(&self) -> Self::Acc;
    unsafe fn zero_out(&self) -> Self::Out;
    /// The 32 bytes of a group.
    unsafe fn codes(&self, group: &[u8]) -> Self::Codes;
    /// `acc + Σ` over each lane's four inputs of weight times `x`'s bytes.
    unsafe fn dot(&self, acc: Self::Acc, w: Self::Codes, x: i32) -> Self::Acc;
    /// [`Tile::dot`] of four consecutive groups, `w[i]` against `x[i]`: the same sums (exact
    /// integers in any order), which a vector width may add up more cheaply.
    #[inline(always)]
    unsafe fn dot4(&self, acc: Self::Acc, w: [Self::Codes; 4], x: [i32; 4]) -> Self::Acc {
        let mut acc = acc;
        for (w, x) in w.into_iter().zip(x) {
            acc = unsafe { self.dot(acc, w, x) };
        }
        acc
    }
    /// `2^(e - 128)` of the 16 scale bytes.
    unsafe fn scales(&self, bytes: &[u8]) -> Self::Scale;
    /// `fma(s · scale_a, (acc - offset) as f32, y)`.
    unsafe fn block(
        &self,
        y: Self::Out,
        acc: Self::Acc,
        offset: i32,
        s: Self::Scale,
        scale_a: f32,
    ) -> Self::Out;
    unsafe fn store(&self, y: Self::Out, out: &mut [f32; TILE_COLS]);
}

/// `e8m0(e) · 0.5` for each 32-bit lane's `e`, as bits: `e << 23` is `2^(e - 127)` but for 0
/// (the subnormal `2^-127`) and 255 (NaN).
#[cfg(target_arch = "x86_64")]
pub(super) const E8M0_ZERO: i32 = 0x0040_0000;
#[cfg(target_arch = "x86_64")]
pub(super) const E8M0_NAN: i32 = 0x7FC0_0000;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mxfp4::matmul_mxfp4;
    use crate::rng::Rng;

    /// Codes of every value; scales 2^-8 ..= 2^0, but columns 0-3 (where there are six or
    /// more) take only the edge bytes 0, 1, 254 and 255 (NaN).
    fn matrix(n: usize, k: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
        let mut rng = Rng::new(seed);
        let codes = rng.bytes(k * n / 2);
        let blocks = k / BLOCK;
        let scales = (0..n * blocks)
            .map(|i| match i / blocks {
                col @ 0..4 if n >= 6 => [0, 1, 254, 255][col],
                _ => 119 + rng.below(9) as u8,
            })
            .collect();
        (codes, scales)
    }

    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut rng = Rng::new(seed);
        (0..len)
            .map(|i| {
                // A block of zeros now and then (scale 0).
                if (i / BLOCK) % 7 == 3 {
                    0.0
                } else {
                    rng.uniform()
                }
            })
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn the_unsigned_table_is_twice_e2m1_plus_the_offset() {
        assert_eq!(
            UNSIGNED,
            [12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0]
        );
        assert_eq!(TILE_BYTES, 272);
    }

    #[test]
    fn close_to_the_f32_kernel() {
        let (n, k, m) = (48, 256, 3);
        let (codes, scales) = matrix(n, k, 3);
        let scales: Vec<u8> = scales.iter().map(|&s| s.clamp(119, 127)).collect();
        // (The edge columns' scales clamped too.)
        let w = Mxfp4Weights {
            n,
            k,
            codes: &codes,
            scales: &scales,
        };
        let a = values(m * k, 4);
        let pool = ThreadPool::new(1);
        let (mut exact, mut int8) = (vec![0f32; m * n], vec![0f32; m * n]);
        matmul_mxfp4(&a, m, &w, None, &mut exact, &pool).unwrap();
        matmul_mxfp4_int8(&a, m, &w, None, None, &mut int8, &pool).unwrap();
        let norm = exact.iter().fold(0f32, |s, v| s.max(v.abs()));
        for (i, (e, q)) in exact.iter().zip(&int8).enumerate() {
            assert!((e - q).abs() <= 0.02 * norm, "{i}: {e} vs {q} (max {norm})");
        }
    }

    #[test]
    fn every_kernel_stored_or_packed_gives_the_reference_bits() {
        // Widths with a short last tile, rows past one pass of four, biases or none.
        for (n, k, m) in [
            (64, 64, 1),
            (38, 32, 5),
            (130, 128, 2),
            (6, 32, 1),
            (96, 96, 9),
        ] {
            let (codes, scales) = matrix(n, k, n as u64 * 31 + k as u64);
            let w = Mxfp4Weights {
                n,
                k,
                codes: &codes,
                scales: &scales,
            };
            let packed = Mxfp4Packed::pack(&w).unwrap();
            let a = values(m * k, k as u64);
            let bias = values(n, 5);
            let bias = (m % 2 == 1).then_some(&bias[..]);
            let mut want = vec![0f32; m * n];
            matmul_mxfp4_int8_reference(&a, m, &w, bias, &mut want, &ThreadPool::new(1)).unwrap();
            for &isa in Variant::available() {
                for threads in [1, 3] {
                    let pool = ThreadPool::new(threads);
                    for p in [None, Some(&packed)] {
                        let mut got = vec![f32::NAN; m * n];
                        matmul_mxfp4_int8_variant(&a, m, (&w, p), bias, &mut got, &pool, isa)
                            .unwrap();
                        let what = format!(
                            "{n}x{k}, {m} rows, {isa:?}, {threads} threads, packed {}",
                            p.is_some()
                        );
                        assert_eq!(bits(&got), bits(&want), "{what}");
                    }
                }
                // Each row alone.
                for i in 0..m {
                    let mut one = vec![0f32; n];
                    let a = &a[i * k..][..k];
                    let pool = ThreadPool::new(2);
                    matmul_mxfp4_int8_variant(
                        a,
                        1,
                        (&w, Some(&packed)),
                        bias,
                        &mut one,
                        &pool,
                        isa,
                    )
                    .unwrap();
                    assert_eq!(bits(&one), bits(&want[i * n..][..n]), "{n}x{k} row {i}");
                }
            }
        }
    }

    /// The largest integer sums: every weight +6 (unsigned code 24) against activations that
    /// all quantize to +127, or all to -127, so each lane's four groups reach 4 · 2 · 24 · 127
    /// = 24384, which the AVX2 tile adds in i16 lanes.
    #[test]
    fn the_largest_sums_give_the_reference_bits() {
        let (n, k, m) = (32, 128, 2);
        let codes = vec![0x77u8; k * n / 2];
        let scales = vec![127u8; n * (k / BLOCK)];
        let w = Mxfp4Weights {
            n,
            k,
            codes: &codes,
            scales: &scales,
        };
        let packed = Mxfp4Packed::pack(&w).unwrap();
        for sign in [1.0f32, -1.0] {
            let a = vec![sign; m * k];
            let mut want = vec![0f32; m * n];
            matmul_mxfp4_int8_reference(&a, m, &w, None, &mut want, &ThreadPool::new(1)).unwrap();
            assert!(want.iter().all(|&v| v * sign > 0.0), "{want:?}");
            for &isa in Variant::available() {
                for p in [None, Some(&packed)] {
                    let mut got = vec![f32::NAN; m * n];
                    let pool = ThreadPool::new(2);
                    matmul_mxfp4_int8_variant(&a, m, (&w, p), None, &mut got, &pool, isa).unwrap();
                    assert_eq!(bits(&got), bits(&want), "{isa:?} sign {sign}");
                }
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 32,
            failure_persistence: None,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// Any shape the layout allows (an even width, whole blocks), not only the ones
        /// above: every variant here, stored or packed, gives the reference's bits.
        #[test]
        fn any_shape_gives_the_reference_bits(
            half_n in 1usize..80,
            blocks in 1usize..9,
            m in 1usize..10,
            with_bias in proptest::bool::ANY,
            seed in proptest::num::u64::ANY,
        ) {
            let (n, k) = (2 * half_n, blocks * BLOCK);
            let (codes, scales) = matrix(n, k, seed);
            let w = Mxfp4Weights {
                n,
                k,
                codes: &codes,
                scales: &scales,
            };
            let packed = Mxfp4Packed::pack(&w).unwrap();
            let a = values(m * k, seed ^ 1);
            let bias = values(n, seed ^ 2);
            let bias = with_bias.then_some(&bias[..]);
            let pool = ThreadPool::new(2);
            let mut want = vec![0f32; m * n];
            matmul_mxfp4_int8_reference(&a, m, &w, bias, &mut want, &pool).unwrap();
            for &variant in Variant::available() {
                for p in [None, Some(&packed)] {
                    let mut got = vec![f32::NAN; m * n];
                    matmul_mxfp4_int8_variant(&a, m, (&w, p), bias, &mut got, &pool, variant)
                        .unwrap();
                    proptest::prop_assert_eq!(bits(&got), bits(&want));
                }
            }
        }
    }

    #[test]
    fn a_packed_matrix_of_other_dims_is_an_error() {
        let (codes, scales) = matrix(32, 64, 1);
        let w = Mxfp4Weights {
            n: 32,
            k: 64,
            codes: &codes,
            scales: &scales,
        };
        let other = Mxfp4Weights { n: 64, k: 32, ..w };
        let packed = Mxfp4Packed::pack(&other).unwrap();
        let mut out = vec![0f32; 32];
        let pool = ThreadPool::new(1);
        let r = matmul_mxfp4_int8(&[0.0; 64], 1, &w, Some(&packed), None, &mut out, &pool);
        if !Variant::available().is_empty() {
            assert!(r.is_err());
        }
    }
}
