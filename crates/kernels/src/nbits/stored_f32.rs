//! `MatMulNBits` with f32 activations, in vectors of sixteen output columns on AVX-512 or eight
//! on AVX2, four vectors at a time (independent sums, each a column's chain of adds in K
//! order): each lane is one column's reference arithmetic ([`super::reference`]:
//! `w = (q - zp) · scale` rounded, then `acc = acc + a · w` in K order, the bias last), so the
//! bits are the reference's. Per block, each group of eight rows' codes is read interleaved
//! (code `e` of the block then being eight consecutive bytes, 4-bit: a nibble of each):
//! gathered from the stored (ONNX) layout into a buffer, or as [`super::Interleaved`] holds
//! them, repacked at load ([`Blocks`] says where they come from).
//!
//! Takes 4- and 8-bit codes with default or packed zero points and blocks of at most
//! [`MAX_BLOB`] bytes; [`supported`] says when.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::mem::MaybeUninit;
use std::ops::Range;

use super::layout::{NBitsLayout, QuantWeights, ZeroPoints};
use crate::cpu;
use crate::par::MAX_ROW_BLOCK;
use crate::quant::{code, default_zero_point};
#[cfg(target_arch = "x86_64")]
use crate::simd::F32Lanes;

/// Output columns a vector takes.
pub(super) const COLS: usize = 8;

/// The most bytes a block of one row may take here (a 256-code 8-bit block).
pub(super) const MAX_BLOB: usize = 256;

/// Whether the vector columns run `w` on this CPU.
pub(super) fn supported(w: &QuantWeights<'_, f32>) -> bool {
    cfg!(target_arch = "x86_64")
        && cpu::level() >= cpu::Level::Avx2
        && matches!(w.layout.bits, 4 | 8)
        && w.layout.blob_size <= MAX_BLOB
        && !matches!(w.zero_points, ZeroPoints::Float(_))
}

/// Column vectors a pass computes together: independent sums, so that one column's adds
/// (a chain in K order, which the reduction contract fixes) overlap the others' latency.
const GROUPS: usize = 4;

/// Codes a pass of several rows dequantizes into its buffer before the rows take them.
const CHUNK: usize = 64;

/// Columns `cols` (a whole number of vectors of eight) of the output rows `outs` (one per row
/// of `a`, at most [`MAX_ROW_BLOCK`]), in passes of [`GROUPS`] vectors: of sixteen columns
/// where the CPU has AVX-512, else (and for a last eight) of eight. Several rows take each
/// block's weights from a buffer of them dequantized; a single row dequantizes them as it
/// goes. Every lane sees its column's reference operations either way.
///
/// # Safety
/// AVX2 must be available and `w` a layout [`supported`] takes, checked; `cols` inside `n`;
/// every `outs[r].len() == cols.len()`; `a.len() == outs.len() * k`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn columns<B: Blocks>(
    a: &[f32],
    w: &B,
    bias: Option<&[f32]>,
    cols: Range<usize>,
    outs: &mut [&mut [f32]],
) {
    let mut buffers = Buffers {
        gathered: [[0u8; MAX_BLOB * COLS]; 2 * GROUPS],
        weights: [MaybeUninit::uninit(); CHUNK * GROUPS * 16],
    };
    let rows = outs.len();
    let wide = cpu::level() >= cpu::Level::Avx512;
    let mut j0 = cols.start;
    while j0 < cols.end {
        let left = cols.end - j0;
        let lanes = if wide && left >= 16 { 16 } else { COLS };
        let len = (left / lanes * lanes).min(GROUPS * lanes);
        let at = j0 - cols.start;
        let mut parts: [&mut [f32]; MAX_ROW_BLOCK] = Default::default();
        for (part, out) in parts.iter_mut().zip(outs.iter_mut()) {
            *part = &mut out[at..at + len];
        }
        let pass = Pass {
            a,
            w,
            bias,
            j0,
            outs: &mut parts[..rows],
            buffers: &mut buffers,
        };
        // SAFETY: the caller's contract, for the pass's columns `j0..j0 + len`; AVX-512 F
        // checked for the wide passes.
        unsafe {
            match (lanes, len / lanes) {
                (16, 4) => pass_avx512::<B, 4>(pass),
                (16, 3) => pass_avx512::<B, 3>(pass),
                (16, 2) => pass_avx512::<B, 2>(pass),
                (16, _) => pass_avx512::<B, 1>(pass),
                (_, 4) => pass_avx2::<B, 4>(pass),
                (_, 3) => pass_avx2::<B, 3>(pass),
                (_, 2) => pass_avx2::<B, 2>(pass),
                _ => pass_avx2::<B, 1>(pass),
            }
        }
        j0 += len;
    }
}

