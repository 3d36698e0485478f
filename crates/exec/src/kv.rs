//! The memory of a paged KV cache: every layer's key and value block pools, and what a
//! `GroupQueryAttention` node needs to read and write them during one ragged step.
//!
//! The pools are one zeroed allocation that the OS commits page by page as blocks are first
//! written (large zeroed allocations are mapped lazily), so an idle pool of many blocks costs
//! address space, not memory. Blocks are handed out lowest first, which keeps what is touched
//! compact.

use oxgen_kernels::attention_paged::{PagedLayout, Segment};
use oxgen_runtime::RuntimeError;
use oxgen_tensor::{DType, Element};

use crate::OpError;

/// Key and value block pools of every layer: `[layer][key | value][block][kv_head][row][d]`.
pub struct KvStore {
    dtype: DType,
    layout: PagedLayout,
    layers: usize,
    /// Values per pool (one layer's keys or values).
    pool_len: usize,
    mem: Vec<u64>,
}

impl KvStore {
    /// Pools of `layout.blocks` blocks for `layers` layers of `dtype` (f32, f16 or bf16).
    pub fn new(dtype: DType, layout: PagedLayout, layers: usize) -> Result<KvStore, RuntimeError> {
        let fail = |msg: String| RuntimeError::Backend(msg.into());
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(fail(format!(
                "a paged KV cache holds float32, float16 or bfloat16, not {dtype}"
            )));
        }
        let pool_len = layout
            .cache_len()
            .filter(|&n| n > 0)
            .ok_or_else(|| fail(format!("KV pool {layout:?} is empty or too large")))?;
        let bytes = pool_len
            .checked_mul(2 * layers)
            .and_then(|n| n.checked_mul(dtype.bits() / 8))
            .filter(|&b| b <= isize::MAX as usize / 2)
            .ok_or_else(|| {
                fail(format!(
                    "a KV pool of {layout:?} x {layers} layers overflows"
                ))
            })?;
        let words = bytes.div_ceil(8);
        let too_big = || {
            fail(format!(
                "could not allocate {} MiB for the KV cache; lower --kv-blocks",
                bytes >> 20
            ))
        };
        if words == 0 {
            return Err(fail("a KV pool needs at least one layer".into()));
        }
        let layout_bytes = std::alloc::Layout::array::<u64>(words).map_err(|_| too_big())?;
        // Zeroed by the allocator (fresh pages for a large pool), not written here.
        // SAFETY: the layout's size is not zero (checked above).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout_bytes) }.cast::<u64>();
        if ptr.is_null() {
            return Err(too_big());
        }
        // SAFETY: allocated above by the global allocator with the layout of `words` u64s,
        // all initialized (zero).
        let mem = unsafe { Vec::from_raw_parts(ptr, words, words) };
        Ok(KvStore {
            dtype,
            layout,
            layers,
            pool_len,
            mem,
        })
    }

    pub fn layout(&self) -> &PagedLayout {
        &self.layout
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Bytes of one block across every layer's keys and values.
    pub fn block_bytes(&self) -> usize {
        self.layers * 2 * self.pool_len / self.layout.blocks * self.dtype.bits() / 8
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: a `u64` buffer viewed as its bytes.
        unsafe { std::slice::from_raw_parts_mut(self.mem.as_mut_ptr().cast(), self.mem.len() * 8) }
    }

    /// Layer `layer`'s key and value pools as `T`.
    pub fn layer_mut<T: Element>(&mut self, layer: usize) -> Result<(&mut [T], &mut [T]), OpError> {
        if !T::views(self.dtype) || layer >= self.layers {
            return Err(OpError::value(format!(
                "the KV cache holds {} layers of {}; layer {layer} was asked for as {}",
                self.layers,
                self.dtype,
                T::DTYPE
            )));
        }
        let n = self.pool_len;
        // SAFETY: the buffer holds `2 * layers * n` values of the store's dtype, which `T`
        // views (checked above), and `u64` alignment covers every float type.
        let all = unsafe {
            std::slice::from_raw_parts_mut(self.mem.as_mut_ptr().cast::<T>(), 2 * self.layers * n)
        };
        let (k, v) = all[2 * layer * n..2 * (layer + 1) * n].split_at_mut(n);
        Ok((k, v))
    }

    /// Copies block `src` into block `dst` in every pool.
    pub fn copy_block(&mut self, src: u32, dst: u32) {
        let block = self.pool_len / self.layout.blocks * self.dtype.bits() / 8;
        let pool = self.pool_len * self.dtype.bits() / 8;
        let pools = 2 * self.layers;
        let bytes = self.bytes_mut();
        for p in 0..pools {
            let base = p * pool;
            bytes.copy_within(
                base + src as usize * block..base + (src as usize + 1) * block,
                base + dst as usize * block,
            );
        }
    }
}

/// What one ragged step hands the executor: the pools, each sequence's rows and blocks, and
/// which layer each attention node reads.
pub struct PagedStep<'a> {
    pub store: &'a mut KvStore,
    pub segments: &'a [Segment],
    pub tables: &'a [u32],
    /// Per node: the layer whose KV a `GroupQueryAttention` node reads.
    pub layer_of_node: &'a [Option<usize>],
}

/// One attention node's view of a [`PagedStep`].
pub struct PagedLayer<'a> {
    pub store: &'a mut KvStore,
    pub layer: usize,
    pub segments: &'a [Segment],
    pub tables: &'a [u32],
}
