//! Lowering: each node of a graph becomes the op that runs it, owning what it runs with
//! beyond its inputs ([`Lowered`]): its weights repacked for its kernel (`MatMulNBits` for
//! the int8 kernel, a `MatMul`'s f32 `B` in column tiles, a QMoE node's experts), the
//! sessions of its branches or bodies, the paged KV layer an attention node reads. Weights
//! are let go as they are packed (an initializer only packed nodes read leaves the graph,
//! and the file pages it was read from go back to the OS), so nothing is resident twice.

use std::cell::{RefCell, RefMut};
use std::ops::Range;
use std::sync::Arc;

use half::slice::HalfFloatSliceExt;
use oxgen_graph::ops::MatMulNBits;
use oxgen_graph::{Graph, Index, Op, ValueId};
use oxgen_kernels::ThreadPool;
use oxgen_kernels::integer::PackedI8;
use oxgen_kernels::matmul::{self as km, PACKED_TILE, PackedF32};
use oxgen_kernels::nbits::PackedNBits;
use oxgen_tensor::DType;
use oxgen_tensor::Tensor;

use crate::NativeSession;
use crate::ops::{self, moe::PackedExperts};

/// What a node runs with beyond its inputs.
pub enum Lowered {
    /// Its inputs alone.
    Plain,
    /// `MatMulNBits` weights (one matrix, a group side by side, or a gate and up pair)
    /// repacked at load for the int8 kernel.
    NBits(PackedNBits),
    /// A `MatMul`'s f32 `B` (an `Attention`'s QKV weights) packed at load in column tiles.
    Tiles(PackedF32),
    /// A `MatMulInteger`'s (or `MatMulIntegerToFloat`'s) int8 `B` packed at load for the VNNI
    /// kernel.
    Int8(PackedI8),
    /// A QMoE node: its experts repacked for their kernel once the session is told it has
    /// no weight budget ([`NativeSession::set_weight_budget`]); `None` before, or under a
    /// budget (which counts the files' experts, so it drops the copies).
    Experts(Option<PackedExperts>),
    /// `If`, `Loop`, `Scan`: a session per branch or body (run by the node through a shared
    /// reference, as every lowered op is; a node never re-enters its own subgraphs).
    Control(Vec<RefCell<NativeSession>>),
    /// A `GroupQueryAttention` node of a paged language model: the layer of the paged KV
    /// cache it reads and writes in a ragged step ([`NativeSession::page_kv`]).
    KvLayer(usize),
}

impl Lowered {
    pub fn nbits(&self) -> Option<&PackedNBits> {
        match self {
            Lowered::NBits(p) => Some(p),
            _ => None,
        }
    }

    pub fn tiles(&self) -> Option<&PackedF32> {
        match self {
            Lowered::Tiles(t) => Some(t),
            _ => None,
        }
    }

    pub fn int8(&self) -> Option<&PackedI8> {
        match self {
            Lowered::Int8(p) => Some(p),
            _ => None,
        }
    }

    pub(crate) fn experts(&self) -> Option<&PackedExperts> {
        match self {
            Lowered::Experts(e) => e.as_ref(),
            _ => None,
        }
    }

    /// The session of a control-flow node's subgraph `k` (none for another node, or while
    /// folding constants).
    pub fn subgraph(&self, k: usize) -> Option<RefMut<'_, NativeSession>> {
        match self {
            Lowered::Control(s) => s.get(k).map(RefCell::borrow_mut),
            _ => None,
        }
    }

    pub fn kv_layer(&self) -> Option<usize> {
        match self {
            Lowered::KvLayer(l) => Some(*l),
            _ => None,
        }
    }
}

