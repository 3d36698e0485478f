//! The memory of a paged KV cache: every layer's key and value block pools, and what a
//! `GroupQueryAttention` node needs to read and write them during one ragged step.
//!
//! The pools are one zeroed allocation that the OS commits page by page as blocks are first
//! written (large zeroed allocations are mapped lazily), so an idle pool of many blocks costs
//! address space, not memory. Blocks are handed out lowest first and each holds every layer,
//! which keeps what is touched compact.

use oxgen_kernels::attention::kv::{CacheElem, CacheKind, KvMem};
use oxgen_kernels::attention::paged::{PagedLayout, Segment};
use oxgen_runtime::{KvDtype, RuntimeError};

use crate::OpError;

/// Key and value block pools of every layer, block by block:
/// `[block][layer][key | value][kv_head][row][d]`, so one block of a sequence holds its keys
/// and values of every layer in one contiguous run. An int8 store keeps one f32 scale per
/// head vector in a second region laid out the same way without `d`
/// (`oxgen_kernels::attention::kv`). The memory takes ordinary pages, not transparent huge
/// ones: a server's pool is first touched inside steps as requests take fresh blocks, and a
/// huge-page fault may compact memory synchronously (batch-8 server steps' p99 21 → 9 ms
/// without them on a Zen 5, with `oxgen bench --batch 8` unchanged; docs/PERFORMANCE.md).
pub struct KvStore {
    kv: KvDtype,
    /// One layer's pool as a view: blocks `layers * 2` pools' blocks apart.
    layout: PagedLayout,
    layers: usize,
    mem: Vec<u64>,
    /// Where the scales start in `mem`, in words (the end of `mem` when there are none).
    scales_at: usize,
}

impl KvStore {
    /// Pools of `layout.blocks` blocks for `layers` layers of `kv`; `layout`'s stride is
    /// replaced by the store's.
    pub fn new(kv: KvDtype, layout: PagedLayout, layers: usize) -> Result<KvStore, RuntimeError> {
        let fail = |msg: String| RuntimeError::Backend(msg.into());
        let block_values = layout
            .kv_heads
            .checked_mul(layout.block_size)
            .and_then(|n| n.checked_mul(layout.head_size))
            .and_then(|n| n.checked_mul(2 * layers))
            .filter(|&n| n > 0 && layout.blocks > 0)
            .ok_or_else(|| fail(format!("KV pool {layout:?} x {layers} layers is empty")))?;
        let scales = if kv == KvDtype::Int8 {
            block_values / layout.head_size
        } else {
            0
        };
        let words = |values: usize, bytes: usize| {
            values
                .checked_mul(layout.blocks)
                .and_then(|n| n.checked_mul(bytes))
                .map(|b| b.div_ceil(8))
        };
        let (value_words, scale_words) = words(block_values, kv.dtype().bits() / 8)
            .zip(words(scales, 4))
            .filter(|(v, s)| v.saturating_add(*s) <= isize::MAX as usize / 16)
            .ok_or_else(|| {
                fail(format!(
                    "a KV pool of {layout:?} x {layers} layers overflows"
                ))
            })?;
        let total = value_words + scale_words;
        let too_big = || {
            fail(format!(
                "could not allocate {} MiB for the KV cache ({} blocks of {} positions); ask \
                 for fewer positions: a smaller --ctx-size, or serve's --kv-memory, --kv-blocks \
                 or --max-batch",
                (total * 8) >> 20,
                layout.blocks,
                layout.block_size
            ))
        };
        let layout_bytes = std::alloc::Layout::array::<u64>(total).map_err(|_| too_big())?;
        // Zeroed by the allocator (fresh pages for a large pool), not written here.
        // SAFETY: the layout's size is not zero (checked above).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout_bytes) }.cast::<u64>();
        if ptr.is_null() {
            return Err(too_big());
        }
        // SAFETY: allocated above by the global allocator with the layout of `total` u64s,
        // all initialized (zero).
        let mem = unsafe { Vec::from_raw_parts(ptr, total, total) };
        Ok(KvStore {
            kv,
            layout: PagedLayout {
                block_stride: block_values,
                ..layout
            },
            layers,
            mem,
            scales_at: value_words,
        })
    }

