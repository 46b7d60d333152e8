#!/usr/bin/env bash
# Issue 42's figures on a lent GPU machine, in one call (DEVELOPERS.md, `device`): what
# the machine offers (probe.sh), then, where Vulkan runs there, `folio bench` on the GPU
# with a Llama 3.2 1B-shape Q4_K_M model made there (random weights, as
# scripts/shape_models.sh makes here: only speed means anything on it), batch 1 to 32,
# and its profile (`--gpu-profile`: each kind of dispatch's device time, each matmul's
# weight GB/s, the host's time a step); 2 CPU threads on the same file (the batch-32
# target is 10x them); then batch 1 on a Llama 3.1 8B shape written straight in Q4_K
# (make_shape_model.py --q4_k: half a minute, no llama-quantize), where the weights,
# not the dispatches, take the step, and its profile; then what fusing Q/K/V and
# subgroup sums are worth, 8-bit inputs (`--llama-arithmetic`) against f32 ones, and
# the 1B shape's profile at batch 1 to 32. The figures
# come in that order, the most wanted first: each part runs only while the call's
# budget (LENT_BUDGET, 540 s: a device call runs 600 at most) has time left.
#
#   scripts/gpu/lent.sh --prepare   # here: builds what the lent machine needs into
#                                   # target/lent and target/vkprobe (~40 MB)
#   scripts/gpu/lent.sh             # there, with carry ["target/lent", "target/vkprobe"]
#                                   # and timeout_s 600; the whole log in $OUT/lent.log
#
# The lent machine has no Rust toolchain and reaches nothing outside, so everything
# comes from here: a stripped folio (gzipped), llama.cpp's llama-quantize and its libraries, the
# gguf Python package, Llama 3's vocabulary and the shape script. It has Python 3 with
# numpy. LENT_BENCH overrides the bench's arguments (a short run where the GPU is slow),
# LENT_BENCH1 those of the batch-1 runs (the 8B shape's, and without fusion or
# subgroups); LENT_8B=0 leaves the 8B shape out; LENT_PYTHON names a Python with numpy
# (python3 by default: the lent machine's has it).
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
# The device tool brings back what $OUT holds, and the call's reply only the last
# 12,000 characters of the output: the whole log goes to $OUT/lent.log too.
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    exec > >(tee -a "$OUT/lent.log") 2>&1
    tee_pid=$!
    # At the end, the log's last lines written before the call returns.
    trap 'exec >&- 2>&-; wait "$tee_pid"' EXIT
fi
[ -f "$lent/folio.gz" ] || { echo "lent.sh: run scripts/gpu/lent.sh --prepare first and carry $lent" >&2; exit 1; }
[ -x "$lent/folio" ] || { gunzip -k "$lent/folio.gz" && chmod +x "$lent/folio"; }
scripts/gpu/probe.sh
export LD_LIBRARY_PATH=$PWD/target/vkprobe/lib:$PWD/$lent/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
model=/tmp/llama-1b-q4_k_m.gguf
py=${LENT_PYTHON:-python3}
if [ ! -f "$model" ]; then
    t0=$(date +%s)
    PYTHONPATH=$lent/py "$py" "$lent/make_shape_model.py" llama-1b \
        "$lent/ggml-vocab-llama-bpe.gguf" /tmp/llama-1b-f16.gguf || exit 1
    "$lent/llama-quantize" /tmp/llama-1b-f16.gguf "$model" Q4_K_M "$(nproc)" >/tmp/quantize.log 2>&1 ||
        { tail -5 /tmp/quantize.log; exit 1; }
    rm -f /tmp/llama-1b-f16.gguf
    echo "lent.sh: made $model in $(($(date +%s) - t0)) s"
