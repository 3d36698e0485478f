//! What a KV cache stores per value: the `--kv-dtype` setting.

use oxgen_tensor::DType;

/// The element a KV cache stores. The model computes in its own dtype either way; a narrower
/// cache rounds each key and value once as it is written. `Int8` keeps one f32 scale per
/// token and KV head (from that head vector's own values), so a token's cached bytes never
/// depend on the batch, the chunking, or tokens that come later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvDtype {
    F32,
    F16,
    BF16,
    Int8,
}

impl KvDtype {
    /// Every choice, as the flag spells them.
    pub const NAMES: &'static str = "f32, f16, bf16 or int8";

    pub fn dtype(self) -> DType {
        match self {
            KvDtype::F32 => DType::F32,
            KvDtype::F16 => DType::F16,
            KvDtype::BF16 => DType::BF16,
            KvDtype::Int8 => DType::I8,
        }
    }

    /// The KV dtype a tensor dtype names, if a cache can hold it.
    pub fn of(dtype: DType) -> Option<KvDtype> {
        match dtype {
            DType::F32 => Some(KvDtype::F32),
            DType::F16 => Some(KvDtype::F16),
            DType::BF16 => Some(KvDtype::BF16),
            DType::I8 => Some(KvDtype::Int8),
            _ => None,
        }
    }

    /// Bytes one head vector of `head_size` values takes, its scale included.
    pub fn head_bytes(self, head_size: usize) -> usize {
        let scale = if self == KvDtype::Int8 { 4 } else { 0 };
        head_size
            .saturating_mul(self.dtype().bits() / 8)
            .saturating_add(scale)
    }

    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::BF16 => "bf16",
            KvDtype::Int8 => "int8",
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvDtype {
    type Err = String;

    fn from_str(s: &str) -> Result<KvDtype, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Ok(KvDtype::F32),
            "f16" | "fp16" | "float16" => Ok(KvDtype::F16),
            "bf16" | "bfloat16" => Ok(KvDtype::BF16),
            "int8" | "i8" | "q8" => Ok(KvDtype::Int8),
            _ => Err(format!(
                "unknown KV cache dtype '{s}': use {}",
                KvDtype::NAMES
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bytes_count_the_scale() {
        for d in [KvDtype::F32, KvDtype::F16, KvDtype::BF16, KvDtype::Int8] {
            assert_eq!(d.name().parse::<KvDtype>(), Ok(d));
            assert_eq!(KvDtype::of(d.dtype()), Some(d));
        }
        assert_eq!(KvDtype::F32.head_bytes(64), 256);
        assert_eq!(KvDtype::F16.head_bytes(64), 128);
        assert_eq!(KvDtype::Int8.head_bytes(64), 68);
        let err = "q4".parse::<KvDtype>().unwrap_err();
        assert!(err.contains("f32, f16, bf16 or int8"), "{err}");
    }
}
