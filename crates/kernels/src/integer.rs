//! The integer arithmetic of onnxruntime's dynamic int8 exports (`quantize_dynamic`):
//! activations quantized to uint8 per tensor ([`dynamic_quantize`], ONNX
//! `DynamicQuantizeLinear`), then `MatMulInteger`'s exact int32 products
//! ([`matmul_integer`]). Both are exact in their types (the products and sums are integers;
//! the quantization's scale and rounding are onnxruntime's, in f32), so every path and thread
//! count gives the same bits.

use crate::ThreadPool;
#[cfg(target_arch = "x86_64")]
use crate::cpu;
#[cfg(target_arch = "x86_64")]
use crate::simd::F32Lanes;
use std::ops::Range;

use crate::error::{KernelError, check_len};
use crate::par::{Grid, par_chunks, par_row_blocks_spans, parts_for};
use crate::pool::Prelude;

/// `x` quantized to uint8 as ONNX's `DynamicQuantizeLinear` (and onnxruntime) does: the range
/// `[min(0, min x), max(0, max x)]` over 255 steps (`scale` 1 when the range is empty), the
/// zero point `round(0 - min / scale)` clamped to `0..=255`, each code
/// `clamp(round(x / scale) + zero_point)`, rounding half to even. Returns `(scale,
/// zero_point)`; a NaN in `x` gives NaN arithmetic as onnxruntime's would, clamped codes.
pub fn dynamic_quantize(x: &[f32], codes: &mut [u8]) -> Result<(f32, u8), KernelError> {
    check_len("codes", codes.len(), x.len())?;
    #[cfg(target_arch = "x86_64")]
    if cpu::level() >= cpu::Level::Avx512 {
        // SAFETY: AVX-512 F is available (checked above).
        return Ok(unsafe { quantize_avx512(x, codes) });
    }
    #[cfg(target_arch = "x86_64")]
    if cpu::level() >= cpu::Level::Avx2 {
        // SAFETY: AVX2 is available (checked above).
        return Ok(unsafe { quantize_avx2(x, codes) });
    }
    Ok(quantize(x, codes))
}

/// [`quantize`] for AVX-512: the range in 16 lanes, the codes as the compiler vectorizes them.
///
/// # Safety
/// AVX-512 F must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn quantize_avx512(x: &[f32], codes: &mut [u8]) -> (f32, u8) {
    // SAFETY: AVX-512 F is enabled here.
    finish(x, codes, unsafe {
        range_lanes::<std::arch::x86_64::__m512>(x)
    })
}

/// [`quantize`] for AVX2: the range in 8 lanes, the codes as the compiler vectorizes them.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_avx2(x: &[f32], codes: &mut [u8]) -> (f32, u8) {
    // SAFETY: AVX2 is enabled here.
    finish(x, codes, unsafe {
        range_lanes::<std::arch::x86_64::__m256>(x)
    })
}

/// `x`'s range with 0 in it, by `vminps`/`vmaxps` over vectors of `V` with the accumulator
/// second (a NaN value gives it back, as `f32::min` ignores a NaN), then [`fold_range`].
///
/// # Safety
/// The CPU runs `V`'s instructions.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn range_lanes<V: F32Lanes>(x: &[f32]) -> (f32, f32) {
    let chunks = x.chunks_exact(V::LANES);
    let rest = chunks.remainder();
    // SAFETY: the caller's contract; each chunk holds one vector, each array at least one.
    unsafe {
        let (mut lo, mut hi) = (V::zero(), V::zero());
        for chunk in chunks {
            let v = V::load(chunk.as_ptr());
            (lo, hi) = (v.min(lo), v.max(hi));
        }
        let (mut l, mut h) = ([0f32; 16], [0f32; 16]);
        lo.store(l.as_mut_ptr());
        hi.store(h.as_mut_ptr());
        fold_range((&l[..V::LANES], &h[..V::LANES]), rest)
    }
}

/// [`dynamic_quantize`]'s arithmetic: the range in lanes (min and max do not depend on the
/// order; `f32::min` and `max` ignore a NaN), then the codes.
#[inline(always)]
fn quantize(x: &[f32], codes: &mut [u8]) -> (f32, u8) {
    finish(x, codes, fold_range((&[], &[]), x))
}

