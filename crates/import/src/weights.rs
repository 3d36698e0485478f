//! GGUF tensors -> [`DecoderWeights`]: every tensor's shape checked against the
//! architecture numbers, quantized weights repacked without requantization, and llama.cpp's
//! Q/K row permutation undone.
//!
//! Tensor names follow llama.cpp (`gguf-py` `gguf/tensor_mapping.py`): `token_embd`,
//! `output_norm`, `output` (absent when the head is tied to the embedding), `rope_freqs`,
//! and per layer `blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate,
//! ffn_up, ffn_down}.weight` plus optional `attn_{q,k,v,output}.bias`, Qwen3's
//! `attn_{q,k}_norm.weight`, Gemma 2's `post_attention_norm` and `post_ffw_norm`, and
//! Phi-3's fused `attn_qkv` and `ffn_up` (gate and up) with `rope_factors_{short,long}`, and
//! gpt-oss's `attn_sinks`, `post_attention_norm` (its norm before the MLP), router
//! `ffn_gate_inp` and MXFP4 experts `ffn_{gate,up,down}_exps` with their biases. A tensor
//! outside this list is an error: it would belong to a feature the graph lacks.
//!
//! # Undoing the Q/K permutation
//!
//! For Llama-family models llama.cpp's converter reorders each head's Q and K rows so that
//! its interleaved ("GPT-J") rotary pairs rows `(2i, 2i + 1)`: `convert_hf_to_gguf.py`'s
//! `permute` reshapes the rows as `(n_head, 2, head_size / 2)` and swaps the last two axes.
//! The graph uses Hugging Face's `rotate_half` order (`rotary_interleaved = 0`, pairs
//! `(i, i + head_size / 2)`) like onnxruntime-genai's builder, so the rows are put back:
//! Hugging Face row `h·d + j·d/2 + i` is GGUF row `h·d + 2i + j`. A row is a whole output
//! feature (its blocks, scales and zero points), so rows move intact: no requantization.

use std::collections::HashSet;

use oxgen_gguf::{GgmlType, GgufFile, Requantized, TensorInfo, repack};
use oxgen_tensor::{AlignedBuf, DType, Tensor};

use crate::arch::{Arch, ExpertParams, HParams};
use crate::genai_graph::{
    DecoderWeights, Embedding, ExpertWeights, LayerWeights, Linear, Mlp, Mxfp4Experts, NBitsLinear,
};
use crate::{ImportError, Progress, Stage};

/// ggml types `MatMulNBits` takes (all as they are but Q5_K and Q6_K, requantized to int8).
const REPACKABLE: [GgmlType; 6] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];
/// Float types kept as f32 `MatMul` / `Gather` weights.
const FLOAT: [GgmlType; 3] = [GgmlType::F32, GgmlType::F16, GgmlType::BF16];

struct Reader<'a> {
    file: &'a GgufFile,
    hp: &'a HParams,
    used: HashSet<String>,
    progress: &'a dyn Fn(&Progress),
    total: usize,
    /// Weights that had to be requantized, with what it cost.
    requantized: Vec<(String, Requantized)>,
}

