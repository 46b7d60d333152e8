// The matmul's lanes' sums of one column added pairwise in workgroup memory (lane l
// takes lane l + s's, s = lanes / 2, ..., 1): lane 0's result holds the column's sums
// of the workgroup's rows. (Follows `matmul_common.wgsl`.)
fn column_sums(acc: array<f32, 8>, li: u32, lane: u32, nr: u32) -> array<f32, 8> {
    return memory_rounds(acc, li, lane, nr, 1u);
}
