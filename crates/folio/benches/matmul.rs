//! The default model's matmuls alone: its output head (Q8_0, 49152 × 576) and an FFN
//! matrix (Q4_1, 1536 × 576) against 1, 16 and 512 activation rows, on the kernel
//! path this CPU runs, 2 threads. Prints ms per call and multiply-adds per ns
//! (median of 15 calls after 3 warm ones; repeated calls may find part of a matrix in
//! the last-level cache, which a decode step, reading 96 MB, does not).
//! `cargo bench -p folio --bench matmul [-- --threads N]`.

mod shared;

use folio::gguf::Gguf;
use folio::internals::{isa, matmul, Activations, QMatrix, ThreadPool};
use folio::rng::SplitMix64;
use std::time::Instant;

fn main() {
    let path = shared::model_path();
    let args: Vec<String> = std::env::args().collect();
    let threads = args
        .iter()
        .position(|a| a == "--threads")
        .and_then(|i| args.get(i + 1))
        .and_then(|t| t.parse().ok())
        .unwrap_or(2);
    let g = Gguf::open(&path).expect("the default model (scripts/setup.sh)");
    let pool = ThreadPool::new(threads).expect("threads");
    let isa = isa();
    println!("kernels {isa}, {threads} threads");
    println!("| matrix | rows x cols | activation rows | ms per call | MAC per ns |");
    println!("|---|---|---|---|---|");
    for name in ["token_embd.weight", "blk.0.ffn_up.weight"] {
        let t = g.tensor(name).expect("a tensor of the default model");
        let (cols, rows) = (t.dims[0] as usize, t.dims[1] as usize);
        let w = QMatrix::new(t.ty, rows, cols, g.tensor_bytes(t))
            .expect("a supported type")
            .for_isa(isa);
        let mut rng = SplitMix64(5);
        for n in [1usize, 16, 512] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.signed_f32()).collect();
            let mut out = vec![0f32; n * rows];
            let mut act = Activations::default();
            let mut times = Vec::new();
            for rep in 0..18 {
                act.set(&x, n, cols);
                let t0 = Instant::now();
                matmul(&pool, isa, &mut act, &mut [(&w, &mut out)]);
                if rep >= 3 {
                    times.push(t0.elapsed().as_secs_f64());
                }
            }
            times.sort_by(f64::total_cmp);
            let s = times[times.len() / 2];
            println!(
                "| {name} ({}) | {rows} x {cols} | {n} | {:.3} | {:.1} |",
                t.ty,
                s * 1e3,
                (n * rows * cols) as f64 / s / 1e9
            );
        }
    }
}