/// The range of lanes' minima and maxima (`lanes`) and the values `rest`, with 0 in it.
#[inline(always)]
fn fold_range((lo, hi): (&[f32], &[f32]), rest: &[f32]) -> (f32, f32) {
    (lo.iter().zip(hi))
        .chain(rest.iter().zip(rest))
        .fold((0f32, 0f32), |(lo, hi), (&l, &h)| (lo.min(l), hi.max(h)))
}

/// The scale and zero point of the range `(lo, hi)`, and the codes of `x`, written for the
/// compiler to vectorize (each code converted without a range check).
#[inline(always)]
fn finish(x: &[f32], codes: &mut [u8], (lo, hi): (f32, f32)) -> (f32, u8) {
    let scale = if hi == lo { 1.0 } else { (hi - lo) / 255.0 };
    let zero = round_even((0.0 - lo / scale).clamp(0.0, 255.0));
    for (c, &v) in codes.iter_mut().zip(x) {
        // A whole number in 0..=255: `max` turns a NaN into 0, as a cast would (`clamp` keeps
        // it).
        #[allow(clippy::manual_clamp)]
        let code = (round_even((v / scale).clamp(-512.0, 512.0)) + zero)
            .max(0.0)
            .min(255.0);
        // SAFETY: `code` is finite and within u8's range (above), so within i32's.
        *c = unsafe { code.to_int_unchecked::<i32>() } as u8;
    }
    (scale, zero as u8)
}

/// `exact[j] = values[j] - zb[j]·sum - za·col_sums[j] + kz·zb[j]` (wrapping): a tile's
/// raw products with the zero points folded out (`sum` the row's sum of A, `kz` = `k · za`).
#[inline(always)]
fn zero_points(
    values: &[i32],
    (b_zero, col_sums): (&[i32], &[i32]),
    (sum, za, kz): (i32, i32, i32),
    exact: &mut [i32],
) {
    let columns = b_zero.iter().zip(col_sums);
    for ((e, &v), (&zb, &sb)) in exact.iter_mut().zip(values).zip(columns) {
        *e = v
            .wrapping_sub(zb.wrapping_mul(sum))
            .wrapping_sub(za.wrapping_mul(sb))
            .wrapping_add(kz.wrapping_mul(zb));
    }
}

/// [`zero_points`] compiled for AVX2 (the tile kernels' store closure is compiled without
/// it, where a 32-bit product takes five SSE2 instructions).
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn zero_points_avx2(
    values: &[i32],
    columns: (&[i32], &[i32]),
    row: (i32, i32, i32),
    exact: &mut [i32],
) {
    zero_points(values, columns, row, exact);
}

/// `out[j] = float(values[j]) · scales[j] (+ bias[j])`, the conversion, product and sum each
/// rounded on its own (no fused multiply-add), so any width gives the same bits: the float
/// epilogue of an int8 product (`Cast`, the scales' `Mul`, the bias `Add`).
pub fn scale_to_float(values: &[i32], scales: &[f32], bias: Option<&[f32]>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if cpu::level() >= cpu::Level::Avx2 {
        // SAFETY: AVX2 is available (checked above).
        return unsafe { scale_to_float_avx2(values, scales, bias, out) };
    }
    scale_to_float_loop(values, scales, bias, out);
}

#[inline(always)]
fn scale_to_float_loop(values: &[i32], scales: &[f32], bias: Option<&[f32]>, out: &mut [f32]) {
    let outputs = out.iter_mut().zip(values).zip(scales);
    match bias {
        Some(bias) => (outputs.zip(bias)).for_each(|(((y, &v), &s), &b)| *y = v as f32 * s + b),
        None => outputs.for_each(|((y, &v), &s)| *y = v as f32 * s),
    }
}

/// [`scale_to_float_loop`] compiled for AVX2.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scale_to_float_avx2(
    values: &[i32],
    scales: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    scale_to_float_loop(values, scales, bias, out);
}

