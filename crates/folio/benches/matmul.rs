//! Matmuls alone, on the kernel path this CPU runs, 2 threads: by default the default
//! model's output head (Q8_0, 49152 × 576) and an FFN matrix (Q4_1, 1536 × 576), or
//! any model's tensors (`--model PATH --tensors a,b`), against 1, 16 and 512 activation
//! rows. Prints ms per call and multiply-adds per ns (median of 15 calls after 3 warm
//! ones; repeated calls may find part of a matrix in the last-level cache, which a
//! decode step does not, unless the matrix is larger than that cache).
//!
//! `--layouts` also runs each matrix in GGUF's rows (`Layout::Rows`, the per-row
//! kernels), where the path has a tile layout for its type, alternating call by call
//! with the tiles: the design measurement of a tile layout against the rows.
//!
//! `cargo bench -p folio --bench matmul [-- --threads N] [--model PATH --tensors a,b]
//! [--layouts]`.

mod shared;

use folio::gguf::Gguf;
use folio::internals::{isa, matmul, Activations, Layout, QMatrix, ThreadPool};
use folio::rng::SplitMix64;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let threads = arg("--threads").and_then(|t| t.parse().ok()).unwrap_or(2);
    let path = arg("--model")
        .map(Into::into)
        .unwrap_or_else(shared::model_path);
    let names: Vec<String> = arg("--tensors")
        .map(|t| t.split(',').map(str::to_string).collect())
        .unwrap_or_else(|| vec!["token_embd.weight".into(), "blk.0.ffn_up.weight".into()]);
    let layouts = args.iter().any(|a| a == "--layouts");
    let g = Gguf::open(&path).expect("a model file (scripts/setup.sh for the default)");
    let pool = ThreadPool::new(threads).expect("threads");
    let isa = isa();
    println!("{} | kernels {isa}, {threads} threads", path.display());
    println!("| matrix | layout | rows x cols | activation rows | ms per call | MAC per ns |");
    println!("|---|---|---|---|---|---|");
    for name in &names {
        let t = g.tensor(name).expect("a tensor of the model");
        let (cols, rows) = (t.dims[0] as usize, t.dims[1] as usize);
        let bytes = g.tensor_bytes(t);
        let tiled = QMatrix::new_for(isa, t.ty, rows, cols, bytes).expect("a supported type");
        let mut ms = vec![tiled];
        if layouts && ms[0].layout() != Layout::Rows && QMatrix::can_take(t.ty, Layout::Rows) {
            ms.push(QMatrix::new(t.ty, rows, cols, bytes).expect("a supported type"));
        }
        let mut rng = SplitMix64(5);
        for n in [1usize, 16, 512] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.signed_f32()).collect();
            let mut out = vec![0f32; n * rows];
            let mut act = Activations::default();
            let mut times = vec![Vec::new(); ms.len()];
            for rep in 0..18 {
                for (w, times) in ms.iter().zip(&mut times) {
                    act.set(&x, n, cols);
                    let t0 = Instant::now();
                    matmul(&pool, isa, &mut act, &mut [(w, &mut out)]);
                    if rep >= 3 {
                        times.push(t0.elapsed().as_secs_f64());
                    }
                }
            }
            for (w, mut times) in ms.iter().zip(times) {
                times.sort_by(f64::total_cmp);
                let s = times[times.len() / 2];
                println!(
                    "| {name} ({}) | {:?} | {rows} x {cols} | {n} | {:.3} | {:.1} |",
                    t.ty,
                    w.layout(),
                    s * 1e3,
                    (n * rows * cols) as f64 / s / 1e9
                );
            }
        }
    }
}
