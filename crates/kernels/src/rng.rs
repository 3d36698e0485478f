//! xorshift64*: the one small deterministic generator of oxgen's tests and benches (fixture
//! weights, operator and kernel data); a seed gives the same values on every machine. Not for
//! sampling tokens (the generator crate seeds its own per request).

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// `n` values uniform in `[lo, hi)`.
    pub fn floats(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n)
            .map(|_| lo + (hi - lo) * (self.uniform() + 1.0) / 2.0)
            .collect()
    }

    /// `n` values uniform in `[-1, 1)` times `scale`.
    pub fn values(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| scale * self.uniform()).collect()
    }

    /// `n` codes of `bits` bits (one per byte).
    pub fn codes(&mut self, n: usize, bits: u32) -> Vec<u8> {
        (0..n).map(|_| self.below(1 << bits) as u8).collect()
    }
}
