//! A Hugging Face checkpoint's tensors -> the graph's weights, one layer at a time, each
//! checked against `config.json` and converted to the chosen [`Precision`] as it is read.
//!
//! Names are transformers': `model.embed_tokens`, `model.norm`, `lm_head` (absent when tied),
//! and per layer `model.layers.N.{input_layernorm, post_attention_layernorm,
//! self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj}` with optional biases, Qwen3's and Gemma
//! 3's `self_attn.{q,k}_norm`, Phi-3's fused `self_attn.qkv_proj` and `mlp.gate_up_proj`
//! (split by rows, which quantizes the same: blocks run along a row), Gemma's
//! `pre_feedforward_layernorm` and `post_feedforward_layernorm` (its norms store `w` for
//! `(1 + w)`; the 1 is added here), and gpt-oss's `self_attn.sinks`, `mlp.router` and MXFP4
//! experts `mlp.experts.{gate_up,down}_proj_{blocks,scales,bias}`, moved into QMoE's layout
//! as they are. A tensor the graph would not use is an error, as for GGUF.

use std::collections::HashSet;

use oxgen_gguf::repack;
use oxgen_tensor::{AlignedBuf, DType, Tensor};

use super::config::HfConfig;
use crate::arch::Arch;
use crate::genai_graph::{
    Embedding, EndWeights, ExpertWeights, LayerWeights, Linear, Mlp, Mxfp4Experts, NBitsLinear,
};
use crate::safetensors::Checkpoint;
use crate::weights::split_rows;
use crate::{ImportError, Precision, Progress, Stage, quantize};

/// `MatMulNBits` block size, the builder's.
pub const BLOCK_SIZE: usize = 32;

pub(super) struct Reader<'a> {
    ck: &'a Checkpoint,
    cfg: &'a HfConfig,
    precision: Precision,
    used: HashSet<String>,
    progress: &'a dyn Fn(&Progress),
    total: usize,
}

