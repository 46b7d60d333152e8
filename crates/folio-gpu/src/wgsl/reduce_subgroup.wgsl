// `reduce_workgroup.wgsl`'s pairwise sums where the device has subgroups of SG lanes
// (a pipeline constant), laid out in order (invocation li is lane li % SG of subgroup
// li / SG: `Kernels` checks this before using them). The rounds that pair lanes of
// different subgroups (s >= SG) go through workgroup memory; the rest are exchanges
// within a subgroup: lane l adds lane l ^ s's, which for every lane below s is lane
// l + s's, so lane 0 adds the same pairs in the same order: the same bits. Where a
// column's lanes fit in a subgroup (on a GPU: up to 32 of them), no barrier and no
// workgroup memory. (Follows `matmul_common.wgsl`; compiled only for a device with
// wgpu's SUBGROUP feature.)
override SG: u32 = 32u;

fn column_sums(acc: array<f32, 8>, li: u32, lane: u32, nr: u32) -> array<f32, 8> {
    var sums = memory_rounds(acc, li, lane, nr, SG);
    for (var s = min(p.lanes, SG) / 2u; s > 0u; s /= 2u) {
        for (var i = 0u; i < TR; i++) {
            if (i >= nr) {
                break;
            }
            sums[i] += subgroupShuffleXor(sums[i], s);
        }
    }
    return sums;
}