/// The lengths a product's `a` (of `a_len` values), zero points and output (of `out_len`)
/// must have.
fn check_operands(
    a_len: usize,
    a_zero: &[i32],
    b_zero: &[i32],
    out_len: usize,
    (m, k, n): (usize, usize, usize),
) -> Result<(), KernelError> {
    check_len("A", a_len, m * k)?;
    check_len("output", out_len, m * n)?;
    check_len("B's zero points", b_zero.len(), n)?;
    if a_zero.len() != 1 {
        check_len("A's zero points", a_zero.len(), m)?;
    }
    Ok(())
}

/// `x` rounded to the nearest integer, ties to even, for `|x| <= 2^22` (callers clamp: the
/// quotients here are within ±255, and past ±512 every code saturates anyway), by adding and
/// subtracting 1.5·2^23, which rounds in the default mode; branch-free, so the loop
/// vectorizes without a call into libm per element. NaN stays NaN.
#[inline(always)]
fn round_even(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

/// `out (m × n) = (a - a_zero) (m × k) · (b - b_zero) (k × n)` in int32, for (u)int8
/// operands as stored: `a_zero` one value or one per row of `a`, `b_zero` one per column of
/// `b` (a per-tensor zero point repeated). Sums wrap on overflow (possible only past
/// `k = 33025`), as onnxruntime's int32 accumulators do. Rows are split over the pool.
pub fn matmul_integer<A: Copy + Into<i32> + Sync, B: Copy + Into<i32> + Sync>(
    a: &[A],
    a_zero: &[i32],
    b: &[B],
    b_zero: &[i32],
    out: &mut [i32],
    (m, k, n): (usize, usize, usize),
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    check_len("B", b.len(), k * n)?;
    check_operands(a.len(), a_zero, b_zero, out.len(), (m, k, n))?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let parts = parts_for(pool, m, k * n);
    let rows = m.div_ceil(parts);
    par_chunks(pool, out, rows * n, |first, part| {
        for (r, row) in part.chunks_exact_mut(n).enumerate() {
            let i = first / n + r;
            let za = a_zero[if a_zero.len() == 1 { 0 } else { i }];
            let a_row = &a[i * k..(i + 1) * k];
            #[cfg(target_arch = "x86_64")]
            if cpu::level() >= cpu::Level::Avx512 && cpu::features().avx512bw {
                // SAFETY: AVX-512 F and BW are available (checked above).
                unsafe { row_avx512(a_row, za, b, b_zero, row) };
                continue;
            }
            #[cfg(target_arch = "x86_64")]
            if cpu::level() >= cpu::Level::Avx2 {
                // SAFETY: AVX2 is available (checked above).
                unsafe { row_avx2(a_row, za, b, b_zero, row) };
                continue;
            }
            product_row(a_row, za, b, b_zero, row);
        }
    });
    Ok(())
}

/// An int8 `b` (`k × n`) laid out for [`matmul_integer_packed`]: tile `t` of 64 columns, group
/// `g` of four rows, holds 64 columns of four bytes
/// (`data[((t * groups + g) * 64 + c) * 4 + r] = b[4g + r, 64t + c]`, zero past `k` and `n`:
/// `vpdpbusd`'s four bytes per lane), with `b`'s column sums for the zero-point correction.
#[derive(Debug, Clone)]
pub struct PackedI8 {
    k: usize,
    n: usize,
    data: Vec<i8>,
    col_sums: Vec<i32>,
}

impl PackedI8 {
    /// `b` (row-major `k × n`) in tiles.
    pub fn pack(b: &[i8], k: usize, n: usize) -> Result<PackedI8, KernelError> {
        check_len("B", b.len(), k * n)?;
        let groups = k.div_ceil(4);
        let mut data = vec![0i8; n.div_ceil(TILE) * groups * TILE * 4];
        let mut col_sums = vec![0i32; n];
        for kk in 0..k {
            let (g, r) = (kk / 4, kk % 4);
            for (j, &w) in b[kk * n..(kk + 1) * n].iter().enumerate() {
                let (t, c) = (j / TILE, j % TILE);
                data[((t * groups + g) * TILE + c) * 4 + r] = w;
                col_sums[j] = col_sums[j].wrapping_add(i32::from(w));
            }
        }
        Ok(PackedI8 {
            k,
            n,
            data,
            col_sums,
        })
    }

    /// `(k, n)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.k, self.n)
    }

    /// Whether this CPU runs a packed kernel: AVX-512 with VNNI (four byte products a lane),
    /// else AVX2 (pairs of 16-bit products a lane).
    pub fn available() -> bool {
        cfg!(target_arch = "x86_64") && cpu::level() >= cpu::Level::Avx2
    }
}