impl<'a> Reader<'a> {
    pub fn new(
        ck: &'a Checkpoint,
        cfg: &'a HfConfig,
        precision: Precision,
        progress: &'a dyn Fn(&Progress),
    ) -> Reader<'a> {
        Reader {
            ck,
            cfg,
            precision,
            used: HashSet::new(),
            progress,
            total: ck.names().count(),
        }
    }

    fn mark(&mut self, name: &str) -> Result<(), ImportError> {
        if !self.ck.contains(name) {
            return Err(ImportError::Tensor {
                file: self.ck.file(name).path().to_path_buf(),
                tensor: name.to_string(),
                problem: format!(
                    "is missing; a {} checkpoint of this config.json has it (the download is \
                     incomplete, or the weights are of another model)",
                    self.cfg.class
                ),
            });
        }
        self.used.insert(name.to_string());
        (self.progress)(&Progress {
            stage: Stage::Tensors,
            done: self.used.len(),
            total: self.total,
            item: name,
        });
        Ok(())
    }

    /// Tensor `name` as f32 of shape `dims` (a copy: its mapped pages are released).
    fn f32(&mut self, name: &str, dims: &[usize]) -> Result<Tensor, ImportError> {
        self.mark(name)?;
        let file = self.ck.file(name);
        let t = file.f32(name, dims)?;
        file.release(name);
        Ok(t)
    }

    /// A norm's weight `[len]`; Gemma's `(1 + w)` with the 1 added.
    fn norm(&mut self, name: &str, len: usize) -> Result<Tensor, ImportError> {
        let t = self.f32(name, &[len])?;
        if matches!(self.cfg.hp.arch, Arch::Gemma2 | Arch::Gemma3) {
            let plus_one: Vec<f32> = t
                .as_slice::<f32>()
                .unwrap_or(&[])
                .iter()
                .map(|w| w + 1.0)
                .collect();
            return Ok(Tensor::from_slice([len], &plus_one).expect("same length"));
        }
        Ok(t)
    }

    /// `{prefix}.bias` `[n]` when the checkpoint has one that is not all zeros (a zero bias
    /// changes nothing, and the builder leaves it out too).
    fn bias(&mut self, prefix: &str, n: usize) -> Result<Option<Tensor>, ImportError> {
        let name = format!("{prefix}.bias");
        if !self.ck.contains(&name) {
            return Ok(None);
        }
        let b = self.f32(&name, &[n])?;
        let zero = b
            .as_slice::<f32>()
            .is_ok_and(|v| v.iter().all(|&x| x == 0.0));
        Ok((!zero).then_some(b))
    }

    /// The f32 weight `{prefix}.weight` `[n, k]` (and its bias), not yet converted.
    fn weight(
        &mut self,
        prefix: &str,
        n: usize,
        k: usize,
    ) -> Result<(Tensor, Option<Tensor>), ImportError> {
        let weight = self.f32(&format!("{prefix}.weight"), &[n, k])?;
        Ok((weight, self.bias(prefix, n)?))
    }

    /// Projection `prefix` (`[n, k]`) at the import's precision.
    fn linear(&mut self, prefix: &str, n: usize, k: usize) -> Result<Linear, ImportError> {
        let (weight, bias) = self.weight(prefix, n, k)?;
        Ok(self.convert(weight, bias))
    }

    /// An f32 `[n, k]` weight at the import's precision: `MatMulNBits` blocks for int4 and
    /// int8, as it is for fp32.
    fn convert(&self, weight: Tensor, bias: Option<Tensor>) -> Linear {
        match self.precision.bits() {
            Some(bits) => Linear::NBits(nbits(weight, bias, bits)),
            None => Linear::Float { weight, bias },
        }
    }

    /// The embedding, final norm and head. A tied int4/int8 head is quantized once and the
    /// embedding gathers from the same blocks (`GatherBlockQuantized`), as the builder
    /// writes it; an untied quantized model keeps an f32 embedding, as the builder does.
    pub fn ends(&mut self, tied: bool) -> Result<EndWeights, ImportError> {
        let (h, vocab) = (self.cfg.hp.hidden, self.cfg.vocab);
        let table = self.f32("model.embed_tokens.weight", &[vocab, h])?;
        let final_norm = self.norm("model.norm.weight", h)?;
        if !tied {
            let head = self.linear("lm_head", vocab, h)?;
            return Ok(EndWeights {
                embedding: Embedding::Float(table),
                final_norm,
                head,
            });
        }
        let bits = self
            .precision
            .bits()
            .filter(|_| h.is_multiple_of(BLOCK_SIZE));
        let Some(bits) = bits else {
            let head = self.convert(table.clone(), None);
            return Ok(EndWeights {
                embedding: Embedding::Float(table),
                final_norm,
                head,
            });
        };
        // Quantized in place, stored once: the embedding gathers from the head's blocks.
        let head = Linear::NBits(nbits(table, None, bits));
        let embedding = Embedding::HeadBlocks;
        Ok(EndWeights {
            embedding,
            final_norm,
            head,
        })
    }

    /// Layer `l`'s weights.
    pub fn layer(&mut self, l: usize) -> Result<LayerWeights, ImportError> {
        let hp = &self.cfg.hp;
        let (arch, h, hd, ff) = (hp.arch, hp.hidden, hp.head_size, hp.intermediate);
        let (q_out, kv_out) = (hp.heads * hd, hp.kv_heads * hd);
        let (heads, experts) = (hp.heads, hp.experts);
        let gemma = matches!(arch, Arch::Gemma2 | Arch::Gemma3);
        let p = format!("model.layers.{l}");
        let input_norm = self.norm(&format!("{p}.input_layernorm.weight"), h)?;
        let (q, k, v) = if arch.fused_projections() {
            // Rows convert alike alone or fused (blocks run along a row), so the fused
            // projection is converted once and split as GGUF's are.
            let qkv = self.linear(&format!("{p}.self_attn.qkv_proj"), q_out + 2 * kv_out, h)?;
            let [q, k, v] = split_rows(qkv, [q_out, kv_out, kv_out]);
            (q, k, v)
        } else {
            (
                self.linear(&format!("{p}.self_attn.q_proj"), q_out, h)?,
                self.linear(&format!("{p}.self_attn.k_proj"), kv_out, h)?,
                self.linear(&format!("{p}.self_attn.v_proj"), kv_out, h)?,
            )
        };
        let qk_norm = if arch.qk_norm() {
            Some([
                self.norm(&format!("{p}.self_attn.q_norm.weight"), hd)?,
                self.norm(&format!("{p}.self_attn.k_norm.weight"), hd)?,
            ])
        } else {
            None
        };
        let o = self.linear(&format!("{p}.self_attn.o_proj"), h, q_out)?;
        let sinks = match arch {
            Arch::GptOss => Some(self.f32(&format!("{p}.self_attn.sinks"), &[heads])?),
            _ => None,
        };
        // Gemma: `pre_feedforward_layernorm` is the norm before the MLP; the norms after
        // attention and after the MLP join the residual stream's inputs.
        let (post_norm, out_norms) = if gemma {
            let post = self.norm(&format!("{p}.pre_feedforward_layernorm.weight"), h)?;
            let outs = [
                self.norm(&format!("{p}.post_attention_layernorm.weight"), h)?,
                self.norm(&format!("{p}.post_feedforward_layernorm.weight"), h)?,
            ];
            (post, Some(outs))
        } else {
            (
                self.norm(&format!("{p}.post_attention_layernorm.weight"), h)?,
                None,
            )
        };
        let mlp = match experts {
            Some(e) => Mlp::Experts(self.experts(&p, e.count)?),
            None if arch.fused_projections() => {
                let gate_up = self.linear(&format!("{p}.mlp.gate_up_proj"), 2 * ff, h)?;
                let [gate, up] = split_rows(gate_up, [ff, ff]);
                Mlp::Dense {
                    gate,
                    up,
                    down: self.linear(&format!("{p}.mlp.down_proj"), h, ff)?,
                }
            }
            None => Mlp::Dense {
                gate: self.linear(&format!("{p}.mlp.gate_proj"), ff, h)?,
                up: self.linear(&format!("{p}.mlp.up_proj"), ff, h)?,
                down: self.linear(&format!("{p}.mlp.down_proj"), h, ff)?,
            },
        };
        Ok(LayerWeights {
            input_norm,
            qk_norm,
            q,
            k,
            v,
            o,
            sinks,
            post_norm,
            mlp,
            out_norms,
        })
    }

    /// gpt-oss's mixture: the router (a projection with bias) and the MXFP4 experts as the
    /// checkpoint stores them (`*_blocks` `[E, rows, k / 32, 16]`, two codes a byte with the
    /// even input low; `*_scales` `[E, rows, k / 32]` e8m0 exponents; `*_bias` `[E, rows]`),
    /// gate and up already interleaved in `gate_up_proj` as QMoE's SwiGLU takes them.
    fn experts(&mut self, p: &str, count: usize) -> Result<ExpertWeights, ImportError> {
        let (h, ff) = (self.cfg.hp.hidden, self.cfg.hp.intermediate);
        let router = self.linear(&format!("{p}.mlp.router"), count, h)?;
        let mut mxfp4 = |proj: &str, rows: usize, k: usize| -> Result<Mxfp4Experts, ImportError> {
            let prefix = format!("{p}.mlp.experts.{proj}");
            if !k.is_multiple_of(32) || !rows.is_multiple_of(2) {
                return Err(ImportError::Tensor {
                    file: self.ck.file(&prefix).path().to_path_buf(),
                    tensor: format!("{prefix}_blocks"),
                    problem: format!(
                        "has {k} inputs and {rows} outputs; MXFP4 experts need inputs in whole blocks of 32 and an even number of outputs"
                    ),
                });
            }
            let blocks_name = format!("{prefix}_blocks");
            let scales_name = format!("{prefix}_scales");
            self.mark(&blocks_name)?;
            self.mark(&scales_name)?;
            let blocks = self
                .ck
                .file(&blocks_name)
                .u8(&blocks_name, &[count, rows, k / 32, 16])?;
            let scales = self
                .ck
                .file(&scales_name)
                .u8(&scales_name, &[count, rows, k / 32])?;
            let ggml = ggml_mxfp4(blocks, scales);
            self.ck.file(&blocks_name).release(&blocks_name);
            self.ck.file(&scales_name).release(&scales_name);
            let q = repack::mxfp4_to_qmoe(&[&ggml], count, rows, k);
            let bias = self.f32(&format!("{prefix}_bias"), &[count, rows])?;
            Ok(Mxfp4Experts {
                codes: Tensor::from_buf(
                    DType::U8,
                    &[count, k, rows / 2][..],
                    AlignedBuf::from_bytes(&q.codes),
                )
                .expect("sizes match"),
                scales: Tensor::from_buf(
                    DType::F8E8M0,
                    &[count, rows, k / 32][..],
                    AlignedBuf::from_bytes(&q.scales),
                )
                .expect("sizes match"),
                bias,
            })
        };
        let gate_up = mxfp4("gate_up_proj", 2 * ff, h)?;
        let down = mxfp4("down_proj", h, ff)?;
        Ok(ExpertWeights {
            router,
            gate_up,
            down,
        })
    }

    /// Counts `name` as read without reading it.
    pub fn skip(&mut self, name: &str) {
        self.used.insert(name.to_string());
    }

    /// Fails on a tensor no step read: it belongs to a feature the graph lacks. (Older
    /// checkpoints' `rotary_emb.inv_freq` buffers are derived from config.json and skipped.)
    pub fn check_all_used(&self) -> Result<(), ImportError> {
        let unused = |n: &&str| !self.used.contains(*n) && !n.ends_with(".rotary_emb.inv_freq");
        match self.ck.names().find(unused) {
            None => Ok(()),
            Some(extra) => Err(ImportError::Tensor {
                file: self.ck.file(extra).path().to_path_buf(),
                tensor: extra.to_string(),
                problem: format!(
                    "is not part of the {} graph oxgen writes (a layer beyond \
                     num_hidden_layers {}, or a feature the graph lacks); importing without it \
                     would change the model's results",
                    self.cfg.class, self.cfg.hp.layers
                ),
            }),
        }
    }
}