/// Lowers every node of `graph` (see the module doc): subgraphs move into sessions of their
/// own on `pool`, weights are packed and let go. QMoE experts wait for the weight budget
/// (`Lowered::Experts(None)`).
pub(crate) fn lower(graph: &mut Graph, pool: &Arc<ThreadPool>, exact: bool) -> Vec<Lowered> {
    // Packing removes initializers, never nodes: one index of readers serves both passes.
    let index = Index::new(graph);
    let packed = prepack_weights(graph, &index, exact);
    let tiles = prepack_f32(graph, &index);
    let int8 = prepack_i8(graph);
    let mut lowered = Vec::with_capacity(graph.nodes.len());
    for (((node, packed), tiles), int8) in graph.nodes.iter_mut().zip(packed).zip(tiles).zip(int8) {
        let subgraphs: Vec<RefCell<NativeSession>> = (node.op.subgraphs_mut().into_iter())
            .map(|sub| {
                let sub = std::mem::take(&mut sub.graph);
                RefCell::new(NativeSession::with_pool(sub, pool.clone(), exact))
            })
            .collect();
        lowered.push(match (packed, tiles) {
            (Some(p), _) => Lowered::NBits(p),
            (_, Some(t)) => Lowered::Tiles(t),
            _ if int8.is_some() => Lowered::Int8(int8.expect("checked")),
            _ if !subgraphs.is_empty() => Lowered::Control(subgraphs),
            _ if matches!(node.op, Op::Moe(_)) => Lowered::Experts(None),
            _ => Lowered::Plain,
        });
    }
    lowered
}

/// The `MatMulNBits` attributes of a node's parts (one for `MatMulNBits`, several for a
/// group, gate and up for a `MatMulNBitsGlu`), each with the index of its first weight input (B; scales and zero points follow).
fn nbits_parts(op: &Op) -> Vec<(&MatMulNBits, usize)> {
    let parts: &[MatMulNBits] = match op {
        Op::MatMulNBits(m) => std::slice::from_ref(m),
        Op::MatMulNBitsGroup(parts) => parts,
        Op::MatMulNBitsGlu(parts) => parts,
        _ => &[],
    };
    parts
        .iter()
        .enumerate()
        .map(|(p, m)| (m, 1 + 3 * p))
        .collect()
}

/// Repacks the weights of every int8-activation `MatMulNBits` node (and group) whose weights
/// are initializers ([`oxgen_kernels::nbits::PackedNBits`]), then lets go of the originals: an
/// initializer only packed nodes read leaves the graph, and the file pages it was read from
/// are handed back to the OS, so the weights are not resident twice.
fn prepack_weights(graph: &mut Graph, index: &Index, exact: bool) -> Vec<Option<PackedNBits>> {
    let mut packed: Vec<Option<PackedNBits>> = vec![None; graph.nodes.len()];
    // A weight that another node reads too, or whose bytes another initializer holds (a tied
    // embedding's `GatherBlockQuantized` reads the output head's codes, often through a folded
    // `Reshape` view), keeps its pages: else every lookup would read them back from disk.
    let spans: Vec<(ValueId, Range<usize>)> = graph
        .initializers
        .iter()
        .filter(|(_, t)| t.is_shared())
        .map(|(&id, t)| (id, byte_span(t)))
        .collect();
    let keeps_pages = |id: ValueId, t: &Tensor| {
        let span = byte_span(t);
        index.readers(id) != 1
            || spans
                .iter()
                .any(|(other, s)| *other != id && s.start < span.end && span.start < s.end)
    };
    for (slot, node) in packed.iter_mut().zip(&graph.nodes) {
        let parts = nbits_parts(&node.op);
        let input = |k: usize| node.inputs.get(k).copied().flatten();
        let init = |id: Option<ValueId>| id.and_then(|id| graph.initializers.get(&id));
        if parts.is_empty()
            || !parts
                .iter()
                .all(|(op, _)| ops::quant::int8_activations(op, exact))
            || matches!(node.op, Op::MatMulNBits(_)) && input(4).is_some()
        {
            continue;
        }
        let Some(weights) = parts
            .iter()
            .map(|&(op, at)| {
                let zero_points = match input(at + 2) {
                    None => None,
                    Some(id) => Some(graph.initializers.get(&id)?),
                };
                Some((op, init(input(at))?, init(input(at + 1))?, zero_points))
            })
            .collect::<Option<Vec<_>>>()
        else {
            continue;
        };
        *slot = match (&node.op, weights.as_slice()) {
            (Op::MatMulNBitsGlu(_), &[gate, up]) => ops::quant::prepack_glu([gate, up]),
            _ => ops::quant::prepack(&weights),
        };
        if slot.is_some() {
            // Right away, so the load never holds every matrix twice.
            for (&(_, at), (_, b, scales, zero_points)) in parts.iter().zip(weights) {
                let tensors = [Some(b), Some(scales), zero_points];
                for (k, t) in tensors.into_iter().enumerate() {
                    if let (Some(id), Some(t)) = (input(at + k), t)
                        && !keeps_pages(id, t)
                    {
                        page_out(t);
                    }
                }
            }
        }
    }
    let weights: Vec<ValueId> = graph
        .nodes
        .iter()
        .zip(&packed)
        .filter(|(_, p)| p.is_some())
        .flat_map(|(n, _)| {
            nbits_parts(&n.op)
                .into_iter()
                .flat_map(|(_, at)| n.inputs.iter().skip(at).take(3).flatten().copied())
        })
        .collect();
    for id in weights {
        let only_packed_readers = index.consumers[id.0].iter().all(|&i| packed[i].is_some());
        if only_packed_readers && !index.is_output[id.0] {
            graph.initializers.remove(&id);
        }
    }
    packed
}