/// Whether the packed product runs on AVX-512 VNNI (else on AVX2).
#[cfg(target_arch = "x86_64")]
fn vnni() -> bool {
    cpu::level() >= cpu::Level::Avx512 && cpu::features().avx512vnni
}

/// The last group of each of `a`'s rows (of `k`) when `k` is not a multiple of 4,
/// zero-padded.
fn tail_quads(a: &[u8], k: usize) -> [i32; CHUNK] {
    let mut tail = [0i32; CHUNK];
    if !k.is_multiple_of(4) {
        for (q, row) in tail.iter_mut().zip(a.chunks_exact(k)) {
            let mut bytes = [0u8; 4];
            bytes[..k % 4].copy_from_slice(&row[k / 4 * 4..]);
            *q = i32::from_le_bytes(bytes);
        }
    }
    tail
}

/// [`matmul_integer`] for uint8 `a` against a [`PackedI8`] `b` (onnxruntime's dynamic int8
/// exports' form) with AVX-512 VNNI or AVX2 ([`packed_product`]). Call only where
/// [`PackedI8::available`].
pub fn matmul_integer_packed(
    a: &[u8],
    a_zero: &[i32],
    b: &PackedI8,
    b_zero: &[i32],
    out: &mut [i32],
    m: usize,
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    packed_product(a, (a_zero, b_zero), b, out, m, pool, &|_, _, v, o| {
        o.copy_from_slice(v)
    })
}