/// An f32 `[n, k]` weight as `MatMulNBits` blocks of `bits` (see [`quantize`]).
fn nbits(weight: Tensor, bias: Option<Tensor>, bits: u32) -> NBitsLinear {
    let (n, k) = (weight.dims()[0], weight.dims()[1]);
    let values = weight.as_slice::<f32>().unwrap_or(&[]);
    let q = quantize::symmetric(values, n, k, bits, BLOCK_SIZE);
    let block_bytes = BLOCK_SIZE * bits as usize / 8;
    let codes = AlignedBuf::from_bytes(&q.codes);
    NBitsLinear {
        k,
        n,
        bits,
        block_size: BLOCK_SIZE,
        b: Tensor::from_buf(DType::U8, &[n, q.blocks, block_bytes][..], codes)
            .expect("sizes match"),
        scales: Tensor::from_slice([n, q.blocks], &q.scales).expect("sizes match"),
        zero_points: None,
        bias,
    }
}

/// MXFP4 blocks as the checkpoint stores them (16 bytes of two codes each, element `2i` in
/// byte `i`'s low nibble, and one exponent byte per block) -> ggml's `block_mxfp4` (the
/// exponent, then byte `j` holding element `j` low and element `j + 16` high).
fn ggml_mxfp4(blocks: &[u8], scales: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(scales.len() * 17);
    for (block, &e) in blocks.chunks_exact(16).zip(scales) {
        let mut codes = [0u8; 32];
        for (i, &byte) in block.iter().enumerate() {
            codes[2 * i] = byte & 0x0F;
            codes[2 * i + 1] = byte >> 4;
        }
        out.push(e);
        out.extend((0..16).map(|j| codes[j] | (codes[j + 16] << 4)));
    }
    out
}