/// One pass's arguments: columns from `j0`, a vector's worth per [`Lanes`] of the pass, of
/// the rows `outs` of `a`.
struct Pass<'a, B> {
    a: &'a [f32],
    w: &'a B,
    bias: Option<&'a [f32]>,
    j0: usize,
    outs: &'a mut [&'a mut [f32]],
    buffers: &'a mut Buffers,
}

/// A pass's buffers: each group of eight rows' codes of a block (byte `i` of row `r` at
/// `i * 8 + r`) and, with several rows, a [`CHUNK`] of the block's weights (code `e` of
/// vector `v` at `(e * G + v) * lanes`).
#[cfg(target_arch = "x86_64")]
struct Buffers {
    gathered: [[u8; MAX_BLOB * COLS]; 2 * GROUPS],
    weights: [MaybeUninit<f32>; CHUNK * GROUPS * 16],
}

/// [`pass`] in vectors of eight columns.
///
/// # Safety
/// As for [`pass`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn pass_avx2<B: Blocks, const G: usize>(p: Pass<B>) {
    // SAFETY: the caller's contract; AVX2 is enabled here for the inlined body.
    unsafe { pass::<B, __m256, G>(p) }
}

/// [`pass`] in vectors of sixteen columns.
///
/// # Safety
/// As for [`pass`], and AVX-512 F must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn pass_avx512<B: Blocks, const G: usize>(p: Pass<B>) {
    // SAFETY: the caller's contract; AVX-512 F is enabled here for the inlined body.
    unsafe { pass::<B, __m512, G>(p) }
}