/// Packs the `B` of every `MatMul` node (the QKV weights of every `Attention`) whose `B` is a
/// 2-D f32 initializer mapped from the model file and read by that node alone into column
/// tiles ([`PackedF32`]), so a product streams contiguous memory, then hands the file pages of the original back to the OS (the
/// tensor stays in the graph, for its shape; it is read again only if something else reads
/// it). An f16 or bf16 `B` (an fp16 package) is widened to f32 tiles the same way: the CPU
/// has no f16 arithmetic, and the f32 kernel is the fast one (memory holds f32 weights).
/// Nothing where the CPU has no vector kernel to stream them.
fn prepack_f32(graph: &Graph, index: &Index) -> Vec<Option<PackedF32>> {
    (graph.nodes.iter())
        .map(|node| {
            let id = (matches!(node.op, Op::MatMul | Op::Attention(_))
                && km::f32_kernel_available())
            .then(|| node.inputs.get(1).copied().flatten())??;
            let b = graph.initializers.get(&id)?;
            let &[k, n] = b.dims() else {
                return None;
            };
            let sole = index.sole_reader(id).is_some();
            if !b.is_shared() || !sole || n < PACKED_TILE {
                return None;
            }
            let widened = |convert: &dyn Fn(&mut [f32])| {
                let mut w = vec![0f32; k * n];
                convert(&mut w);
                w
            };
            let values: std::borrow::Cow<[f32]> = match b.dtype() {
                DType::F32 => b.as_slice::<f32>().ok()?.into(),
                DType::F16 => {
                    let b = b.as_slice::<half::f16>().ok()?;
                    widened(&|w| b.convert_to_f32_slice(w)).into()
                }
                DType::BF16 => {
                    let b = b.as_slice::<half::bf16>().ok()?;
                    widened(&|w| b.convert_to_f32_slice(w)).into()
                }
                _ => return None,
            };
            let packed = PackedF32::pack(&values, k, n).ok()?;
            page_out(b);
            Some(packed)
        })
        .collect()
}

