//! Weight matrices laid out for the kernels, and the threaded matmul
//! `out[t][r] = dot(W[r], x[t])` over a batch of activation rows.
//!
//! Activations are quantized once per input to the format the weights' dot product
//! wants (8-bit blocks for the 32-element formats, Q8_K for the K-quants, f32 for float
//! weights), and several matrices that read the same input (Q, K, V; gate, up) run in
//! one parallel region, split by row tiles across threads. Every output element is
//! computed by exactly one thread with a fixed reduction order, so results do not depend
//! on the thread count or on how many activation rows share the call.
//!
//! # Files
//! - `qmatrix`: [`QMatrix`] and its [`Layout`]: loading, `gather`, GGUF rows and packed tiles, `dequant_row`.
//! - `weight_buf`: the buffers a matrix's words live in, each its own mapping or cut
//!   from a [`WeightArena`] (the loader's: one mapping on huge pages).
//! - `pack`: between GGUF rows and the tile layouts (packing, `with_layout`,
//!   `gguf_bytes`), and `block_columns` (the outlier pass's column pick).
//! - `dot`: one weight row against one activation row through the per-pair kernels,
//!   and the AVX2 register tile over GGUF rows.
//! - `activations`: [`Activations`] (one input batch and its quantized forms),
//!   [`ActKind`], [`BUILD_ROWS`].
//! - `tiled`: [`matmul`], [`matmul_add`] and the threaded work split over row tiles and
//!   column blocks.
//! - `runners`: one item of that work, a tile of rows against a block of activation
//!   rows, on the path's kernels.
//! - `out`: the output view the threads write through.

/// Runs `$body` with `$d` bound to the 8-bit dot step of `isa`'s AVX2 kernels (a
/// const: `avxvnni::VEX` on the AVX-VNNI path, `avxvnni::EVEX` on the AVX-512 path,
/// else `avxvnni::MADD`; the same bits on every path).
#[cfg(target_arch = "x86_64")]
macro_rules! with_dot {
    ($isa:expr, $d:ident => $body:expr) => {
        if $isa.avx_vnni() {
            const $d: u8 = $crate::kernels::avxvnni::VEX;
            $body
        } else if $isa.avx512() {
            const $d: u8 = $crate::kernels::avxvnni::EVEX;
            $body
        } else {
            const $d: u8 = $crate::kernels::avxvnni::MADD;
            $body
        }
    };
}

/// Rows of activations from which element-wise work is split over threads.
pub const PARALLEL_ROWS: usize = 32;

mod activations;
mod dot;
mod out;
mod pack;
mod qmatrix;
mod runners;
mod tiled;
mod weight_buf;

pub use activations::{ActKind, Activations, BUILD_ROWS};
pub use pack::RowSource;
pub use qmatrix::{Layout, QMatrix};
pub use tiled::{matmul, matmul_add};
pub use weight_buf::WeightArena;
