//! [`dequantize`]: a GGUF tensor's rows as plain floats, for a backend that keeps the
//! weights in its own form (a GPU backend uploads the formats its kernels read as they
//! are and the others as f32) and so cannot use the CPU's packed matrices.

use crate::gguf::GgmlType;
use crate::kernels::QMatrix;

/// The `rows` × `cols` values of `bytes` (rows of type `ty`, as the file stores them),
/// row after row, exactly as the CPU kernels dequantize them. `None` if folio cannot
/// compute with `ty` or the sizes disagree.
pub fn dequantize(ty: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> Option<Vec<f32>> {
    let m = QMatrix::new(ty, rows, cols, bytes)?;
    let mut out = vec![0f32; rows.checked_mul(cols)?];
    for (r, row) in out.chunks_exact_mut(cols.max(1)).enumerate() {
        m.dequant_row(r, row);
    }
    Some(out)
}
