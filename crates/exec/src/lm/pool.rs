//! The paged KV of a fused model: its block pool, sized once at open from the options and
//! the machine's memory, and the buffers a step reuses.

use oxgen_kernels::attention::paged::{PagedLayout, Segment};
use oxgen_runtime::{BlockFormat, BlockPool, BlockTable, DiskCache, LmContract, RuntimeError};
use oxgen_tensor::Tensor;

use super::fresh_kv;
use crate::kv::KvStore;
use crate::open::{DEFAULT_KV_BLOCKS, KV_BLOCK_SIZE, KvBudget, NativeOptions};

/// The paged KV of a fused model, and buffers a step reuses.
pub(super) struct Paged {
    pub(super) pool: BlockPool,
    pub(super) prefix_cache: bool,
    /// The prefix cache's disk tier, when asked for.
    pub(super) disk: Option<DiskCache>,
    /// How a block's bytes are laid out (the disk tier's and saved sessions' files).
    pub(super) format: BlockFormat,
    pub(super) store: KvStore,
    /// Per layer: the empty past tensors fed to the graph (attention reads the pool).
    pub(super) empty: Vec<[Option<Tensor>; 2]>,
    pub(super) segments: Vec<Segment>,
    pub(super) tables: Vec<u32>,
    /// Rows of the stacked batch whose logits are wanted.
    pub(super) rows: Vec<usize>,
}

impl Paged {
    /// The pool `options.memory.kv` asks for.
    pub(super) fn new(c: &LmContract, options: &NativeOptions) -> Result<Paged, RuntimeError> {
        let block_layout =
            |blocks| PagedLayout::dense(blocks, KV_BLOCK_SIZE, c.kv_heads, c.head_size);
        let kv = options.memory.kv_dtype.unwrap_or(c.graph_kv_dtype());
        let blocks = match options.memory.kv {
            KvBudget::Sequences(n) => sequence_blocks(
                n,
                options.memory.ctx_size.or(options.context_length),
                c.kv_bytes(kv, KV_BLOCK_SIZE),
                physical_memory(),
            ),
            KvBudget::Blocks(n) => n,
            KvBudget::Bytes(bytes) => (bytes / c.kv_bytes(kv, KV_BLOCK_SIZE).max(1)).max(1),
        };
        let store = KvStore::new(kv, block_layout(blocks), c.layers.len())?;
        let format = BlockFormat {
            kv,
            block_size: KV_BLOCK_SIZE,
            block_bytes: store.block_bytes(),
        };
        let disk = match &options.disk_cache {
            Some(tier) if options.memory.prefix_cache => Some(DiskCache::open(tier, format)?),
            _ => None,
        };
        Ok(Paged {
            pool: BlockPool::new(blocks, KV_BLOCK_SIZE)?,
            prefix_cache: options.memory.prefix_cache,
            disk,
            format,
            store,
            empty: fresh_kv(c, false, 0)?,
            segments: Vec::new(),
            tables: Vec::new(),
            rows: Vec::new(),
        })
    }

    /// Attaches `prompt`'s longest cached prefix (at most `limit` positions) to `table`:
    /// blocks the pool caches, then blocks the disk tier holds, read into fresh blocks.
    /// Returns the positions attached.
    pub(super) fn attach_prefix(
        &mut self,
        table: &mut BlockTable,
        prompt: &[u32],
        limit: usize,
    ) -> usize {
        let cached = self.pool.attach_prefix(table, prompt, limit);
        let Some(disk) = &mut self.disk else {
            return cached;
        };
        while let Some((key, end)) = self.pool.next_prefix(table, prompt, limit) {
            let Some(bytes) = disk.load(key, &prompt[..end]) else {
                break;
            };
            let b = self.pool.adopt_prefix(table, prompt);
            self.store.write_block(b, bytes);
        }
        table.blocks.len() * KV_BLOCK_SIZE
    }

    /// Registers the blocks of `table` that `ids` fills in the prefix cache, and queues the
    /// newly settled ones for the disk tier.
    pub(super) fn settle(&mut self, table: &mut BlockTable, ids: &[u32]) {
        let before = table.registered();
        self.pool.register_full(table, ids);
        let Some(disk) = &self.disk else {
            return;
        };
        let kept = table.kept();
        for i in before..table.registered() {
            let b = table.blocks[i];
            if let Some(key) = self.pool.key(b) {
                let prefix = &ids[..(i + 1) * KV_BLOCK_SIZE];
                let store = &mut self.store;
                disk.store(key, prefix, kept, |out| store.read_block(b, out));
            }
        }
    }
}

/// Blocks for `sequences` sequences of the whole `context` (at least [`DEFAULT_KV_BLOCKS`]),
/// but at most half of `memory` bytes at `block_bytes` a block: a long-context package
/// (Llama 3.2's 131072 positions: 60 GB of f32 KV for two sequences of its 3B model) would
/// otherwise ask for more than the machine has and fail to open.
pub(super) fn sequence_blocks(
    sequences: usize,
    context: Option<usize>,
    block_bytes: usize,
    memory: Option<usize>,
) -> usize {
    let want = context.map_or(DEFAULT_KV_BLOCKS, |len| {
        DEFAULT_KV_BLOCKS.max(sequences.saturating_mul(len.div_ceil(KV_BLOCK_SIZE)))
    });
    let fits = memory.map_or(usize::MAX, |m| m / 2 / block_bytes.max(1));
    want.min(fits).max(1)
}

/// The machine's physical memory in bytes, where the system says.
fn physical_memory() -> Option<usize> {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no preconditions.
        let (pages, page) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        usize::try_from(pages)
            .ok()
            .zip(usize::try_from(page).ok())
            .map(|(pages, page)| pages.saturating_mul(page))
            .filter(|&m| m > 0)
    }
    #[cfg(not(unix))]
    None
}

#[cfg(test)]
mod kv_budget_tests {
    use super::*;

    #[test]
    fn the_default_kv_pool_fits_in_half_the_memory() {
        const GIB: usize = 1 << 30;
        // Two sequences of 4096 positions: 512 blocks, raised to the default's 1024.
        assert_eq!(
            sequence_blocks(2, Some(4096), 1 << 20, Some(24 * GIB)),
            1024
        );
        // Two of 131072 (16384 blocks of 3.7 MB, Llama 3.2 3B's f32 KV): 60 GB; 24 GB of
        // memory holds 3510 of them in its half.
        let block = 28 * 8 * 128 * 2 * 4 * KV_BLOCK_SIZE;
        assert_eq!(
            sequence_blocks(2, Some(131072), block, Some(24 * GIB)),
            12 * GIB / block
        );
        // Unknown memory: what the context asks for; unknown context: the default.
        assert_eq!(sequence_blocks(2, Some(131072), block, None), 16384);
        assert_eq!(sequence_blocks(2, None, block, Some(24 * GIB)), 1024);
        // Never none.
        assert_eq!(sequence_blocks(2, Some(131072), block, Some(1 << 20)), 1);
    }
}