/// `epilogue(i, j, values, outs)` with `values[c] = Σ_k (a[i, k] - za) · (b[k, j + c] - zb[j +
/// c])` and `outs` the outputs `out[i, j..]` they make (up to a tile's width at a time), for
/// uint8 `a` (`m × k`) against a [`PackedI8`] `b`: `Σ a·b` in 16-column lanes with AVX-512
/// VNNI (tasks of up to 32 rows take turns, four rows at a time, over each block of 256 of
/// `b`'s rows while it is in L1), else in 16-bit pair products with AVX2 ([`tiles_avx2`]), the
/// zero points folded in after (`Σ (a - za)(b - zb) = Σ ab - zb Σa - za Σb +
/// k·za·zb`, exact in wrapping i32 arithmetic, so the same integers as the loop of
/// [`matmul_integer`] whatever the blocking).
pub fn packed_product<T: Send>(
    a: &[u8],
    (a_zero, b_zero): (&[i32], &[i32]),
    b: &PackedI8,
    out: &mut [T],
    m: usize,
    pool: &ThreadPool,
    epilogue: &(impl Fn(usize, usize, &[i32], &mut [T]) + Sync),
) -> Result<(), KernelError> {
    let (k, n) = (b.k, b.n);
    check_operands(a.len(), a_zero, b_zero, out.len(), (m, k, n))?;
    if !PackedI8::available() {
        return Err(KernelError::Shape(
            "the packed int8 product needs AVX2; check PackedI8::available".into(),
        ));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let rows_per_task = m.min(CHUNK);
    let row_blocks = m.div_ceil(rows_per_task);
    let col_parts = parts_for(pool, m * n.div_ceil(TILE), k * TILE).div_ceil(row_blocks);
    let kz = |za: i32| (k as i32).wrapping_mul(za);
    let task = |first: usize, _: usize, cols: Range<usize>, outs: &mut [&mut [T]]| {
        let rows = outs.len();
        let a = &a[first * k..][..rows * k];
        let mut sums = [0i32; CHUNK];
        // (With `k` 0 there are no rows' bytes, and every sum stays 0.)
        for (s, row) in sums.iter_mut().zip(a.chunks_exact(k.max(1))) {
            *s = row.iter().map(|&x| i32::from(x)).sum();
        }
        let start = cols.start;
        let mut exact = [0i32; TILE];
        let mut store = |r: usize, j: usize, values: &[i32]| {
            let i = first + r;
            let za = a_zero[if a_zero.len() == 1 { 0 } else { i }];
            let (sum, kz) = (sums[r], kz(za));
            let exact = &mut exact[..values.len()];
            let columns = (&b_zero[j..], &b.col_sums[j..]);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX2 is available (the packed product needs it, checked above).
            unsafe {
                zero_points_avx2(values, columns, (sum, za, kz), exact)
            };
            #[cfg(not(target_arch = "x86_64"))]
            zero_points(values, columns, (sum, za, kz), exact);
            epilogue(i, j, exact, &mut outs[r][j - start..][..values.len()]);
        };
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512 F, BW and VNNI, else AVX2, are available (checked above and by
        // `vnni`); `a` holds `rows` rows of `k` and `cols` starts on a tile and ends by `n`.
        unsafe {
            match vnni() {
                true => tiles_vnni(a, rows, b, cols, &mut store),
                false => tiles_avx2(a, rows, b, cols, &mut store),
            }
        };
    };
    let grid = Grid {
        tile: TILE,
        rows_per_task,
        col_parts,
    };
    #[allow(clippy::single_range_in_vec_init)]
    let spans = [0..n];
    par_row_blocks_spans(pool, Prelude::NONE, &mut [out], &spans, grid, task);
    Ok(())
}

/// Columns a VNNI tile holds: four 16-lane vectors, four independent `vpdpbusd` chains.
const TILE: usize = 64;
/// Rows a pass takes: each group's four bytes of a row broadcast once, against the tile's
/// four vectors.
const ROWS: usize = 4;
/// The most rows a task takes; its row groups' accumulators wait on the stack between blocks.
const CHUNK: usize = crate::par::MAX_TASK_ROWS;
/// Groups of four inputs a block holds (64 groups of a tile: 16 KiB).
const K_BLOCK: usize = 64;

/// `store(r, j0, Σ_k a[r, k] · b[k, j0..])` for each of `rows` rows (at most [`CHUNK`]) and
/// each tile of `cols`, up to a tile's width at a time (without the zero points).
///
/// # Safety
/// AVX-512 F, BW and VNNI must be available; `a` holds `rows` rows of `b`'s `k`; `cols`
/// starts on a tile and ends by `b`'s `n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tiles_vnni(
    a: &[u8],
    rows: usize,
    b: &PackedI8,
    cols: Range<usize>,
    store: &mut impl FnMut(usize, usize, &[i32]),
) {
    use std::arch::x86_64::*;
    let (k, groups, full) = (b.k, b.k.div_ceil(4), b.k / 4);
    let tail = tail_quads(a, k);
    let row_groups = rows.div_ceil(ROWS);
    let mut lanes = [0i32; TILE];
    for t in cols.start / TILE..cols.end.div_ceil(TILE) {
        let tile = b.data[t * groups * TILE * 4..].as_ptr();
        let mut accs = [[[_mm512_setzero_si512(); 4]; ROWS]; CHUNK / ROWS];
        for g0 in (0..groups).step_by(K_BLOCK) {
            let block = g0..(g0 + K_BLOCK).min(groups);
            let whole = block.start..block.end.min(full);
            for (rg, acc) in accs[..row_groups].iter_mut().enumerate() {
                let here = (rows - rg * ROWS).min(ROWS);
                let a = a[rg * ROWS * k..].as_ptr();
                // SAFETY: rows `rg * ROWS..` of `a` hold `here` rows of `k` bytes, so each
                // whole group's four bytes; the tile holds `groups` groups.
                let quad = |r: usize, g: usize| unsafe {
                    a.add(r * k + 4 * g).cast::<i32>().read_unaligned()
                };
                let tail = |r: usize, _: usize| tail[rg * ROWS + r];
                // SAFETY: as above.
                unsafe {
                    match here {
                        1 => pass::<1>(tile, whole.clone(), acc, quad),
                        2 => pass::<2>(tile, whole.clone(), acc, quad),
                        3 => pass::<3>(tile, whole.clone(), acc, quad),
                        _ => pass::<4>(tile, whole.clone(), acc, quad),
                    }
                    if block.end > full {
                        pass::<ROWS>(tile, full..groups, acc, tail);
                    }
                }
            }
        }
        let j0 = t * TILE;
        let width = (j0 + TILE).min(cols.end) - j0;
        for (r, acc) in accs[..row_groups].iter().flatten().take(rows).enumerate() {
            for (v, acc) in acc.iter().enumerate() {
                // SAFETY: `lanes` holds 64 i32.
                unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().add(v * 16).cast(), *acc) };
            }
            store(r, j0, &lanes[..width]);
        }
    }
}

