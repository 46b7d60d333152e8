// The matmul's lanes' sums of one column added pairwise in workgroup memory (lane l
// takes lane l + s's, s = lanes / 2, ..., 1): lane 0's result holds the column's sums
// of the workgroup's rows. (Follows `matmul_common.wgsl`.)
fn column_sums(acc: array<f32, 8>, li: u32, lane: u32, nr: u32) -> array<f32, 8> {
    var sums = acc;
    if (p.lanes == 1u) {
        return sums;
    }
    for (var i = 0u; i < TR; i++) {
        part[i * 64u + li] = acc[i];
    }
    workgroupBarrier();
    for (var s = p.lanes / 2u; s > 0u; s /= 2u) {
        if (lane < s) {
            for (var i = 0u; i < nr; i++) {
                part[i * 64u + li] += part[i * 64u + li + s];
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < nr; i++) {
        sums[i] = part[i * 64u + li];
    }
    return sums;
}