/// Packs the int8 `B` of every `MatMulInteger` (or `MatMulIntegerToFloat`) node whose `B` is a 2-D int8 initializer
/// ([`PackedI8`]) where the CPU runs the VNNI kernel; the original stays (it is small, and
/// a uint8 `A` is not known until the node runs).
fn prepack_i8(graph: &Graph) -> Vec<Option<PackedI8>> {
    (graph.nodes.iter())
        .map(|node| {
            let product = matches!(node.op, Op::MatMulInteger | Op::MatMulIntegerToFloat);
            let id = (product && PackedI8::available())
                .then(|| node.inputs.get(1).copied().flatten())??;
            let b = graph.initializers.get(&id)?;
            let &[k, n] = b.dims() else {
                return None;
            };
            if b.dtype() != oxgen_tensor::DType::I8 {
                return None;
            }
            PackedI8::pack(b.as_slice::<i8>().ok()?, k, n).ok()
        })
        .collect()
}

/// Repacks the experts of every QMoE node whose weights are initializers and whose kernel
/// takes them repacked (`crate::ops::moe::prepack`), then hands the file pages of the originals
/// back to the OS: they are read again only if a weight budget later sends the node back to
/// them.
pub(crate) fn prepack_experts(graph: &Graph, exact: bool) -> Vec<Option<PackedExperts>> {
    (graph.nodes.iter())
        .map(|node| {
            let Op::Moe(op) = &node.op else {
                return None;
            };
            let inputs: Vec<Option<&Tensor>> = (node.inputs.iter())
                .map(|id| id.and_then(|id| graph.initializers.get(&id)))
                .collect();
            let packed = ops::moe::prepack(op, &inputs, exact)?;
            let at = op.inputs();
            let zero_points = at.zero_points.map_or([None; 2], |z| [Some(z.0), Some(z.1)]);
            let weights = [at.fc1.0, at.fc2.0].into_iter().map(Some);
            let scales = [at.fc1, at.fc2].map(|(w, s, _)| Some(s.unwrap_or(w + 1)));
            for k in weights.chain(scales).chain(zero_points).flatten() {
                if let Some(Some(t)) = inputs.get(k) {
                    page_out(t);
                }
            }
            Some(packed)
        })
        .collect()
}

/// The addresses of a tensor's bytes.
fn byte_span(t: &Tensor) -> Range<usize> {
    let bytes = t.as_bytes();
    let start = bytes.as_ptr() as usize;
    start..start + bytes.len()
}

/// Hands the resident pages of a tensor mapped from the model file back to the OS; they are
/// read from the file again if something touches them. `MADV_PAGEOUT` is only a hint: it never
/// changes what the memory holds.
fn page_out(t: &Tensor) {
    #[cfg(target_os = "linux")]
    if t.is_shared() {
        let bytes = t.as_bytes();
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let (addr, len) = (bytes.as_ptr() as usize, bytes.len());
        let start = addr.next_multiple_of(page);
        let end = (addr + len) / page * page;
        if end > start {
            // SAFETY: whole pages inside the tensor's live bytes; PAGEOUT does not alter their
            // contents (mapped file pages are re-read on the next access).
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_PAGEOUT);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = t;
}

/// Per node, the bytes of weight matrix a run of it reads when it is not repacked (see
/// [`NativeSession::streamed_weight_bytes`]); 0 for repacked and other nodes.
pub(crate) fn unpacked_matrix_bytes(graph: &Graph, lowered: &[Lowered]) -> Vec<u64> {
    let init = |id: &Option<ValueId>| {
        id.and_then(|id| graph.initializers.get(&id))
            .map_or(0, |t| t.nbytes() as u64)
    };
    graph
        .nodes
        .iter()
        .zip(lowered)
        .map(|(node, lowered)| match (&node.op, lowered) {
            (_, Lowered::NBits(_)) => 0,
            (Op::MatMulNBits(_) | Op::MatMulNBitsGroup(_) | Op::MatMulNBitsGlu(_), _) => node
                .inputs
                .iter()
                .skip(1)
                .take(3 * nbits_parts(&node.op).len())
                .map(init)
                .sum(),
            (Op::MatMul | Op::Gemm(_), _) => node.inputs.iter().take(2).map(init).sum(),
            _ => 0,
        })
        .collect()
}