/// Groups `groups` of one tile for `R` rows, added to `accs`' first `R` rows: per group, the
/// tile's four vectors loaded once and each row's four bytes (`quad(r, g)`) broadcast against
/// them.
///
/// # Safety
/// AVX-512 F, BW and VNNI must be available; `tile` holds the groups.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pass<const R: usize>(
    tile: *const i8,
    groups: Range<usize>,
    accs: &mut [[std::arch::x86_64::__m512i; 4]; ROWS],
    quad: impl Fn(usize, usize) -> i32,
) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract.
    unsafe {
        let mut acc = [[_mm512_setzero_si512(); 4]; R];
        acc.copy_from_slice(&accs[..R]);
        for g in groups {
            let base = tile.add(g * TILE * 4);
            let w: [__m512i; 4] =
                std::array::from_fn(|v| _mm512_loadu_si512(base.add(v * 64).cast()));
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_epi32(quad(r, g));
                for (acc, &w) in acc.iter_mut().zip(&w) {
                    *acc = _mm512_dpbusd_epi32(*acc, x, w);
                }
            }
        }
        accs[..R].copy_from_slice(&acc);
    }
}

/// [`tiles_vnni`] on AVX2, from the same packed tiles: each group's four bytes of 16 columns
/// widened to 16-bit, each row's four bytes widened and repeated, `vpmaddwd` adding the
/// products in pairs (exact: a uint8 times an int8 and the sum of two fit) into two lanes per
/// column, which are added when the column is done. Rows go two at a time (16 registers),
/// over a tile's columns 16 at a time and all of `k` (a 16-column slice of the tile, at most
/// `k` bytes × 16, stays in L1 between the row pairs).
///
/// # Safety
/// AVX2 must be available; as [`tiles_vnni`] for the rest.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tiles_avx2(
    a: &[u8],
    rows: usize,
    b: &PackedI8,
    cols: Range<usize>,
    store: &mut impl FnMut(usize, usize, &[i32]),
) {
    let (k, groups, full) = (b.k, b.k.div_ceil(4), b.k / 4);
    let tail = tail_quads(a, k);
    let mut sums = [[0i32; TILE]; 2];
    for t in cols.start / TILE..cols.end.div_ceil(TILE) {
        let tile = b.data[t * groups * TILE * 4..].as_ptr();
        let (j0, width) = (t * TILE, (t * TILE + TILE).min(cols.end) - t * TILE);
        for r0 in (0..rows).step_by(2) {
            let here = (rows - r0).min(2);
            let a = a[r0 * k..].as_ptr();
            // SAFETY: rows `r0..r0 + here` of `a` hold `k` bytes each, so each whole group's
            // four; the tile holds `groups` groups.
            let quad = |r: usize, g: usize| match g < full {
                true => unsafe { a.add(r * k + 4 * g).cast::<i32>().read_unaligned() },
                false => tail[r0 + r],
            };
            for part in 0..TILE / 16 {
                // SAFETY: as above.
                unsafe {
                    let slice = tile.add(part * 64);
                    match here {
                        1 => pairs_avx2::<1>(slice, groups, &quad, &mut sums, part),
                        _ => pairs_avx2::<2>(slice, groups, &quad, &mut sums, part),
                    }
                }
            }
            for (r, sums) in sums[..here].iter().enumerate() {
                store(r0 + r, j0, &sums[..width]);
            }
        }
    }
}

