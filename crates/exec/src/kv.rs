//! The memory of a paged KV cache: every layer's key and value block pools, and what a
//! `GroupQueryAttention` node needs to read and write them during one ragged step.
//!
//! The pools are one zeroed allocation that the OS commits page by page as blocks are first
//! written (large zeroed allocations are mapped lazily), so an idle pool of many blocks costs
//! address space, not memory. Blocks are handed out lowest first and each holds every layer,
//! which keeps what is touched compact.

use oxgen_kernels::attention::paged::{PagedLayout, Segment};
use oxgen_runtime::RuntimeError;
use oxgen_tensor::{DType, Element};

use crate::OpError;

/// Key and value block pools of every layer, block by block:
/// `[block][layer][key | value][kv_head][row][d]`, so one block of a sequence holds its keys
/// and values of every layer in one contiguous run. The memory takes ordinary pages, not
/// transparent huge ones: a server's pool is first touched inside steps as requests take
/// fresh blocks, and a huge-page fault may compact memory synchronously (batch-8 server
/// steps' p99 21 → 9 ms without them on a Zen 5, with `oxgen bench --batch 8` unchanged;
/// docs/PERFORMANCE.md).
pub struct KvStore {
    dtype: DType,
    /// One layer's pool as a view: blocks `layers * 2` pools' blocks apart.
    layout: PagedLayout,
    layers: usize,
    mem: Vec<u64>,
}

impl KvStore {
    /// Pools of `layout.blocks` blocks for `layers` layers of `dtype` (f32, f16 or bf16);
    /// `layout`'s stride is replaced by the store's.
    pub fn new(dtype: DType, layout: PagedLayout, layers: usize) -> Result<KvStore, RuntimeError> {
        let fail = |msg: String| RuntimeError::Backend(msg.into());
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(fail(format!(
                "a paged KV cache holds float32, float16 or bfloat16, not {dtype}"
            )));
        }
        let block_values = layout
            .kv_heads
            .checked_mul(layout.block_size)
            .and_then(|n| n.checked_mul(layout.head_size))
            .and_then(|n| n.checked_mul(2 * layers))
            .filter(|&n| n > 0 && layout.blocks > 0)
            .ok_or_else(|| fail(format!("KV pool {layout:?} x {layers} layers is empty")))?;
        let bytes = block_values
            .checked_mul(layout.blocks)
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
                "could not allocate {} MiB for the KV cache; lower --kv-memory (or --kv-blocks)",
                bytes >> 20
            ))
        };
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
            layout: PagedLayout {
                block_stride: block_values,
                ..layout
            },
            layers,
            mem,
        })
    }

    /// One layer's pool as the kernels see it (keys and values alike, each from its own
    /// offset: see [`KvStore::layer_views`]).
    pub fn layout(&self) -> &PagedLayout {
        &self.layout
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Bytes of one block across every layer's keys and values.
    pub fn block_bytes(&self) -> usize {
        self.layout.block_stride * self.dtype.bits() / 8
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: a `u64` buffer viewed as its bytes.
        unsafe { std::slice::from_raw_parts_mut(self.mem.as_mut_ptr().cast(), self.mem.len() * 8) }
    }

    /// The whole store as `T`, with where layer `layer`'s key and value pools start in it:
    /// `&pool[k..]` and `&pool[v..]` are views of [`KvStore::layout`].
    pub fn layer_views<T: Element>(
        &mut self,
        layer: usize,
    ) -> Result<(&mut [T], usize, usize), OpError> {
        if !T::views(self.dtype) || layer >= self.layers {
            return Err(OpError::value(format!(
                "the KV cache holds {} layers of {}; layer {layer} was asked for as {}",
                self.layers,
                self.dtype,
                T::DTYPE
            )));
        }
        let len = self.layout.blocks * self.layout.block_stride;
        // SAFETY: the buffer holds `len` values of the store's dtype, which `T` views
        // (checked above), and `u64` alignment covers every float type.
        let all = unsafe { std::slice::from_raw_parts_mut(self.mem.as_mut_ptr().cast::<T>(), len) };
        let k = 2 * layer * self.layout.block_len();
        Ok((all, k, k + self.layout.block_len()))
    }

    /// Copies block `src` into block `dst` (every layer's keys and values).
    pub fn copy_block(&mut self, src: u32, dst: u32) {
        let block = self.block_bytes();
        let (src, dst) = (src as usize * block, dst as usize * block);
        self.bytes_mut().copy_within(src..src + block, dst);
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
