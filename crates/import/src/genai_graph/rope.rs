//! The rotary caches: `cos`/`sin` of `position · θ_i`, `θ_i = base^(-2i / dim)` (`dim` the
//! rotating dimensions of a head, all of them but in Phi-4-mini; divided by per-frequency
//! factors and a linear scale when given), `[rows, dim / 2]`,
//! for the non-interleaved (`rotate_half`) convention of Hugging Face models. YaRN blends the
//! frequencies and scales the caches. Gemma 3's
//! windowed layers get a pair of their own; LongRoPE's two pairs are chosen by an `If`, as
//! onnxruntime-genai's builder writes them.

use std::f64::consts::PI;

use oxgen_onnx::writer::{Dim, ModelBuilder, attr};
use oxgen_tensor::{DType, Tensor};

use super::{DecoderSpec, LongRopeCaches, Writer};

/// `[rows, dim / 2]` cos and sin caches for rotary base `base`, each frequency divided
/// by `factors[i]` when given, values multiplied by `scale`.
fn rotary_caches(
    spec: &DecoderSpec,
    base: f64,
    rows: usize,
    factors: Option<&[f32]>,
    scale: f64,
) -> (Tensor, Tensor) {
    let rope = &spec.rope;
    let hd = rope.dim.unwrap_or(spec.head_size);
    let half = hd / 2;
    let mut cos = Vec::with_capacity(rows * half);
    let mut sin = Vec::with_capacity(rows * half);
    let inv_freq: Vec<f64> = (0..half)
        .map(|i| {
            let mut f = base.powf(-2.0 * i as f64 / hd as f64);
            if let Some(d) = factors.and_then(|d| d.get(i)) {
                f /= f64::from(*d);
            }
            if let Some(y) = &rope.yarn {
                // Hugging Face's `_compute_yarn_parameters` (truncate = false): dimensions
                // below `low` keep their frequency, those above `high` are interpolated by
                // `factor`, a linear ramp between.
                let dim = |rotations: f64| {
                    hd as f64 * (y.original_context as f64 / (rotations * 2.0 * PI)).ln()
                        / (2.0 * base.ln())
                };
                let low = dim(y.beta_fast).max(0.0);
                let mut high = dim(y.beta_slow).min(hd as f64 - 1.0);
                if high == low {
                    high += 0.001;
                }
                let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                f = f / y.factor * ramp + f * (1.0 - ramp);
            }
            f / rope.linear_scale
        })
        .collect();
    for p in 0..rows {
        for &f in &inv_freq {
            let angle = p as f64 * f;
            cos.push((angle.cos() * scale) as f32);
            sin.push((angle.sin() * scale) as f32);
        }
    }
    let t = |v: Vec<f32>| Tensor::from_slice([rows, half], &v).expect("sizes match");
    (t(cos), t(sin))
}

impl Writer<'_> {
    /// `cos_cache` and `sin_cache` (and Gemma 3's `cos_cache_local` and `sin_cache_local`):
    /// initializers, or LongRoPE's `If`.
    pub(super) fn rope_caches(&mut self) {
        let spec = self.spec;
        if let Some(long) = &spec.rope.long {
            return self.long_rope_caches(long);
        }
        let factors = spec.rope.freq_factors.as_deref();
        // YaRN scales the caches (so queries and keys) by its attention factor.
        let scale = spec.rope.yarn.map_or(1.0, |y| 0.1 * y.factor.ln() + 1.0);
        let (cos, sin) = rotary_caches(spec, spec.rope.base, spec.context, factors, scale);
        self.init("cos_cache", cos);
        self.init("sin_cache", sin);
        if let Some(base) = spec.gemma.as_ref().and_then(|g| g.local_rope_base) {
            let (cos, sin) = rotary_caches(spec, base, spec.context, factors, 1.0);
            self.init("cos_cache_local", cos);
            self.init("sin_cache_local", sin);
        }
    }

    /// LongRoPE's `cos_cache` and `sin_cache` as the builder writes them:
    /// `If(total_len > original_context)` with the long caches in the then branch and the short
    /// ones in the else branch, each a `Constant`.
    fn long_rope_caches(&mut self, long: &LongRopeCaches) {
        let spec = self.spec;
        let scale = f64::from(long.attn_factor);
        let branch = |name: &str, rows: usize, factors: &[f32]| {
            let (cos, sin) = rotary_caches(spec, spec.rope.base, rows, Some(factors), scale);
            let mut b = ModelBuilder::new("oxgen-import");
            for (out, t) in [(format!("{name}_cos"), cos), (format!("{name}_sin"), sin)] {
                let dims = [Dim::Fixed(rows), Dim::Fixed(t.dims()[1])];
                let t = match spec.io {
                    DType::F16 => super::to_f16(&t),
                    _ => t,
                };
                b.node(
                    "Constant",
                    "",
                    &out,
                    &[],
                    &[&out],
                    vec![attr::tensor("value", &t)],
                );
                b.output(&out, spec.io, &dims);
            }
            b.subgraph(name)
        };
        let then_branch = branch("long_rope", spec.context, &long.long_factors);
        let else_branch = branch("short_rope", long.original_context, &long.short_factors);
        self.init(
            "original_context",
            Tensor::scalar(long.original_context as i64),
        );
        self.node(
            "Greater",
            "",
            "beyond_original_context",
            &["total_len_i64", "original_context"],
            &["beyond_original_context"],
            vec![],
        );
        self.node(
            "If",
            "",
            "rope_caches",
            &["beyond_original_context"],
            &["cos_cache", "sin_cache"],
            vec![
                attr::graph("then_branch", then_branch),
                attr::graph("else_branch", else_branch),
            ],
        );
    }
}