/// Columns `j0..j0 + G * V::LANES` of the rows `outs`: `G` vectors, each lane one column's
/// reference arithmetic. Inlined into [`pass_avx2`] and [`pass_avx512`], which enable the
/// vector width's instructions.
///
/// # Safety
/// As for [`columns`], with every `outs[r].len() == G * V::LANES` and the CPU running `V`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pass<B: Blocks, V: Lanes, const G: usize>(p: Pass<B>) {
    let Pass {
        a,
        w,
        bias,
        j0,
        outs,
        buffers: Buffers { gathered, weights },
    } = p;
    let l = w.layout();
    let (rows, k, per_vector) = (outs.len(), l.k, V::LANES / COLS);
    // SAFETY: the CPU runs `V` (the caller's contract), as for every `V` method below.
    let zero = unsafe { V::zero() };
    let mut acc = [[zero; G]; MAX_ROW_BLOCK];
    let per_byte = if l.bits == 4 { 2 } else { 1 };
    for b in 0..l.k_blocks {
        let ks = b * l.block_size..((b + 1) * l.block_size).min(k);
        let (mut scale, mut zp) = ([zero; G], [zero; G]);
        let mut codes = [[std::ptr::null(); 2]; G];
        for v in 0..G {
            let groups = &mut gathered[v * per_vector..][..per_vector];
            // SAFETY: the caller's contract: the vector's rows lie inside `n`.
            (codes[v], scale[v], zp[v]) = unsafe { V::gather(w, j0 + v * V::LANES, b, groups) };
        }
        for c0 in (0..ks.len()).step_by(CHUNK) {
            let chunk = c0..(c0 + CHUNK).min(ks.len());
            // Codes `e` in order; a 4-bit byte holds two (the even one low).
            for i in c0 / per_byte..chunk.end.div_ceil(per_byte) {
                // SAFETY: `i < blob_size`: eight bytes lie at `i * 8` in each group's codes.
                let bytes: [V::Int; G] = std::array::from_fn(|v| unsafe { V::bytes(codes[v], i) });
                for half in 0..per_byte.min(ks.len() - i * per_byte) {
                    let e = i * per_byte + half;
                    // SAFETY: the CPU runs `V` (the caller's contract).
                    let weight: [V; G] = std::array::from_fn(|v| unsafe {
                        V::weight(V::codes(bytes[v], l.bits, half), zp[v], scale[v])
                    });
                    if rows == 1 {
                        let x = unsafe { V::splat(a[ks.start + e]) };
                        for v in 0..G {
                            acc[0][v] = unsafe { V::mul_add(acc[0][v], x, weight[v]) };
                        }
                    } else {
                        for (v, weight) in weight.iter().enumerate() {
                            let at = ((e - c0) * G + v) * V::LANES;
                            // SAFETY: `e - c0 < CHUNK`, `v < G <= GROUPS`, `V::LANES <= 16`.
                            unsafe { weight.store(weights.as_mut_ptr().add(at).cast()) };
                        }
                    }
                }
            }
            if rows > 1 {
                let first = ks.start + chunk.start;
                let weights = weights.as_ptr().cast::<f32>();
                // Rows two at a time: each weight loaded once for both, twice the add chains
                // in flight (four at a time measured no better on AVX-512).
                for (c, accs) in acc[..rows].chunks_mut(2).enumerate() {
                    let a = &a[2 * c * k + first..];
                    // SAFETY: the chunk's weights were all written above; `a` holds the rows.
                    unsafe {
                        match accs.len() {
                            2 => rows_chunk::<V, G, 2>(accs, a, k, chunk.len(), weights),
                            _ => rows_chunk::<V, G, 1>(accs, a, k, chunk.len(), weights),
                        }
                    }
                }
            }
        }
    }
    for (acc, out) in acc.iter().zip(outs.iter_mut()) {
        for (v, (&acc, out)) in acc.iter().zip(out.chunks_exact_mut(V::LANES)).enumerate() {
            // SAFETY: the columns lie inside `n`, the bias's length; `out` is one vector's
            // chunk.
            unsafe {
                let acc = match bias {
                    Some(bias) => V::add(acc, V::load(bias.as_ptr().add(j0 + v * V::LANES))),
                    None => acc,
                };
                acc.store(out.as_mut_ptr());
            }
        }
    }
}

/// `R` rows' sums over `len` codes of a chunk: row `r`'s inputs are `a[r * k..][..len]`, the
/// weights code `e` of vector `v` at `weights[(e * G + v) * V::LANES..]`.
///
/// # Safety
/// The CPU runs `V`; `acc.len() == R`; the weights hold `len * G` vectors; `a` the rows.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn rows_chunk<V: Lanes, const G: usize, const R: usize>(
    acc: &mut [[V; G]],
    a: &[f32],
    k: usize,
    len: usize,
    weights: *const f32,
) {
    assert!(acc.len() == R && a.len() > (R - 1) * k + len.saturating_sub(1));
    let mut sums: [[V; G]; R] = [acc[0]; R];
    sums.copy_from_slice(acc);
    let a = a.as_ptr();
    for e in 0..len {
        // SAFETY: the caller's contract, for every call below; row `r`'s input `e` lies in `a`
        // (asserted).
        let mut x = [unsafe { V::zero() }; R];
        for (r, x) in x.iter_mut().enumerate() {
            *x = unsafe { V::splat(*a.add(r * k + e)) };
        }
        for v in 0..G {
            let weight = unsafe { V::load(weights.add((e * G + v) * V::LANES)) };
            for (sum, &x) in sums.iter_mut().zip(&x) {
                sum[v] = unsafe { V::mul_add(sum[v], x, weight) };
            }
        }
    }
    acc.copy_from_slice(&sums);
}

