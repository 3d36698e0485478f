//! MXFP4 with int8 activations (`accuracy_level` 4): the arithmetic llama.cpp runs its MXFP4
//! matrices with on CPU, integer dot products of the codes with activations quantized per
//! block, one f32 multiply-add per block.
//!
//! Each row of `A` is quantized in blocks of 32 as `MatMulNBits`' int8 path does it
//! ([`crate::nbits::quantize_row`]: `scale_a = max|a| / 127`, codes `q_a`). A weight code `c`
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

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::ops::Range;

use super::{BLOCK, E2M1, Mxfp4Weights, e8m0};
use crate::ThreadPool;
use crate::error::{KernelError, check_len, numel};
use crate::nbits::{Isa, NBitsLayout, QuantizedRow, quantize_row_reference, with_rows};
use crate::par::{MAX_ROW_BLOCK, par_row_blocks_spans, parts_for};
use crate::pool::Prelude;

/// Columns of a tile.
const TILE_COLS: usize = 16;
/// Bytes of one group of four inputs of a tile.
const GROUP_BYTES: usize = 32;
/// Bytes of a tile's block: eight groups, then the scales.
const TILE_BYTES: usize = (BLOCK / 4) * GROUP_BYTES + TILE_COLS;
/// What the unsigned weights carry on top of `v`.
const OFFSET: i32 = 12;
/// `v(c) + 12` by code.
const UNSIGNED: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut c = 0;
    while c < 16 {
        t[c] = (2.0 * E2M1[c] + OFFSET as f32) as u8;
        c += 1;
    }
    t
};

