//! The AVX2 (and AVX-VNNI) tile: a tile's 16 columns in two 256-bit halves (x86-64 only).

use std::arch::x86_64::*;

use super::int8::{E8M0_NAN, E8M0_ZERO, Tile, UNSIGNED};
use super::packed::TILE_COLS;

/// Two 256-bit halves per tile: columns 0-7 (the low nibbles) and 8-15.
pub(super) struct Avx2 {
    table: __m256i,
    nibble: __m256i,
    ones: __m256i,
}

impl Avx2 {
    #[inline(always)]
    pub(super) unsafe fn new() -> Avx2 {
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
    /// The four groups' pair sums add up in i16 lanes first (each at most 2 · 24 · 127, four
    /// of them 24384 < 2^15: exact), widened by one `vpmaddwd` per half instead of four.
    #[inline(always)]
    unsafe fn dot4(&self, acc: [__m256i; 2], w: [[__m256i; 2]; 4], x: [i32; 4]) -> [__m256i; 2] {
        unsafe {
            let mut pairs = [_mm256_setzero_si256(); 2];
            for (w, x) in w.into_iter().zip(x) {
                let x = _mm256_set1_epi32(x);
                pairs[0] = _mm256_add_epi16(pairs[0], _mm256_maddubs_epi16(w[0], x));
                pairs[1] = _mm256_add_epi16(pairs[1], _mm256_maddubs_epi16(w[1], x));
            }
            [
                _mm256_add_epi32(acc[0], _mm256_madd_epi16(pairs[0], self.ones)),
                _mm256_add_epi32(acc[1], _mm256_madd_epi16(pairs[1], self.ones)),
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