/// A vector of f32 lanes, one output column per lane, as a [`pass`] uses it: its
/// [`F32Lanes::LANES`] a multiple of [`COLS`], the rows a gathered group holds. Every method
/// needs the CPU to run the vector's instructions (the callers' contract); each is inlined
/// into a function that enables them.
#[cfg(target_arch = "x86_64")]
trait Lanes: F32Lanes {
    type Int: Copy;
    /// Block `b` of rows `j0..j0 + LANES` ([`Blocks::group`] for each eight, `groups` their
    /// buffers): where each eight's codes lie, and the rows' scales and zero points.
    unsafe fn gather<B: Blocks>(
        w: &B,
        j0: usize,
        b: usize,
        groups: &mut [[u8; MAX_BLOB * COLS]],
    ) -> ([*const u8; 2], Self, Self);
    /// Byte `i` of each lane's row, from the codes [`Lanes::gather`] gave, widened.
    unsafe fn bytes(codes: [*const u8; 2], i: usize) -> Self::Int;
    /// The codes of `bytes`: `half` picks a 4-bit byte's nibble (0 the low one).
    unsafe fn codes(bytes: Self::Int, bits: u32, half: usize) -> Self::Int;
    /// `(codes - zp) · scale`, rounded once.
    unsafe fn weight(codes: Self::Int, zp: Self, scale: Self) -> Self;
}

#[cfg(target_arch = "x86_64")]
impl Lanes for __m256 {
    type Int = __m256i;
    #[inline(always)]
    unsafe fn gather<B: Blocks>(
        w: &B,
        j0: usize,
        b: usize,
        groups: &mut [[u8; MAX_BLOB * COLS]],
    ) -> ([*const u8; 2], Self, Self) {
        let (codes, scale, zp) = unsafe { w.group(j0, b, &mut groups[0]) };
        ([codes, std::ptr::null()], scale, zp)
    }
    #[inline(always)]
    unsafe fn bytes(codes: [*const u8; 2], i: usize) -> Self::Int {
        unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(codes[0].add(i * COLS).cast())) }
    }
    #[inline(always)]
    unsafe fn codes(bytes: Self::Int, bits: u32, half: usize) -> Self::Int {
        unsafe {
            match (bits, half) {
                (4, 0) => _mm256_and_si256(bytes, _mm256_set1_epi32(0xF)),
                (4, _) => _mm256_srli_epi32::<4>(bytes),
                _ => bytes,
            }
        }
    }
    #[inline(always)]
    unsafe fn weight(codes: Self::Int, zp: Self, scale: Self) -> Self {
        unsafe { _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(codes), zp), scale) }
    }
}

#[cfg(target_arch = "x86_64")]
impl Lanes for __m512 {
    type Int = __m512i;
    #[inline(always)]
    unsafe fn gather<B: Blocks>(
        w: &B,
        j0: usize,
        b: usize,
        groups: &mut [[u8; MAX_BLOB * COLS]],
    ) -> ([*const u8; 2], Self, Self) {
        let (lo, hi) = groups.split_at_mut(1);
        unsafe {
            let (c0, s0, z0) = w.group(j0, b, &mut lo[0]);
            let (c1, s1, z1) = w.group(j0 + COLS, b, &mut hi[0]);
            let join = |lo: __m256, hi: __m256| {
                _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                    _mm512_castps_pd(_mm512_castps256_ps512(lo)),
                    _mm256_castps_pd(hi),
                ))
            };
            ([c0, c1], join(s0, s1), join(z0, z1))
        }
    }
    #[inline(always)]
    unsafe fn bytes(codes: [*const u8; 2], i: usize) -> Self::Int {
        unsafe {
            let lo = _mm_loadl_epi64(codes[0].add(i * COLS).cast());
            let hi = _mm_loadl_epi64(codes[1].add(i * COLS).cast());
            _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(lo, hi))
        }
    }
    #[inline(always)]
    unsafe fn codes(bytes: Self::Int, bits: u32, half: usize) -> Self::Int {
        unsafe {
            match (bits, half) {
                (4, 0) => _mm512_and_si512(bytes, _mm512_set1_epi32(0xF)),
                (4, _) => _mm512_srli_epi32::<4>(bytes),
                _ => bytes,
            }
        }
    }
    #[inline(always)]
    unsafe fn weight(codes: Self::Int, zp: Self, scale: Self) -> Self {
        unsafe { _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(codes), zp), scale) }
    }
}