fi
# The GPU through the loader's own search, else through the first ICD file it runs
# with: the driver's own under /usr/local/nvidia (which the device tool's notes name
# where the loader finds no driver), then the driver's EGL entry (probe.sh writes it).
on_gpu() {
    FOLIO_LOG=info timeout -k 5 60 "$lent/folio" generate --model "$model" --device gpu \
        --max-tokens 1 x 2>&1 |
        grep "runs on the GPU" | grep -qv software
}
if ! on_gpu; then
    for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /tmp/nvidia_egl_icd.json; do
        [ -f "$icd" ] || continue
        export VK_DRIVER_FILES=$icd VK_ICD_FILENAMES=$icd
        egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
        [ -f "$egl" ] && export __EGL_VENDOR_LIBRARY_FILENAMES=$egl
        on_gpu && { echo "lent.sh: the GPU through $icd"; break; }
        unset VK_DRIVER_FILES VK_ICD_FILENAMES __EGL_VENDOR_LIBRARY_FILENAMES
    done
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
budget=${LENT_BUDGET:-540}
# `timeout` of at most $1 seconds and what the budget has left (then a kill 10 s on);
# nothing, a line on stderr saying so and exit 1, where it has under 20 s left.
within() {
    local t=$1 left=$((budget - SECONDS))
    shift
    if [ "$left" -lt 20 ]; then
        echo "lent.sh: out of time ($SECONDS s), skipped: $*" >&2
        return 1
    fi
    timeout -k 10 $((t < left ? t : left)) "$@"
}
bench=${LENT_BENCH:---pp 512 --tg 128 --reps 3 --batch-figures}
one=${LENT_BENCH1:---pp 128 --tg 64 --reps 2}
echo "== folio bench --device gpu $bench (at ${SECONDS} s)"
FOLIO_LOG=info within 240 "$lent/folio" bench --model "$model" --device gpu --no-llama $bench
rc=$?
# Nothing here ran on a hardware GPU before: where the bench fails (not a timeout), the
# rest runs without the two newest paths (subgroup sums, one dispatch for Q/K/V).
safe=
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ]; then
    safe="--gpu-no-subgroups --gpu-no-fusion"
    echo "== the bench failed (exit $rc): again with $safe"
    FOLIO_LOG=info within 240 "$lent/folio" bench --model "$model" --device gpu --no-llama $bench $safe
fi
# Where the device's time goes, dispatch by dispatch (a prefill and 16 decode steps):
# each matmul's weight GB/s, and what the rest and the host take.
echo "== the 1B shape profiled: folio generate --gpu-profile (at ${SECONDS} s)"
within 60 "$lent/folio" generate --model "$model" --device gpu $safe --gpu-profile \
    --temperature 0 --max-tokens 17 "The history of the printing press" >/dev/null
echo "== the same model on 2 CPU threads, batch 1 to 32 (at ${SECONDS} s)"
within 120 "$lent/folio" bench --model "$model" --device cpu --threads 2 --no-llama \
    --pp 64 --tg 16 --reps 1 --batch-figures
big=/tmp/llama-8b-q4_k.gguf
if [ "${LENT_8B:-1}" != 0 ] && [ ! -f "$big" ]; then
    t0=$(date +%s)
    # Written aside and moved: a write cut short leaves no file to bench.
    PYTHONPATH=$lent/py within 90 "$py" "$lent/make_shape_model.py" llama-8b \
        "$lent/ggml-vocab-llama-bpe.gguf" "$big.tmp" --q4_k && mv "$big.tmp" "$big" &&
        echo "lent.sh: made $big in $(($(date +%s) - t0)) s"
    rm -f "$big.tmp"
fi
if [ -f "$big" ]; then
    echo "== the 8B shape (Q4_K), batch 1: folio bench --device gpu $one (at ${SECONDS} s)"
    within 150 "$lent/folio" bench --model "$big" --device gpu --no-llama $one $safe
    echo "== the 8B shape profiled (at ${SECONDS} s)"
    within 60 "$lent/folio" generate --model "$big" --device gpu $safe --gpu-profile \
        --temperature 0 --max-tokens 17 "The history of the printing press" >/dev/null
    if [ -z "$safe" ]; then
        echo "== the same, one matrix a dispatch (what fusing Q/K/V and gate/up is worth)"
        within 120 "$lent/folio" bench --model "$big" --device gpu --no-llama --gpu-no-fusion $one
    fi
fi
# What the two newest paths are worth (nothing to compare where they were turned off).
if [ -z "$safe" ]; then
    echo "== the 1B shape at batch 1, one matrix a dispatch (at ${SECONDS} s)"
    within 90 "$lent/folio" bench --model "$model" --device gpu --no-llama --gpu-no-fusion $one
    echo "== the same at batch 1, the matmuls' lane sums in workgroup memory (what subgroups are worth)"
    within 90 "$lent/folio" bench --model "$model" --device gpu --no-llama --gpu-no-subgroups $one
    echo "== the same at batch 1 on 8-bit inputs (--llama-arithmetic: integer dot products, each norm quantizing its rows)"
    within 90 "$lent/folio" bench --model "$model" --device gpu --no-llama --llama-arithmetic $one
fi
# Where the device's time goes: 32 rows a step (batch 32), and every size up to it.
echo "== the 1B shape profiled at batch 1 to 32 (at ${SECONDS} s)"
within 120 "$lent/folio" bench --model "$model" --device gpu --no-llama $safe --gpu-profile \
    --pp 64 --tg 16 --reps 1 --batch-figures
echo "lent.sh: done in ${SECONDS} s"