/// Columns `16 part..16 part + 16` of a tile (`slice` is where they start in group 0) for
/// `R` rows over all `groups`: their sums into `sums[r][16 part..]`.
///
/// # Safety
/// AVX2 must be available; `slice` holds 64 bytes at each group's stride of 256.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pairs_avx2<const R: usize>(
    slice: *const i8,
    groups: usize,
    quad: &impl Fn(usize, usize) -> i32,
    sums: &mut [[i32; TILE]; 2],
    part: usize,
) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract.
    unsafe {
        let mut acc = [[_mm256_setzero_si256(); 4]; R];
        for g in 0..groups {
            let base = slice.add(g * TILE * 4);
            let w: [__m256i; 4] = std::array::from_fn(|v| {
                _mm256_cvtepi8_epi16(_mm_loadu_si128(base.add(v * 16).cast()))
            });
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm_cvtepu8_epi16(_mm_cvtsi32_si128(quad(r, g)));
                let x = _mm256_broadcastq_epi64(x);
                for (acc, &w) in acc.iter_mut().zip(&w) {
                    *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(w, x));
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let mut lanes = [0i32; 32];
            for (v, acc) in acc.iter().enumerate() {
                _mm256_storeu_si256(lanes.as_mut_ptr().add(v * 8).cast(), *acc);
            }
            for (s, pair) in sums[r][part * 16..][..16]
                .iter_mut()
                .zip(lanes.chunks_exact(2))
            {
                *s = pair[0].wrapping_add(pair[1]);
            }
        }
    }
}

/// One output row: `row[j] = Σ_k (a_row[k] - za) · (b[k, j] - b_zero[j])`, an integer loop
/// the compiler vectorizes over `j` for whatever the calling function enables.
#[inline(always)]
fn product_row<A: Copy + Into<i32>, B: Copy + Into<i32>>(
    a_row: &[A],
    za: i32,
    b: &[B],
    b_zero: &[i32],
    row: &mut [i32],
) {
    let n = row.len();
    row.fill(0);
    for (kk, &x) in a_row.iter().enumerate() {
        let x = x.into() - za;
        let weights = &b[kk * n..(kk + 1) * n];
        for ((o, &w), &zb) in row.iter_mut().zip(weights).zip(b_zero) {
            *o = o.wrapping_add(x.wrapping_mul(w.into() - zb));
        }
    }
}

/// [`product_row`] compiled for AVX2 (8 lanes of i32).
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn row_avx2<A: Copy + Into<i32>, B: Copy + Into<i32>>(
    a_row: &[A],
    za: i32,
    b: &[B],
    b_zero: &[i32],
    row: &mut [i32],
) {
    product_row(a_row, za, b, b_zero, row)
}