/// Where a pass's weights come from: blocks of eight rows with their codes interleaved (byte
/// `i` of row `r` at `i * 8 + r`), gathered from the stored layout ([`QuantWeights`]) or
/// already so ([`super::Interleaved`]).
#[cfg(target_arch = "x86_64")]
pub(super) trait Blocks: Sync {
    fn layout(&self) -> &NBitsLayout;
    /// Block `b` of rows `j0..j0 + 8`: where their interleaved codes lie (in `buffer` when
    /// they must be gathered), and their scales and zero points.
    ///
    /// # Safety
    /// AVX2 must be available, the rows inside `n` and `j0` a multiple of 8, `b` a block;
    /// the codes are read while `self` and `buffer` are.
    unsafe fn group(
        &self,
        j0: usize,
        b: usize,
        buffer: &mut [u8; MAX_BLOB * COLS],
    ) -> (*const u8, __m256, __m256);
    /// Columns `cols` of one row that the vectors leave (fewer than eight), by the reference.
    fn rest(&self, a_row: &[f32], bias: Option<&[f32]>, cols: Range<usize>, out: &mut [f32]);
}

#[cfg(target_arch = "x86_64")]
impl Blocks for QuantWeights<'_, f32> {
    fn layout(&self) -> &NBitsLayout {
        &self.layout
    }
    #[inline(always)]
    unsafe fn group(
        &self,
        j0: usize,
        b: usize,
        buffer: &mut [u8; MAX_BLOB * COLS],
    ) -> (*const u8, __m256, __m256) {
        // SAFETY: the caller's contract.
        let (scale, zp) = unsafe { gather_block(self, j0, b, buffer) };
        (buffer.as_ptr(), scale, zp)
    }
    fn rest(&self, a_row: &[f32], bias: Option<&[f32]>, cols: Range<usize>, out: &mut [f32]) {
        super::reference::row_part(a_row, self, bias, cols, out);
    }
}

