//! The ggml tensor types a GGUF file may name, with their block geometry.
//!
//! Ids, names, elements per block and bytes per block follow `enum ggml_type` in ggml's
//! `docs/gguf.md` and `GGML_QUANT_SIZES` in gguf-py's `gguf/constants.py` (gguf 0.19.0).
//! Ids whose support ggml removed (4, 5, 31–33, 36–38) are unknown here, like any id not in
//! the table. Knowing a type lets the reader size and bounds-check its data; only the types
//! in [`crate::blocks`] can be dequantized or repacked.

/// Elements per super-block of the K-quants and i-quants (`QK_K` in ggml).
const QK_K: u32 = 256;

macro_rules! ggml_types {
    ($($variant:ident = $id:literal, $name:literal, $block:expr, $bytes:expr;)*) => {
        /// A ggml tensor element type (`enum ggml_type`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types)]
        pub enum GgmlType {
            $($variant,)*
        }

        impl GgmlType {
            /// Every type this crate knows, in id order.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$variant,)*];

            /// The type with this `ggml_type` id, or `None` for ids ggml does not (or no
            /// longer) define.
            pub fn from_id(id: u32) -> Option<GgmlType> {
                match id {
                    $($id => Some(GgmlType::$variant),)*
                    _ => None,
                }
            }

            /// The `ggml_type` id stored in tensor infos.
            pub fn id(self) -> u32 {
                match self {
                    $(GgmlType::$variant => $id,)*
                }
            }

            /// ggml's name for the type (`"Q4_1"`, `"F32"`, ...).
            pub fn name(self) -> &'static str {
                match self {
                    $(GgmlType::$variant => $name,)*
                }
            }

            /// Elements per block (1 for plain element types).
            pub fn block_elems(self) -> u32 {
                match self {
                    $(GgmlType::$variant => $block,)*
                }
            }

            /// Bytes per block.
            pub fn block_bytes(self) -> u32 {
                match self {
                    $(GgmlType::$variant => $bytes,)*
                }
            }
        }
    };
}

ggml_types! {
    F32 = 0, "F32", 1, 4;
    F16 = 1, "F16", 1, 2;
    Q4_0 = 2, "Q4_0", 32, 2 + 16;
    Q4_1 = 3, "Q4_1", 32, 2 + 2 + 16;
    Q5_0 = 6, "Q5_0", 32, 2 + 4 + 16;
    Q5_1 = 7, "Q5_1", 32, 2 + 2 + 4 + 16;
    Q8_0 = 8, "Q8_0", 32, 2 + 32;
    Q8_1 = 9, "Q8_1", 32, 4 + 4 + 32;
    Q2_K = 10, "Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4;
    Q3_K = 11, "Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12;
    Q4_K = 12, "Q4_K", QK_K, 2 + 2 + QK_K / 2 + 12;
    Q5_K = 13, "Q5_K", QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12;
    Q6_K = 14, "Q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16;
    Q8_K = 15, "Q8_K", QK_K, 4 + QK_K + QK_K / 8;
    IQ2_XXS = 16, "IQ2_XXS", QK_K, 2 + QK_K / 4;
    IQ2_XS = 17, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32;
    IQ3_XXS = 18, "IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8;
    IQ1_S = 19, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16;
    IQ4_NL = 20, "IQ4_NL", 32, 2 + 16;
    IQ3_S = 21, "IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4;
    IQ2_S = 22, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16;
    IQ4_XS = 23, "IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64;
    I8 = 24, "I8", 1, 1;
    I16 = 25, "I16", 1, 2;
    I32 = 26, "I32", 1, 4;
    I64 = 27, "I64", 1, 8;
    F64 = 28, "F64", 1, 8;
    IQ1_M = 29, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32;
    BF16 = 30, "BF16", 1, 2;
    TQ1_0 = 34, "TQ1_0", QK_K, 2 + 4 * 13;
    TQ2_0 = 35, "TQ2_0", QK_K, 2 + 64;
    MXFP4 = 39, "MXFP4", 32, 1 + 16;
    NVFP4 = 40, "NVFP4", 64, 4 + 32;
    Q1_0 = 41, "Q1_0", 128, 2 + 16;
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_removed_ids_are_unknown() {
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 42, u32::MAX] {
            assert_eq!(GgmlType::from_id(removed), None, "id {removed}");
        }
    }

    #[test]
    fn block_sizes_match_ggml() {
        // Spot checks against ggml-common.h's static_asserts.
        assert_eq!(
            (GgmlType::Q4_0.block_elems(), GgmlType::Q4_0.block_bytes()),
            (32, 18)
        );
        assert_eq!(
            (GgmlType::Q4_1.block_elems(), GgmlType::Q4_1.block_bytes()),
            (32, 20)
        );
        assert_eq!(
            (GgmlType::Q8_0.block_elems(), GgmlType::Q8_0.block_bytes()),
            (32, 34)
        );
        assert_eq!(
            (GgmlType::Q4_K.block_elems(), GgmlType::Q4_K.block_bytes()),
            (256, 144)
        );
        assert_eq!(
            (GgmlType::Q6_K.block_elems(), GgmlType::Q6_K.block_bytes()),
            (256, 210)
        );
    }
}