impl Reader<'_> {
    fn path(&self) -> std::path::PathBuf {
        self.file.path().to_path_buf()
    }

    /// Tensor `name`, required, with GGUF dims `expected` (`[K, N]` for a weight).
    fn tensor(
        &mut self,
        name: &str,
        expected: &[usize],
        why: &str,
    ) -> Result<TensorInfo, ImportError> {
        let t = self.file.tensor(name).map_err(|_| ImportError::Tensor {
            file: self.path(),
            tensor: name.to_string(),
            problem: format!(
                "is missing; a {} model needs it (the file is incomplete or of another architecture)",
                self.hp.arch.name()
            ),
        })?;
        let expected: Vec<u64> = expected.iter().map(|&d| d as u64).collect();
        if t.dims != expected {
            return Err(ImportError::BadShape {
                file: self.path(),
                tensor: name.to_string(),
                found: t.dims.clone(),
                expected,
                why: why.to_string(),
            });
        }
        self.used.insert(name.to_string());
        (self.progress)(&Progress {
            stage: Stage::Tensors,
            done: self.used.len(),
            total: self.total,
            item: name,
        });
        Ok(t.clone())
    }

    fn unsupported(&self, t: &TensorInfo, role: &str, supported: &[GgmlType]) -> ImportError {
        ImportError::Unsupported {
            file: self.path(),
            what: format!("tensor '{}' of type {} ({role})", t.name, t.ggml_type),
            hint: format!(
                "supported types here: {}; convert the model with one of them",
                supported
                    .iter()
                    .map(|t| t.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// A float vector (norm weight, bias, rope factors) as f32 `[len]`.
    fn vector(&mut self, name: &str, len: usize, why: &str) -> Result<Tensor, ImportError> {
        let t = self.tensor(name, &[len], why)?;
        if !FLOAT.contains(&t.ggml_type) {
            return Err(self.unsupported(&t, "a vector", &FLOAT));
        }
        Ok(self.file.dequantize(name)?)
    }

    fn optional_vector(
        &mut self,
        name: &str,
        len: usize,
        why: &str,
    ) -> Result<Option<Tensor>, ImportError> {
        if self.file.tensor(name).is_err() {
            return Ok(None);
        }
        self.vector(name, len, why).map(Some)
    }

    /// A projection `[K, N]` (GGUF dims), rows un-permuted for `permute_heads` heads when set.
    fn linear(
        &mut self,
        name: &str,
        (k, n): (usize, usize),
        why: &str,
        permute_heads: Option<usize>,
        bias: Option<Tensor>,
    ) -> Result<Linear, ImportError> {
        let t = self.tensor(name, &[k, n], why)?;
        let unpermute = |t: Tensor| match permute_heads {
            Some(heads) => unpermute_rows(t, n, heads),
            None => t,
        };
        if REPACKABLE.contains(&t.ggml_type) {
            let w = self.file.matmul_nbits(name)?;
            if let Some(cost) = w.requantized {
                self.requantized.push((name.to_string(), cost));
            }
            return Ok(Linear::NBits(NBitsLinear {
                k: w.k,
                n: w.n,
                bits: w.bits,
                block_size: w.block_size,
                b: unpermute(w.b),
                scales: unpermute(w.scales),
                zero_points: w.zero_points.map(unpermute),
                bias,
            }));
        }
        if FLOAT.contains(&t.ggml_type) {
            let weight = unpermute(self.file.dequantize(name)?);
            return Ok(Linear::Float { weight, bias });
        }
        let all: Vec<GgmlType> = REPACKABLE.iter().chain(&FLOAT).copied().collect();
        Err(self.unsupported(&t, "a projection", &all))
    }

    fn bias(
        &mut self,
        name: &str,
        n: usize,
        permute_heads: Option<usize>,
    ) -> Result<Option<Tensor>, ImportError> {
        let b = self.optional_vector(name, n, "a bias has one value per output feature")?;
        Ok(match permute_heads {
            Some(heads) => b.map(|b| unpermute_rows(b, n, heads)),
            None => b,
        })
    }
}

/// Undoes `permute` on a tensor whose bytes are `rows` equal rows (`heads` heads of
/// `rows / heads` rows each): output row `h·d + j·d/2 + i` is input row `h·d + 2i + j`.
fn unpermute_rows(t: Tensor, rows: usize, heads: usize) -> Tensor {
    let bytes = t.as_bytes();
    let row = bytes.len() / rows;
    debug_assert_eq!(row * rows, bytes.len(), "tensor splits into whole rows");
    let (d, half) = (rows / heads, rows / heads / 2);
    let mut buf = AlignedBuf::zeroed(bytes.len());
    let out = buf.as_mut_bytes();
    for h in 0..heads {
        for j in 0..2 {
            for i in 0..half {
                let (dst, src) = (h * d + j * half + i, h * d + 2 * i + j);
                out[dst * row..(dst + 1) * row].copy_from_slice(&bytes[src * row..(src + 1) * row]);
            }
        }
    }
    Tensor::from_buf(t.dtype(), t.dims(), buf).expect("same dtype, dims and byte count")
}

impl Reader<'_> {
    /// Layer `p`'s mixture (llama.cpp's gpt-oss tensors): the router `ffn_gate_inp` (f32
    /// weight and bias) and the MXFP4 experts `ffn_{gate,up,down}_exps` with f32 biases, the
    /// gate and up rows interleaved into SwiGLU's pairs as QMoE takes them.
    fn experts(&mut self, p: &str, e: ExpertParams) -> Result<ExpertWeights, ImportError> {
        let (h, ff, n) = (self.hp.hidden, self.hp.intermediate, e.count);
        let why_router = format!("[embedding_length {h}, expert_count {n}]");
        let bias = self.bias(&format!("{p}.ffn_gate_inp.bias"), n, None)?;
        let router = self.linear(
            &format!("{p}.ffn_gate_inp.weight"),
            (h, n),
            &why_router,
            None,
            bias,
        )?;
        let why_up =
            format!("[embedding_length {h}, expert_feed_forward_length {ff}, expert_count {n}]");
        let why_down =
            format!("[expert_feed_forward_length {ff}, embedding_length {h}, expert_count {n}]");
        let gate = self.mxfp4(&format!("{p}.ffn_gate_exps.weight"), [h, ff, n], &why_up)?;
        let up = self.mxfp4(&format!("{p}.ffn_up_exps.weight"), [h, ff, n], &why_up)?;
        let down = self.mxfp4(&format!("{p}.ffn_down_exps.weight"), [ff, h, n], &why_down)?;
        let why_bias = |w: usize| format!("[{w}, expert_count {n}]: one bias per expert output");
        let bias2 = |r: &mut Self, name: &str, w: usize| -> Result<Vec<f32>, ImportError> {
            let t = r.tensor(name, &[w, n], &why_bias(w))?;
            if !FLOAT.contains(&t.ggml_type) {
                return Err(r.unsupported(&t, "an expert bias", &FLOAT));
            }
            Ok(r.file
                .dequantize(name)?
                .as_slice::<f32>()
                .map(<[f32]>::to_vec)
                .unwrap_or_default())
        };
        let gate_b = bias2(self, &format!("{p}.ffn_gate_exps.bias"), ff)?;
        let up_b = bias2(self, &format!("{p}.ffn_up_exps.bias"), ff)?;
        let down_b = bias2(self, &format!("{p}.ffn_down_exps.bias"), h)?;
        let gate_up_b: Vec<f32> = gate_b
            .chunks_exact(ff)
            .zip(up_b.chunks_exact(ff))
            .flat_map(|(g, u)| g.iter().zip(u).flat_map(|(&g, &u)| [g, u]))
            .collect();
        let (gate_data, up_data, down_data) = (
            self.file.tensor_data(&gate.name)?,
            self.file.tensor_data(&up.name)?,
            self.file.tensor_data(&down.name)?,
        );
        let fc1 = repack::mxfp4_to_qmoe(&[gate_data, up_data], n, ff, h);
        let fc2 = repack::mxfp4_to_qmoe(&[down_data], n, h, ff);
        let experts =
            |q: repack::QMoeMxfp4, (rows, k): (usize, usize), bias: Vec<f32>| Mxfp4Experts {
                codes: Tensor::from_slice([n, k, rows / 2], &q.codes).expect("sizes match"),
                scales: Tensor::from_buf(
                    DType::F8E8M0,
                    &[n, rows, k / 32][..],
                    AlignedBuf::from_bytes(&q.scales),
                )
                .expect("sizes match"),
                bias: Tensor::from_slice([n, rows], &bias).expect("sizes match"),
            };
        Ok(ExpertWeights {
            router,
            gate_up: experts(fc1, (2 * ff, h), gate_up_b),
            down: experts(fc2, (h, ff), down_b),
        })
    }

    /// An MXFP4 expert tensor with GGUF dims `dims`: `[inputs, outputs, experts]`, inputs in
    /// whole blocks of 32.
    fn mxfp4(
        &mut self,
        name: &str,
        dims: [usize; 3],
        why: &str,
    ) -> Result<TensorInfo, ImportError> {
        let t = self.tensor(name, &dims, why)?;
        if t.ggml_type != GgmlType::MXFP4 {
            return Err(self.unsupported(&t, "mixture-of-experts weights", &[GgmlType::MXFP4]));
        }
        if !dims[0].is_multiple_of(32) || !dims[1].is_multiple_of(2) {
            return Err(ImportError::BadShape {
                file: self.path(),
                tensor: name.to_string(),
                found: t.dims.clone(),
                expected: dims.iter().map(|&d| d as u64).collect(),
                why:
                    "MXFP4 experts need inputs in whole blocks of 32 and an even number of outputs"
                        .into(),
            });
        }
        Ok(t)
    }
}

/// What [`read`] returns: the weights, the rotary frequency factors when the file has them,
/// and the weights that were requantized.
pub struct Read {
    pub weights: DecoderWeights,
    pub rope_freqs: Option<Vec<f32>>,
    /// LongRoPE's short and long factors (`rope_factors_short`, `rope_factors_long`).
    pub long_rope_factors: Option<[Vec<f32>; 2]>,
    pub requantized: Vec<(String, Requantized)>,
}

/// The first `parts[0]` output features of a fused projection, the next `parts[1]`, ...:
/// a feature is a whole row of every tensor (blocks, scales, zero points), so rows move intact.
pub(crate) fn split_rows<const P: usize>(w: Linear, parts: [usize; P]) -> [Linear; P] {
    let (_, n) = w.dims();
    debug_assert_eq!(parts.iter().sum::<usize>(), n, "the parts cover every row");
    let rows = |t: &Tensor, from: usize, count: usize| {
        let row = t.as_bytes().len() / n;
        let bytes = &t.as_bytes()[from * row..(from + count) * row];
        let mut dims = t.dims().to_vec();
        dims[0] = dims[0] / n * count;
        Tensor::from_buf(t.dtype(), &dims[..], AlignedBuf::from_bytes(bytes))
            .expect("whole rows of the same dtype")
    };
    let mut from = 0;
    parts.map(|count| {
        let part = match &w {
            Linear::NBits(w) => Linear::NBits(NBitsLinear {
                k: w.k,
                n: count,
                bits: w.bits,
                block_size: w.block_size,
                b: rows(&w.b, from, count),
                scales: rows(&w.scales, from, count),
                zero_points: w.zero_points.as_ref().map(|z| rows(z, from, count)),
                bias: w.bias.as_ref().map(|b| rows(b, from, count)),
            }),
            Linear::Float { weight, bias } => Linear::Float {
                weight: rows(weight, from, count),
                bias: bias.as_ref().map(|b| rows(b, from, count)),
            },
        };
        from += count;
        part
    })
}

/// Reads and converts all weights, reporting each tensor to `progress`.
pub fn read(
    file: &GgufFile,
    hp: &HParams,
    vocab: usize,
    progress: &dyn Fn(&Progress),
) -> Result<Read, ImportError> {
    let mut r = Reader {
        file,
        hp,
        used: HashSet::new(),
        progress,
        total: file.tensors().len(),
        requantized: Vec::new(),
    };
    let (h, hd) = (hp.hidden, hp.head_size);
    let (q_out, kv_out, ff) = (hp.heads * hd, hp.kv_heads * hd, hp.intermediate);
    let why_q = format!(
        "[embedding_length {h}, head_count {} × head size {hd}]",
        hp.heads
    );
    let why_kv = format!(
        "[embedding_length {h}, head_count_kv {} × head size {hd}]",
        hp.kv_heads
    );
    let why_o = format!(
        "[head_count {} × head size {hd}, embedding_length {h}]",
        hp.heads
    );
    let why_up = format!("[embedding_length {h}, feed_forward_length {ff}]");
    let why_down = format!("[feed_forward_length {ff}, embedding_length {h}]");
    let why_norm = format!("[embedding_length {h}]");
    let why_embd = format!("[embedding_length {h}, {vocab} tokens in tokenizer.ggml.tokens]");
    let (qp, kp) = if hp.arch.permutes_qk() {
        (Some(hp.heads), Some(hp.kv_heads))
    } else {
        (None, None)
    };

    let embd = r.tensor("token_embd.weight", &[h, vocab], &why_embd)?;
    let embedding = match embd.ggml_type {
        GgmlType::Q4_0 | GgmlType::Q8_0 | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
            let w = file.gather_block_quantized("token_embd.weight")?;
            if let Some(cost) = w.requantized {
                r.requantized.push(("token_embd.weight".into(), cost));
            }
            Embedding::BlockQuantized {
                data: w.data,
                scales: w.scales,
                bits: w.bits,
                block_size: w.block_size,
            }
        }
        // Q4_1's float minimum has no GatherBlockQuantized form (integer zero points): the
        // table is dequantized, exactly. (K-quant tables are requantized to int8 above.)
        GgmlType::Q4_1 | GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
            Embedding::Float(file.dequantize("token_embd.weight")?)
        }
        _ => {
            let supported = [
                GgmlType::Q4_0,
                GgmlType::Q8_0,
                GgmlType::Q4_1,
                GgmlType::Q4_K,
                GgmlType::Q5_K,
                GgmlType::Q6_K,
                GgmlType::F32,
                GgmlType::F16,
                GgmlType::BF16,
            ];
            return Err(r.unsupported(&embd, "the token embedding", &supported));
        }
    };
    let head = if file.tensor("output.weight").is_ok() {
        r.linear("output.weight", (h, vocab), &why_embd, None, None)?
    } else {
        // Tied: the head reads the embedding's bytes (already marked used).
        r.used.remove("token_embd.weight");
        r.linear("token_embd.weight", (h, vocab), &why_embd, None, None)?
    };
    let rope_freqs = r
        .optional_vector(
            "rope_freqs.weight",
            hp.rotary_dim / 2,
            "one factor per rotary frequency",
        )?
        .map(|t| t.as_slice::<f32>().map(<[f32]>::to_vec).unwrap_or_default());
    let long_rope_factors = match hp.long_rope {
        Some(_) => {
            let mut factors = |name: &str| -> Result<Vec<f32>, ImportError> {
                let t = r.vector(
                    name,
                    hp.rotary_dim / 2,
                    "LongRoPE: one factor per rotary frequency",
                )?;
                Ok(t.as_slice::<f32>().map(<[f32]>::to_vec).unwrap_or_default())
            };
            Some([
                factors("rope_factors_short.weight")?,
                factors("rope_factors_long.weight")?,
            ])
        }
        None => None,
    };

    let mut layers = Vec::with_capacity(hp.layers);
    for l in 0..hp.layers {
        let p = format!("blk.{l}");
        let input_norm = r.vector(&format!("{p}.attn_norm.weight"), h, &why_norm)?;
        let qk_norm = if hp.arch.qk_norm() {
            let why = format!("[head size {hd}]: one weight per element of a Q or K head");
            Some([
                r.vector(&format!("{p}.attn_q_norm.weight"), hd, &why)?,
                r.vector(&format!("{p}.attn_k_norm.weight"), hd, &why)?,
            ])
        } else {
            None
        };
        let (q, k, v) = if hp.arch.fused_projections() {
            let why = format!("[embedding_length {h}, Q {q_out} + K {kv_out} + V {kv_out}]");
            let qkv = r.linear(
                &format!("{p}.attn_qkv.weight"),
                (h, q_out + 2 * kv_out),
                &why,
                None,
                None,
            )?;
            let [q, k, v] = split_rows(qkv, [q_out, kv_out, kv_out]);
            (q, k, v)
        } else {
            let bq = r.bias(&format!("{p}.attn_q.bias"), q_out, qp)?;
            let q = r.linear(&format!("{p}.attn_q.weight"), (h, q_out), &why_q, qp, bq)?;
            let bk = r.bias(&format!("{p}.attn_k.bias"), kv_out, kp)?;
            let k = r.linear(&format!("{p}.attn_k.weight"), (h, kv_out), &why_kv, kp, bk)?;
            let bv = r.bias(&format!("{p}.attn_v.bias"), kv_out, None)?;
            let v = r.linear(
                &format!("{p}.attn_v.weight"),
                (h, kv_out),
                &why_kv,
                None,
                bv,
            )?;
            (q, k, v)
        };
        let bo = r.bias(&format!("{p}.attn_output.bias"), h, None)?;
        let o = r.linear(
            &format!("{p}.attn_output.weight"),
            (q_out, h),
            &why_o,
            None,
            bo,
        )?;
        // gpt-oss names its norm before the MLP after attention, as Hugging Face does.
        let post_norm_name = match hp.arch {
            Arch::GptOss => "post_attention_norm",
            _ => "ffn_norm",
        };
        let post_norm = r.vector(&format!("{p}.{post_norm_name}.weight"), h, &why_norm)?;
        let sinks = match hp.arch {
            Arch::GptOss => {
                let why = format!("[head_count {}]: one attention sink per head", hp.heads);
                Some(r.vector(&format!("{p}.attn_sinks.weight"), hp.heads, &why)?)
            }
            _ => None,
        };
        let out_norms = if hp.gemma.is_some() {
            Some([
                r.vector(&format!("{p}.post_attention_norm.weight"), h, &why_norm)?,
                r.vector(&format!("{p}.post_ffw_norm.weight"), h, &why_norm)?,
            ])
        } else {
            None
        };
        if let Some(experts) = hp.experts {
            layers.push(LayerWeights {
                input_norm,
                qk_norm,
                out_norms,
                q,
                k,
                v,
                o,
                sinks,
                post_norm,
                mlp: Mlp::Experts(r.experts(&p, experts)?),
            });
            continue;
        }
        let (gate, up) = if hp.arch.fused_projections() {
            let why = format!("[embedding_length {h}, gate {ff} + up {ff}]");
            let gate_up = r.linear(&format!("{p}.ffn_up.weight"), (h, 2 * ff), &why, None, None)?;
            let [gate, up] = split_rows(gate_up, [ff, ff]);
            (gate, up)
        } else {
            let gate = r.linear(
                &format!("{p}.ffn_gate.weight"),
                (h, ff),
                &why_up,
                None,
                None,
            )?;
            let up = r.linear(&format!("{p}.ffn_up.weight"), (h, ff), &why_up, None, None)?;
            (gate, up)
        };
        let down = r.linear(
            &format!("{p}.ffn_down.weight"),
            (ff, h),
            &why_down,
            None,
            None,
        )?;
        layers.push(LayerWeights {
            input_norm,
            qk_norm,
            out_norms,
            q,
            k,
            v,
            o,
            sinks,
            post_norm,
            mlp: Mlp::Dense { gate, up, down },
        });
    }
    let final_norm = r.vector("output_norm.weight", h, &why_norm)?;
    if let Some(extra) = file.tensors().iter().find(|t| !r.used.contains(&t.name)) {
        return Err(ImportError::Tensor {
            file: r.path(),
            tensor: extra.name.clone(),
            problem: format!(
                "is not part of the {} graph oxgen writes (a layer beyond block_count {}, or a \
                 feature the graph lacks); importing without it would change the \
                 model's results",
                hp.arch.name(),
                hp.layers
            ),
        });
    }
    let weights = DecoderWeights {
        embedding,
        layers,
        final_norm,
        head,
    };
    Ok(Read {
        weights,
        rope_freqs,
        long_rope_factors,
        requantized: r.requantized,
    })
}