/// An MXFP4 matrix repacked at load into the kernels' tiles (see the module doc): the same
/// codes and scales, read in order. A last tile past `n` holds zero codes.
#[derive(Debug, Clone)]
pub struct Mxfp4Packed {
    n: usize,
    k: usize,
    bytes: Vec<u8>,
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
fn gather(w: &Mxfp4Weights, tile: usize, b: usize, out: &mut [u8]) {
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
    if Isa::available().is_empty() {
        return matmul_mxfp4_int8_reference(a, m, w, bias, out, pool);
    }
    matmul_mxfp4_int8_isa(a, m, w, packed, bias, out, pool, Isa::best())
}

/// [`matmul_mxfp4_int8`] on one kernel variant (`isa` from [`Isa::available`]; AVX-VNNI runs
/// the AVX2 kernel), to test each against the reference.
#[allow(clippy::too_many_arguments)]
pub fn matmul_mxfp4_int8_isa(
    a: &[f32],
    m: usize,
    w: &Mxfp4Weights,
    packed: Option<&Mxfp4Packed>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    pool: &ThreadPool,
    isa: Isa,
) -> Result<(), KernelError> {
    check_args(a, m, w, bias, out)?;
    if !Isa::available().contains(&isa) {
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
    let layout = NBitsLayout::new(n, k, 4, BLOCK)?;
    with_rows(m, |rows| {
        for (i, row) in rows.iter_mut().enumerate() {
            row.quantize(&a[i * k..][..k], &layout, false);
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
            TILE_COLS,
            rows_per_task,
            col_parts,
            task,
        );
    });
    Ok(())
}

fn check_args(
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

/// The scalar reference of the module doc's arithmetic, on the stored layout: the oracle of
/// the vector kernels.
pub fn matmul_mxfp4_int8_reference(
    a: &[f32],
    m: usize,
    w: &Mxfp4Weights,
    bias: Option<&[f32]>,
    out: &mut [f32],
    _pool: &ThreadPool,
) -> Result<(), KernelError> {
    check_args(a, m, w, bias, out)?;
    let (n, k) = (w.n, w.k);
    let blocks = k / BLOCK;
    let mut q = vec![0i8; k];
    let mut scale_a = vec![0f32; blocks];
    for i in 0..m {
        quantize_row_reference(&a[i * k..][..k], BLOCK, &mut q, &mut scale_a);
        for (col, o) in out[i * n..][..n].iter_mut().enumerate() {
            let mut y = 0f32;
            for (b, &sa) in scale_a.iter().enumerate() {
                let dot: i32 = (b * BLOCK..(b + 1) * BLOCK)
                    .map(|kk| (2.0 * E2M1[w.code(kk, col)]) as i32 * i32::from(q[kk]))
                    .sum();
                let s = e8m0(w.scales[col * blocks + b]) * 0.5;
                y = (s * sa).mul_add(dot as f32, y);
            }
            *o = bias.map_or(y, |bias| y + bias[col]);
        }
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
    isa: Isa,
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
                Isa::Avx512Vnni => columns_avx512(p),
                Isa::Avx2 | Isa::AvxVnni => columns_avx2(p),
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
        for g in 0..BLOCK / 4 {
            let mut x = [0i32; R];
            for (x, row) in x.iter_mut().zip(p.rows) {
                let q = &row.natural()[b * BLOCK + 4 * g..][..4];
                *x = i32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8]);
            }
            for (t, block) in blocks_here.iter().enumerate() {
                let w = unsafe { isa.codes(&block[g * GROUP_BYTES..][..GROUP_BYTES]) };
                for (acc, &x) in acc.iter_mut().zip(&x) {
                    acc[t] = unsafe { isa.dot(acc[t], w, x) };
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

/// One vector width's operations on a tile of 16 columns.
#[cfg(target_arch = "x86_64")]
trait Tile {
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
const E8M0_ZERO: i32 = 0x0040_0000;
#[cfg(target_arch = "x86_64")]
const E8M0_NAN: i32 = 0x7FC0_0000;

#[cfg(target_arch = "x86_64")]
struct Avx512 {
    table: __m512i,
    nibble: __m512i,
}

#[cfg(target_arch = "x86_64")]
impl Avx512 {
    #[inline(always)]
    unsafe fn new() -> Avx512 {
        // SAFETY: AVX-512 is available (the caller's contract); the table is 16 bytes.
        unsafe {
            Avx512 {
                table: _mm512_broadcast_i32x4(_mm_loadu_si128(UNSIGNED.as_ptr().cast())),
                nibble: _mm512_set1_epi8(0x0F),
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl Tile for Avx512 {
    type Codes = __m512i;
    type Acc = __m512i;
    type Out = __m512;
    type Scale = __m512;
    #[inline(always)]
    unsafe fn zero(&self) -> __m512i {
        unsafe { _mm512_setzero_si512() }
    }
    #[inline(always)]
    unsafe fn zero_out(&self) -> __m512 {
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn codes(&self, group: &[u8]) -> __m512i {
        unsafe {
            let low = _mm256_loadu_si256(group.as_ptr().cast());
            let high = _mm256_srli_epi16::<4>(low);
            let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(low), high);
            _mm512_shuffle_epi8(self.table, _mm512_and_si512(both, self.nibble))
        }
    }
    #[inline(always)]
    unsafe fn dot(&self, acc: __m512i, w: __m512i, x: i32) -> __m512i {
        unsafe { _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(x)) }
    }
    #[inline(always)]
    unsafe fn scales(&self, bytes: &[u8]) -> __m512 {
        unsafe {
            let e = _mm512_cvtepu8_epi32(_mm_loadu_si128(bytes.as_ptr().cast()));
            let bits = _mm512_slli_epi32::<23>(e);
            let zero = _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512());
            let bits = _mm512_mask_mov_epi32(bits, zero, _mm512_set1_epi32(E8M0_ZERO));
            let nan = _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(255));
            let bits = _mm512_mask_mov_epi32(bits, nan, _mm512_set1_epi32(E8M0_NAN));
            _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(0.5))
        }
    }
    #[inline(always)]
    unsafe fn block(&self, y: __m512, acc: __m512i, offset: i32, s: __m512, sa: f32) -> __m512 {
        unsafe {
            let dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc, _mm512_set1_epi32(offset)));
            _mm512_fmadd_ps(_mm512_mul_ps(s, _mm512_set1_ps(sa)), dot, y)
        }
    }
    #[inline(always)]
    unsafe fn store(&self, y: __m512, out: &mut [f32; TILE_COLS]) {
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), y) }
    }
}

/// Two 256-bit halves per tile: columns 0-7 (the low nibbles) and 8-15.
#[cfg(target_arch = "x86_64")]
struct Avx2 {
    table: __m256i,
    nibble: __m256i,
    ones: __m256i,
}

#[cfg(target_arch = "x86_64")]
impl Avx2 {
    #[inline(always)]
    unsafe fn new() -> Avx2 {
        // SAFETY: AVX2 is available (the caller's contract); the table is 16 bytes.
        unsafe {
            Avx2 {
                table: _mm256_broadcastsi128_si256(_mm_loadu_si128(UNSIGNED.as_ptr().cast())),
                nibble: _mm256_set1_epi8(0x0F),
                ones: _mm256_set1_epi16(1),
            }
        }
    }

    #[inline(always)]
    unsafe fn scale_half(&self, bytes: &[u8]) -> __m256 {
        unsafe {
            let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(bytes.as_ptr().cast()));
            let bits = _mm256_slli_epi32::<23>(e);
            let zero = _mm256_cmpeq_epi32(e, _mm256_setzero_si256());
            let bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(E8M0_ZERO), zero);
            let nan = _mm256_cmpeq_epi32(e, _mm256_set1_epi32(255));
            let bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(E8M0_NAN), nan);
            _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(0.5))
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl Tile for Avx2 {
    type Codes = [__m256i; 2];
    type Acc = [__m256i; 2];
    type Out = [__m256; 2];
    type Scale = [__m256; 2];
    #[inline(always)]
    unsafe fn zero(&self) -> [__m256i; 2] {
        unsafe { [_mm256_setzero_si256(); 2] }
    }
    #[inline(always)]
    unsafe fn zero_out(&self) -> [__m256; 2] {
        unsafe { [_mm256_setzero_ps(); 2] }
    }
    #[inline(always)]
    unsafe fn codes(&self, group: &[u8]) -> [__m256i; 2] {
        unsafe {
            let bytes = _mm256_loadu_si256(group.as_ptr().cast());
            let low = _mm256_and_si256(bytes, self.nibble);
            let high = _mm256_and_si256(_mm256_srli_epi16::<4>(bytes), self.nibble);
            [
                _mm256_shuffle_epi8(self.table, low),
                _mm256_shuffle_epi8(self.table, high),
            ]
        }
    }
    #[inline(always)]
    unsafe fn dot(&self, acc: [__m256i; 2], w: [__m256i; 2], x: i32) -> [__m256i; 2] {
        unsafe {
            let x = _mm256_set1_epi32(x);
            // Pairs of at most 24 · 127 each: no i16 saturation.
            let low = _mm256_madd_epi16(_mm256_maddubs_epi16(w[0], x), self.ones);
            let high = _mm256_madd_epi16(_mm256_maddubs_epi16(w[1], x), self.ones);
            [
                _mm256_add_epi32(acc[0], low),
                _mm256_add_epi32(acc[1], high),
            ]
        }
    }
    #[inline(always)]
    unsafe fn scales(&self, bytes: &[u8]) -> [__m256; 2] {
        unsafe { [self.scale_half(bytes), self.scale_half(&bytes[8..])] }
    }
    #[inline(always)]
    unsafe fn block(
        &self,
        y: [__m256; 2],
        acc: [__m256i; 2],
        offset: i32,
        s: [__m256; 2],
        sa: f32,
    ) -> [__m256; 2] {
        unsafe {
            let (offset, sa) = (_mm256_set1_epi32(offset), _mm256_set1_ps(sa));
            let low = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[0], offset));
            let high = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[1], offset));
            [
                _mm256_fmadd_ps(_mm256_mul_ps(s[0], sa), low, y[0]),
                _mm256_fmadd_ps(_mm256_mul_ps(s[1], sa), high, y[1]),
            ]
        }
    }
    #[inline(always)]
    unsafe fn store(&self, y: [__m256; 2], out: &mut [f32; TILE_COLS]) {
        unsafe {
            _mm256_storeu_ps(out.as_mut_ptr(), y[0]);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), y[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mxfp4::matmul_mxfp4;
    use crate::mxfp4::tests::rng;

    /// Codes of every value; scales 2^-8 ..= 2^0, but columns 0-3 (where there are six or
    /// more) take only the edge bytes 0, 1, 254 and 255 (NaN).
    fn matrix(n: usize, k: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
        let mut next = rng(seed);
        let codes = (0..k * n / 2).map(|_| next() as u8).collect();
        let blocks = k / BLOCK;
        let scales = (0..n * blocks)
            .map(|i| match i / blocks {
                col @ 0..4 if n >= 6 => [0, 1, 254, 255][col],
                _ => 119 + (next() % 9) as u8,
            })
            .collect();
        (codes, scales)
    }

    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut next = rng(seed);
        (0..len)
            .map(|i| {
                // A block of zeros now and then (scale 0).
                if (i / BLOCK) % 7 == 3 {
                    0.0
                } else {
                    (next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
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
            for &isa in Isa::available() {
                for threads in [1, 3] {
                    let pool = ThreadPool::new(threads);
                    for p in [None, Some(&packed)] {
                        let mut got = vec![f32::NAN; m * n];
                        matmul_mxfp4_int8_isa(&a, m, &w, p, bias, &mut got, &pool, isa).unwrap();
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
                    matmul_mxfp4_int8_isa(a, 1, &w, Some(&packed), bias, &mut one, &pool, isa)
                        .unwrap();
                    assert_eq!(bits(&one), bits(&want[i * n..][..n]), "{n}x{k} row {i}");
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
        if !Isa::available().is_empty() {
            assert!(r.is_err());
        }
    }
}
