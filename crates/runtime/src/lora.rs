//! LoRA adapters as a backend takes them: low-rank products by the projection they apply to,
//! `y = x W + (x A) B` with the adapter's scale already folded into `B`.
//!
//! A module is named as Hugging Face names it (`model.layers.3.self_attn.q_proj`,
//! `model.layers.3.mlp.gate_proj`), whatever the file spelled (an `.onnx_adapter`'s graph
//! input names, a PEFT folder's tensor names): the reader maps names to this spelling
//! (`oxgen-import`), the backend maps it to the node computing that projection (or its slice
//! of a packed one).

/// One projection's low-rank product.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraModule {
    /// The projection, as Hugging Face names it (`model.layers.0.self_attn.q_proj`).
    pub module: String,
    pub rank: usize,
    pub in_features: usize,
    pub out_features: usize,
    /// `A`, `[in_features, rank]` row-major (`x A` is the first product).
    pub a: Vec<f32>,
    /// `B`, `[rank, out_features]` row-major, times the adapter's scale.
    pub b: Vec<f32>,
}

impl LoraModule {
    /// Bytes its two matrices hold.
    pub fn nbytes(&self) -> usize {
        (self.a.len() + self.b.len()) * 4
    }
}

/// An adapter: its low-rank products, and a key naming its contents (it seeds the prefix
/// cache's keys, so blocks computed under one adapter never serve another or the base).
#[derive(Debug, Clone, PartialEq)]
pub struct Adapter {
    pub modules: Vec<LoraModule>,
    pub key: u64,
}

impl Adapter {
    /// Bytes its matrices hold.
    pub fn nbytes(&self) -> usize {
        self.modules.iter().map(LoraModule::nbytes).sum()
    }

    /// Its largest rank.
    pub fn rank(&self) -> usize {
        self.modules.iter().map(|m| m.rank).max().unwrap_or(0)
    }
}

/// An adapter a backend holds ([`crate::LanguageModel::load_adapter`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AdapterId(pub u32);