    /// One layer's pool as the kernels see it (keys and values alike, each from its own
    /// offset: see [`KvStore::layer_views`]).
    pub fn layout(&self) -> &PagedLayout {
        &self.layout
    }

    pub fn kv_dtype(&self) -> KvDtype {
        self.kv
    }

    /// Bytes of one block across every layer's keys and values, scales included.
    pub fn block_bytes(&self) -> usize {
        self.layout.block_stride / self.layout.head_size * self.kv.head_bytes(self.layout.head_size)
    }

    /// The whole store as elements of `C` and their scales, with where layer `layer`'s key
    /// and value pools start in it: from `k` and `v` on, the memory holds views of
    /// [`KvStore::layout`].
    pub fn layer_views<C: CacheElem>(
        &mut self,
        layer: usize,
    ) -> Result<(KvMem<'_, C>, usize, usize), OpError> {
        if C::KIND != kind(self.kv) || layer >= self.layers {
            return Err(OpError::value(format!(
                "the KV cache holds {} layers of {}; layer {layer} was asked for as {:?}",
                self.layers,
                self.kv,
                C::KIND
            )));
        }
        let len = self.layout.blocks * self.layout.block_stride;
        let scales = if C::SCALED {
            len / self.layout.head_size
        } else {
            0
        };
        let (values, rest) = self.mem.split_at_mut(self.scales_at);
        // SAFETY: `values` holds `len` elements of the store's kind, which `C` is (checked
        // above), and `u64` alignment covers every element type; `rest` holds `scales` f32
        // (allocated so in `new`).
        let mem = unsafe {
            KvMem {
                values: std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<C>(), len),
                scales: std::slice::from_raw_parts_mut(rest.as_mut_ptr().cast::<f32>(), scales),
            }
        };
        let k = 2 * layer * self.layout.block_len();
        Ok((mem, k, k + self.layout.block_len()))
    }

    /// The store as bytes: values, then scales; and the byte ranges of one block in each.
    fn block_bytes_of(&mut self, b: u32) -> (&mut [u8], [std::ops::Range<usize>; 2]) {
        let value_block = self.layout.block_stride * (self.kv.dtype().bits() / 8);
        let scale_block = match self.kv {
            KvDtype::Int8 => self.layout.block_stride / self.layout.head_size * 4,
            _ => 0,
        };
        // SAFETY: a `u64` buffer viewed as its bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(self.mem.as_mut_ptr().cast::<u8>(), self.mem.len() * 8)
        };
        let (b, scales) = (b as usize, self.scales_at * 8);
        let ranges = [
            b * value_block..(b + 1) * value_block,
            scales + b * scale_block..scales + (b + 1) * scale_block,
        ];
        (bytes, ranges)
    }

    /// Copies block `src` into block `dst` (every layer's keys and values, and their scales).
    pub fn copy_block(&mut self, src: u32, dst: u32) {
        let (_, to) = self.block_bytes_of(dst);
        let (bytes, from) = self.block_bytes_of(src);
        for (from, to) in from.into_iter().zip(to) {
            bytes.copy_within(from, to.start);
        }
    }

    /// Block `b`'s bytes ([`KvStore::block_bytes`] of them: values, then scales) into `out`.
    pub fn read_block(&mut self, b: u32, out: &mut [u8]) {
        let (bytes, ranges) = self.block_bytes_of(b);
        let mut at = 0;
        for r in ranges {
            out[at..at + r.len()].copy_from_slice(&bytes[r.clone()]);
            at += r.len();
        }
    }

    /// Fills block `b` from bytes [`KvStore::read_block`] gave.
    pub fn write_block(&mut self, b: u32, from: &[u8]) {
        let (bytes, ranges) = self.block_bytes_of(b);
        let mut at = 0;
        for r in ranges {
            let n = r.len();
            bytes[r].copy_from_slice(&from[at..at + n]);
            at += n;
        }
    }
}

