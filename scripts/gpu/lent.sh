#!/usr/bin/env bash
# Issue 42's figures on a lent GPU machine, in one call (DEVELOPERS.md, `device`): what
# the machine offers (probe.sh), then, where Vulkan runs there, `folio bench` on the GPU
# with a Llama 3.2 1B-shape Q4_K_M model made there (random weights, as
# scripts/shape_models.sh makes here: only speed means anything on it), batch 1 to 32.
#
#   scripts/gpu/lent.sh --prepare   # here: builds what the lent machine needs into
#                                   # target/lent and target/vkprobe (~40 MB)
#   scripts/gpu/lent.sh             # there, with carry ["target/lent", "target/vkprobe"]
#
# The lent machine has no Rust toolchain and reaches nothing outside, so everything
# comes from here: a stripped folio (gzipped), llama.cpp's llama-quantize and its libraries, the
# gguf Python package, Llama 3's vocabulary and the shape script. It has Python 3 with
# numpy. LENT_BENCH overrides the bench's arguments (a short run where the GPU is slow),
# LENT_BENCH1 those of the batch-1 run without subgroups.
set -u
cd "$(dirname "$0")/../.."
lent=target/lent
if [ "${1:-}" = --prepare ]; then
    set -e
    cargo build --release -p folio-cli
    scripts/build_llama.sh >/dev/null
    scripts/setup.sh >/dev/null
    scripts/gpu/probe.sh --prepare
    rm -rf "$lent" && mkdir -p "$lent/lib" "$lent/py"
    # Compressed (the carry holds 64 MiB): 34 MB stripped, some 12 gzipped.
    strip -o "$lent/folio" target/release/folio
    gzip -9 "$lent/folio"
    cp target/llama/build/bin/llama-quantize "$lent/"
    cp -a target/llama/build/bin/lib*.so* "$lent/lib/"
    rm -f "$lent"/lib/libllama-{server,bench,batched-bench}-impl.so "$lent"/lib/libmtmd.so*
    site=$(echo target/shape-venv/lib/python3*/site-packages)
    if [ ! -d "$site/gguf" ]; then
        python3 -m venv target/shape-venv
        target/shape-venv/bin/pip install -q --disable-pip-version-check gguf numpy
        site=$(echo target/shape-venv/lib/python3*/site-packages)
    fi
    cp -a "$site"/{gguf,yaml,tqdm} "$lent/py/"
    cp models/vocab/ggml-vocab-llama-bpe.gguf scripts/make_shape_model.py "$lent/"
    du -sh "$lent" target/vkprobe
    exit 0
fi
[ -f "$lent/folio.gz" ] || { echo "lent.sh: run scripts/gpu/lent.sh --prepare first and carry $lent" >&2; exit 1; }
[ -x "$lent/folio" ] || { gunzip -k "$lent/folio.gz" && chmod +x "$lent/folio"; }
scripts/gpu/probe.sh
export LD_LIBRARY_PATH=$PWD/target/vkprobe/lib:$PWD/$lent/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
model=/tmp/llama-1b-q4_k_m.gguf
if [ ! -f "$model" ]; then
    t0=$(date +%s)
    PYTHONPATH=$lent/py python3 "$lent/make_shape_model.py" llama-1b \
        "$lent/ggml-vocab-llama-bpe.gguf" /tmp/llama-1b-f16.gguf || exit 1
    "$lent/llama-quantize" /tmp/llama-1b-f16.gguf "$model" Q4_K_M "$(nproc)" >/tmp/quantize.log 2>&1 ||
        { tail -5 /tmp/quantize.log; exit 1; }
    rm -f /tmp/llama-1b-f16.gguf
    echo "lent.sh: made $model in $(($(date +%s) - t0)) s"
fi
# A driver the probe needed the EGL entry for: wgpu takes the same ICD file.
if ! "$lent/folio" generate --model "$model" --device gpu --max-tokens 1 x >/dev/null 2>&1 &&
    [ -f /tmp/nvidia_egl_icd.json ]; then
    export VK_DRIVER_FILES=/tmp/nvidia_egl_icd.json VK_ICD_FILENAMES=/tmp/nvidia_egl_icd.json
    echo "lent.sh: the GPU through the driver's EGL entry"
fi
# The device's memory bandwidth, measured (the batch-1 decode roofline is the weights
# read per token over it): a 2 GiB device-to-device copy with the machine's torch.
python3 - <<'PY' || echo "lent.sh: no torch with CUDA here: no bandwidth figure"
import time, torch
n = 1 << 31
a = torch.empty(n, dtype=torch.uint8, device="cuda")
b = torch.empty_like(a)
for _ in range(3):
    b.copy_(a)
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(10):
    b.copy_(a)
torch.cuda.synchronize()
dt = (time.perf_counter() - t) / 10
print(f"device bandwidth (copy, read + write): {2 * n / dt / 1e9:.0f} GB/s")
PY
bench=${LENT_BENCH:---pp 512 --tg 128 --reps 3 --batch-figures}
echo "== folio bench --device gpu $bench"
FOLIO_LOG=info timeout 300 "$lent/folio" bench --model "$model" --device gpu --no-llama $bench
echo "== the same at batch 1, the matmuls' lane sums in workgroup memory (what subgroups are worth)"
timeout 120 "$lent/folio" bench --model "$model" --device gpu --no-llama --gpu-no-subgroups \
    ${LENT_BENCH1:---pp 512 --tg 64 --reps 2}
echo "== host time per decode step (median over 32 steps: recording, and the whole step)"
FOLIO_LOG=folio_gpu=debug timeout 120 "$lent/folio" generate --model "$model" --device gpu \
    --temperature 0 --max-tokens 33 "The history of the printing press" 2>&1 >/dev/null |
    grep "gpu: step rows=1 " | tail -32 | python3 -c '
import re, statistics, sys
rows = [tuple(map(int, re.findall(r"(?:record|step)_us=(\d+)", l))) for l in sys.stdin]
print("record_us", statistics.median(r for r, _ in rows), "step_us",
      statistics.median(s for _, s in rows), "steps", len(rows))'
echo "== folio bench --device cpu --threads 2 --pp 64 --tg 16 --reps 1 (this machine's CPU)"
timeout 120 "$lent/folio" bench --model "$model" --device cpu --threads 2 --no-llama --pp 64 --tg 16 --reps 1