/// Block `b` of rows `j0..j0 + 8`: their codes into `gathered` (byte `i` of row `r` at
/// `i * 8 + r`), and their scales and zero points as vectors.
///
/// # Safety
/// AVX2 must be available and `w` [`supported`] and checked; the rows inside `n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn gather_block(
    w: &QuantWeights<'_, f32>,
    j0: usize,
    b: usize,
    gathered: &mut [u8; MAX_BLOB * COLS],
) -> (__m256, __m256) {
    let l = &w.layout;
    let row_bytes = l.k_blocks * l.blob_size;
    let blob_at = |r: usize| (j0 + r) * row_bytes + b * l.blob_size;
    // A pass reads a block of each of its rows (up to 64) in turn, more streams than the
    // hardware prefetcher follows: each row's next line is asked for as the row enters a line
    // (decode of a MoE model whose experts come from DRAM: +10%).
    if (b * l.blob_size).is_multiple_of(64) {
        for r in 0..COLS {
            crate::mem::prefetch_lines(w.data.as_ptr().wrapping_add(blob_at(r) + 64), 1);
        }
    }
    if l.blob_size.is_multiple_of(16) {
        for i0 in (0..l.blob_size).step_by(16) {
            // SAFETY: each row's blob holds 16 bytes from `i0`; `gathered` holds the block's
            // 8 x blob_size bytes.
            unsafe {
                transpose_8x16(
                    std::array::from_fn(|r| w.data.as_ptr().add(blob_at(r) + i0)),
                    gathered.as_mut_ptr().add(i0 * COLS),
                )
            };
        }
    } else {
        for r in 0..COLS {
            let blob = &w.data[blob_at(r)..][..l.blob_size];
            for (i, &byte) in blob.iter().enumerate() {
                gathered[i * COLS + r] = byte;
            }
        }
    }
    // Built in registers: eight scalar stores read back as one vector would stall on the
    // store buffer every block.
    let scales = &w.scales[j0 * l.k_blocks + b..];
    let scale = |r: usize| scales[r * l.k_blocks];
    let scale = _mm256_setr_ps(
        scale(0),
        scale(1),
        scale(2),
        scale(3),
        scale(4),
        scale(5),
        scale(6),
        scale(7),
    );
    let zp = match w.zero_points {
        ZeroPoints::Packed(z) => {
            let zp = |r: usize| code(&z[(j0 + r) * l.zp_row_bytes..], l.bits, b) as f32;
            _mm256_setr_ps(zp(0), zp(1), zp(2), zp(3), zp(4), zp(5), zp(6), zp(7))
        }
        _ => _mm256_set1_ps(default_zero_point(l.bits) as f32),
    };
    (scale, zp)
}

/// Eight rows of 16 bytes (`rows[r]`) to 16 columns of 8 bytes: `out[i * 8 + r] = rows[r][i]`,
/// by three rounds of unpacks.
///
/// # Safety
/// AVX2 (for SSE2) must be available; each `rows[r]` readable for 16 bytes, `out` writable
/// for 128.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose_8x16(rows: [*const u8; COLS], out: *mut u8) {
    // SAFETY: the caller's contract.
    let r: [__m128i; COLS] = std::array::from_fn(|i| unsafe { _mm_loadu_si128(rows[i].cast()) });
    // Bytes of row pairs interleaved: (r0, r1) bytes 0-7, then 8-15, for each pair.
    let a = [
        _mm_unpacklo_epi8(r[0], r[1]),
        _mm_unpackhi_epi8(r[0], r[1]),
        _mm_unpacklo_epi8(r[2], r[3]),
        _mm_unpackhi_epi8(r[2], r[3]),
        _mm_unpacklo_epi8(r[4], r[5]),
        _mm_unpackhi_epi8(r[4], r[5]),
        _mm_unpacklo_epi8(r[6], r[7]),
        _mm_unpackhi_epi8(r[6], r[7]),
    ];
    // Four rows' byte i together: bytes 0-3, 4-7, 8-11, 12-15, for rows 0-3 then 4-7.
    let b = [
        _mm_unpacklo_epi16(a[0], a[2]),
        _mm_unpackhi_epi16(a[0], a[2]),
        _mm_unpacklo_epi16(a[1], a[3]),
        _mm_unpackhi_epi16(a[1], a[3]),
        _mm_unpacklo_epi16(a[4], a[6]),
        _mm_unpackhi_epi16(a[4], a[6]),
        _mm_unpacklo_epi16(a[5], a[7]),
        _mm_unpackhi_epi16(a[5], a[7]),
    ];
    // All eight rows' byte i: two columns per vector.
    for q in 0..4 {
        let lo = _mm_unpacklo_epi32(b[q], b[q + 4]);
        let hi = _mm_unpackhi_epi32(b[q], b[q + 4]);
        // SAFETY: the caller's contract: columns 4q..4q+4 are bytes 32q..32q+32 of `out`.
        unsafe {
            _mm_storeu_si128(out.add(32 * q).cast(), lo);
            _mm_storeu_si128(out.add(32 * q + 16).cast(), hi);
        }
    }
}