/// The kernels' element kind a store of `kv` holds.
fn kind(kv: KvDtype) -> CacheKind {
    match kv {
        KvDtype::F32 => CacheKind::F32,
        KvDtype::F16 => CacheKind::F16,
        KvDtype::BF16 => CacheKind::BF16,
        KvDtype::Int8 => CacheKind::I8,
    }
}

/// What one ragged step hands the executor: the pools, each sequence's rows and blocks
/// (each attention node reads the layer it was lowered with).
pub struct PagedStep<'a> {
    pub store: &'a mut KvStore,
    pub segments: &'a [Segment],
    pub tables: &'a [u32],
}

/// One attention node's view of a [`PagedStep`].
pub struct PagedLayer<'a> {
    pub store: &'a mut KvStore,
    pub layer: usize,
    pub segments: &'a [Segment],
    pub tables: &'a [u32],
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An int8 store's blocks carry their scales: views hand out both, a copied block holds
    /// both, and the bytes per block count both.
    #[test]
    fn an_int8_store_keeps_and_copies_its_scales() {
        let (layers, hs) = (2, 8);
        let layout = PagedLayout::dense(4, 2, 3, hs);
        let mut store = KvStore::new(KvDtype::Int8, layout, layers).unwrap();
        // Per block: 2 layers x 2 pools x 3 heads x 2 rows, each head vector 8 bytes + 4.
        assert_eq!(store.block_bytes(), 2 * 2 * 3 * 2 * (hs + 4));
        assert!(
            store.layer_views::<f32>(0).is_err(),
            "an int8 store is not f32"
        );
        let stride = store.layout().block_stride;
        {
            let (mem, k, v) = store.layer_views::<i8>(1).unwrap();
            assert_eq!(mem.scales.len(), mem.values.len() / hs);
            for (i, x) in mem.values[stride..2 * stride].iter_mut().enumerate() {
                *x = (i % 127) as i8;
            }
            for (i, s) in mem.scales[stride / hs..2 * stride / hs]
                .iter_mut()
                .enumerate()
            {
                *s = i as f32 + 0.5;
            }
            assert!(k < v && v < stride);
        }
        store.copy_block(1, 3);
        let (mem, _, _) = store.layer_views::<i8>(0).unwrap();
        assert_eq!(
            mem.values[stride..2 * stride],
            mem.values[3 * stride..4 * stride]
        );
        assert_eq!(
            mem.scales[stride / hs..2 * stride / hs],
            mem.scales[3 * stride / hs..4 * stride / hs]
        );
        assert!(
            mem.scales[3 * stride / hs + 1] == 1.5,
            "the scales were copied, not zeros"
        );
    }

    /// A block read out and written into another block reads back the same, scales too.
    #[test]
    fn a_block_read_out_fills_another_block_with_the_same_bytes() {
        let mut store = KvStore::new(KvDtype::Int8, PagedLayout::dense(3, 2, 2, 8), 2).unwrap();
        {
            let (mem, _, _) = store.layer_views::<i8>(1).unwrap();
            mem.values
                .iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = (i % 101) as i8);
            mem.scales
                .iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = i as f32);
        }
        let mut one = vec![0; store.block_bytes()];
        store.read_block(1, &mut one);
        assert!(one.iter().any(|&b| b != 0));
        store.write_block(2, &one);
        let mut two = vec![0; store.block_bytes()];
        store.read_block(2, &mut two);
        assert_eq!(one, two);
        store.read_block(0, &mut two);
        assert_ne!(one, two, "blocks 0 and 1 hold different bytes");
    }

    #[test]
    fn float_stores_have_no_scales() {
        let layout = PagedLayout::dense(2, 4, 1, 16);
        for (kv, bytes) in [(KvDtype::F32, 4), (KvDtype::F16, 2)] {
            let store = KvStore::new(kv, layout, 1).unwrap();
            assert_eq!(store.block_bytes(), 2 * 4 * 16 * bytes);
        }
        let mut f16 = KvStore::new(KvDtype::F16, layout, 1).unwrap();
        let (mem, _, _) = f16.layer_views::<half::f16>(0).unwrap();
        assert!(mem.scales.is_empty());
    }
}
