//! One row of activations quantized to int8 and laid out for the int8 kernels
//! ([`QuantizedRow`]: codes, block scales and sums), and the per-thread buffers that hold a
//! call's rows, so a decode step allocates nothing once warm.

use std::cell::RefCell;

use super::quantize::quantize_row;

/// One row's activations, quantized and laid out for the kernel.
#[derive(Default)]
pub(crate) struct QuantizedRow {
    /// Codes padded to whole blocks (zeros past `k`), each 32-chunk in `[even | odd]` order.
    pub(crate) q: Vec<i8>,
    /// Scale per block.
    pub(crate) scales: Vec<f32>,
    /// `Σ q_a` per block (over the real codes; padding is zero).
    pub(crate) sums: Vec<i32>,
    /// `scale_a · Σ q_a` per block: what a float zero point's offset multiplies.
    pub(crate) scaled_sums: Vec<f32>,
    pub(crate) natural: Vec<i8>,
}

impl QuantizedRow {
    /// Codes in K order, padded with zeros to whole blocks.
    pub(crate) fn natural(&self) -> &[i8] {
        &self.natural
    }

    /// `Σ q_a` per block.
    pub(crate) fn sums(&self) -> &[i32] {
        &self.sums
    }

    /// Scale per block.
    pub(crate) fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// `scale_a · Σ q_a` per block.
    pub(crate) fn scaled_sums(&self) -> &[f32] {
        &self.scaled_sums
    }

    /// Quantizes `a` (`k` values) with the reference's rounding; reuses its buffers. The
    /// even/odd interleaved codes the stored-layout kernel reads are made only when
    /// `interleave` (the packed kernel reads the natural order).
    pub(crate) fn quantize(&mut self, a: &[f32], block_size: usize, interleave: bool) {
        let (bs, kb) = (block_size, a.len().div_ceil(block_size));
        let padded = kb * bs;
        // Every code and scale is written below (the padding's codes explicitly), so the
        // buffers are only sized, not cleared.
        self.natural.resize(padded, 0);
        self.natural[a.len()..].fill(0);
        self.scales.resize(kb, 0.0);
        quantize_row(a, bs, &mut self.natural[..a.len()], &mut self.scales);
        self.sums.clear();
        self.sums
            .extend(self.natural[..padded].chunks(bs).map(block_sum));
        self.scaled_sums.clear();
        self.scaled_sums.extend(
            self.scales
                .iter()
                .zip(&self.sums)
                .map(|(&s, &sum)| s * sum as f32),
        );
        self.q.clear();
        if !interleave {
            return;
        }
        self.q.resize(padded, 0);
        for (src, dst) in self.natural.chunks(32).zip(self.q.chunks_mut(32)) {
            for i in 0..16 {
                dst[i] = src[2 * i];
                dst[16 + i] = src[2 * i + 1];
            }
        }
    }
}

/// `Σ q` of one block of codes.
fn block_sum(codes: &[i8]) -> i32 {
    codes.iter().map(|&v| i32::from(v)).sum()
}

thread_local! {
    /// Per-thread activation buffers, so a decode step allocates nothing once warm.
    static ROWS: RefCell<Vec<QuantizedRow>> = const { RefCell::new(Vec::new()) };
    /// Per-thread block statistics of a batch's rows (see [`with_rows_and_meta`]).
    static META: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with `m` quantized-row buffers of this thread.
pub(crate) fn with_rows<R>(m: usize, f: impl FnOnce(&mut [QuantizedRow]) -> R) -> R {
    ROWS.with(|rows| {
        let mut rows = rows.borrow_mut();
        if rows.len() < m {
            rows.resize_with(m, QuantizedRow::default);
        }
        f(&mut rows[..m])
    })
}

/// [`with_rows`], with `meta_len` values of this thread for the rows' block statistics as the
/// AVX-512 tile kernel reads them (`nbits::tile_io::Meta`).
pub(crate) fn with_rows_and_meta<R>(
    m: usize,
    meta_len: usize,
    f: impl FnOnce(&mut [QuantizedRow], &mut [f32]) -> R,
) -> R {
    META.with(|meta| {
        let mut meta = meta.borrow_mut();
        if meta.len() < meta_len {
            meta.resize(meta_len, 0.0);
        }
        with_rows(m, |rows| f(rows, &mut meta[..meta_len]))
    })
}