/// [`product_row`] compiled for AVX-512 (16 lanes of i32).
///
/// # Safety
/// AVX-512 F and BW must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn row_avx512<A: Copy + Into<i32>, B: Copy + Into<i32>>(
    a_row: &[A],
    za: i32,
    b: &[B],
    b_zero: &[i32],
    row: &mut [i32],
) {
    product_row(a_row, za, b, b_zero, row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_quantize_follows_the_onnx_example() {
        // ONNX's node test `test_dynamicquantizelinear` (0.5 / scale rounds to 25.5 in f32,
        // then to the even 26).
        let x = [0.0, 2.0, -3.0, -2.5, 1.34, 0.5];
        let mut codes = [0u8; 6];
        let (scale, zero) = dynamic_quantize(&x, &mut codes).unwrap();
        assert_eq!((scale, zero), (0.019_607_844, 153));
        assert_eq!(codes, [153, 255, 0, 26, 221, 179]);
        // Ties go to even, as round_ties_even does.
        for x in [
            0.5f32, 1.5, 2.5, -0.5, -1.5, -2.5, 254.5, -255.5, 3.2, -3.7, 0.0, -0.0,
        ] {
            assert_eq!(round_even(x), x.round_ties_even(), "{x}");
        }
        // Past the lanes: the scalar definition, NaN and signed zeros included.
        let mut x = crate::rng::Rng::new(7).values(103, 3.0);
        (x[40], x[41], x[90]) = (f32::NAN, -0.0, 7.5);
        let (lo, hi) = (x.iter()).fold((0f32, 0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        let scale = (hi - lo) / 255.0;
        let zero = (0.0 - lo / scale).clamp(0.0, 255.0).round_ties_even();
        let want: Vec<u8> = (x.iter())
            .map(|&v| ((v / scale).round_ties_even() + zero).clamp(0.0, 255.0) as u8)
            .collect();
        let mut codes = vec![0u8; x.len()];
        assert_eq!(
            dynamic_quantize(&x, &mut codes).unwrap(),
            (scale, zero as u8)
        );
        assert_eq!(codes, want);
        // Each path, not only the one the dispatch takes.
        type Path = fn(&[f32], &mut [u8]) -> (f32, u8);
        let mut paths: Vec<(&str, Path)> = vec![("scalar", quantize)];
        #[cfg(target_arch = "x86_64")]
        {
            if cpu::level() >= cpu::Level::Avx2 {
                // SAFETY: AVX2 is available (checked above).
                paths.push(("avx2", |x, c| unsafe { quantize_avx2(x, c) }));
            }
            if cpu::level() >= cpu::Level::Avx512 {
                // SAFETY: AVX-512 F is available (checked above).
                paths.push(("avx512", |x, c| unsafe { quantize_avx512(x, c) }));
            }
        }
        for (what, path) in paths {
            codes.fill(0);
            assert_eq!(path(&x, &mut codes), (scale, zero as u8), "{what}");
            assert_eq!(codes, want, "{what}");
        }
        let mut codes = [0u8; 6];
        // All zeros: scale 1, zero point 0.
        let (scale, zero) = dynamic_quantize(&[0.0; 3], &mut codes[..3]).unwrap();
        assert_eq!((scale, zero), (1.0, 0));
    }

    #[test]
    fn matmul_integer_is_the_exact_product_at_any_thread_count() {
        // Rows past a task's chunk, inputs past a block and not a multiple of 4, columns past
        // a tile and short of one.
        for (m, k, n) in [
            (7, 33, 19),
            (70, 1027, 150),
            (33, 256, 64),
            (1, 6, 3),
            (3, 0, 5),
        ] {
            let mut rng = crate::rng::Rng::new((m * k * n) as u64);
            let a: Vec<u8> = (0..m * k).map(|_| rng.next_u64() as u8).collect();
            let b: Vec<i8> = (0..k * n).map(|_| rng.next_u64() as i8).collect();
            let a_zero: Vec<i32> = (0..m as i32).map(|i| 100 + i).collect();
            let b_zero: Vec<i32> = (0..n as i32).map(|j| j % 40 - 9).collect();
            let mut want = vec![0i32; m * n];
            for i in 0..m {
                for j in 0..n {
                    want[i * n + j] = (0..k)
                        .map(|kk| {
                            let x = i32::from(a[i * k + kk]) - a_zero[i];
                            x * (i32::from(b[kk * n + j]) - b_zero[j])
                        })
                        .sum();
                }
            }
            for threads in [1, 2, 3] {
                let pool = ThreadPool::new(threads);
                let mut out = vec![0i32; m * n];
                matmul_integer(&a, &a_zero, &b, &b_zero, &mut out, (m, k, n), &pool).unwrap();
                assert_eq!(out, want, "{m}x{k}x{n}, {threads} threads");
                if PackedI8::available() {
                    out.fill(0);
                    let packed = PackedI8::pack(&b, k, n).unwrap();
                    matmul_integer_packed(&a, &a_zero, &packed, &b_zero, &mut out, m, &pool)
                        .unwrap();
                    assert_eq!(out, want, "packed, {m}x{k}x{n}, {threads} threads");
                }
            }
        }
        // A per-tensor A zero point, 40 columns (two vectors and a tail), k not a multiple of 4.
        let (m, k, n) = (3, 13, 40);
        let a: Vec<u8> = (0..m * k).map(|i| (i * 53 % 256) as u8).collect();
        let b: Vec<i8> = (0..k * n).map(|i| (i * 29 % 256) as u8 as i8).collect();
        let b_zero = vec![0i32; n];
        let mut want = vec![0i32; m * n];
        let mut out = vec![0i32; m * n];
        let pool = ThreadPool::new(2);
        matmul_integer(&a, &[128], &b, &b_zero, &mut want, (m, k, n), &pool).unwrap();
        if PackedI8::available() {
            let packed = PackedI8::pack(&b, k, n).unwrap();
            matmul_integer_packed(&a, &[128], &packed, &b_zero, &mut out, m, &pool).unwrap();
            assert_eq!(out, want);
        }
    }
}
