//! Macros that turn a runtime [`oxgen_tensor::DType`] into a concrete element type.
//!
//! `dispatch!(dtype, T => expr; [F32, F64, ...])` expands `expr` once per listed dtype with
//! `T` bound to its Rust type, and yields `Err(OpError::dtype(..))` for any other dtype.

/// Binds `$t` to the Rust element type of `$dtype` among the listed dtypes.
macro_rules! dispatch {
    ($dtype:expr, $t:ident => $body:expr; [$($d:ident),* $(,)?]) => {{
        match $dtype {
            $(oxgen_tensor::DType::$d => { dispatch!(@bind $d, $t, $body) })*
            other => Err($crate::OpError::dtype(other)),
        }
    }};
    (@bind F32, $t:ident, $body:expr) => {{ type $t = f32; $body }};
    (@bind F64, $t:ident, $body:expr) => {{ type $t = f64; $body }};
    (@bind F16, $t:ident, $body:expr) => {{ type $t = half::f16; $body }};
    (@bind BF16, $t:ident, $body:expr) => {{ type $t = half::bf16; $body }};
    (@bind I64, $t:ident, $body:expr) => {{ type $t = i64; $body }};
    (@bind I32, $t:ident, $body:expr) => {{ type $t = i32; $body }};
    (@bind I16, $t:ident, $body:expr) => {{ type $t = i16; $body }};
    (@bind I8, $t:ident, $body:expr) => {{ type $t = i8; $body }};
    (@bind U64, $t:ident, $body:expr) => {{ type $t = u64; $body }};
    (@bind U32, $t:ident, $body:expr) => {{ type $t = u32; $body }};
    (@bind U16, $t:ident, $body:expr) => {{ type $t = u16; $body }};
    (@bind U8, $t:ident, $body:expr) => {{ type $t = u8; $body }};
    (@bind Bool, $t:ident, $body:expr) => {{ type $t = u8; $body }};
}

/// Every dtype with a Rust element type (all but the packed 4-bit ones), for data movement.
macro_rules! dispatch_any {
    ($dtype:expr, $t:ident => $body:expr) => {
        dispatch!($dtype, $t => $body; [F32, F64, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, Bool])
    };
}

/// Numeric dtypes (no bool).
macro_rules! dispatch_num {
    ($dtype:expr, $t:ident => $body:expr) => {
        dispatch!($dtype, $t => $body; [F32, F64, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8])
    };
}

/// Floating-point dtypes.
macro_rules! dispatch_float {
    ($dtype:expr, $t:ident => $body:expr) => {
        dispatch!($dtype, $t => $body; [F32, F64, F16, BF16])
    };
}
