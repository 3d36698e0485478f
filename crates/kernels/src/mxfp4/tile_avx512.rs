//! The AVX-512 VNNI tile: a tile's 16 columns in one 512-bit vector, `vpdpbusd` on the
//! unsigned weights (x86-64 only).

use std::arch::x86_64::*;

use super::int8::{E8M0_NAN, E8M0_ZERO, Tile, UNSIGNED};
use super::packed::TILE_COLS;

pub(super) struct Avx512 {
    table: __m512i,
    nibble: __m512i,
}

impl Avx512 {
    #[inline(always)]
    pub(super) unsafe fn new() -> Avx512 {
        // SAFETY: AVX-512 is available (the caller's contract); the table is 16 bytes.
        unsafe {
            Avx512 {
                table: _mm512_broadcast_i32x4(_mm_loadu_si128(UNSIGNED.as_ptr().cast())),
                nibble: _mm512_set1_epi8(0x0F),
            }
        }
    }
}

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
