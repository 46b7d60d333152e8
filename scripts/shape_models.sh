#!/usr/bin/env bash
# Random-weight models in the shapes of real ones, quantized to Q4_K_M by llama.cpp's
# llama-quantize, for speed and memory figures on weights far bigger than any cache:
#   target/shapes/llama-1b-q4_k_m.gguf   Llama 3.2 1B's shape, Llama 3's vocabulary (~0.8 GB)
#   target/shapes/qwen-3b-q4_k_m.gguf    Qwen2.5 3B's shape, Qwen2's vocabulary (~1.9 GB)
# Then, for example: folio bench --model target/shapes/llama-1b-q4_k_m.gguf, and
# scripts/memory.sh target/shapes/llama-1b-q4_k_m.gguf. The weights are random: only
# speed and memory mean anything on them. Needs scripts/setup.sh's vocabularies and
# scripts/build_llama.sh's build (both are run here); does nothing already done.
#
#   scripts/shape_models.sh [llama-1b] [qwen-3b]   # default: both
set -euo pipefail
cd "$(dirname "$0")/.."
shapes=("$@")
[ ${#shapes[@]} -eq 0 ] && shapes=(llama-1b qwen-3b)
scripts/setup.sh >/dev/null
scripts/build_llama.sh >/dev/null
venv=target/shape-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import gguf, numpy" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check gguf numpy
fi
mkdir -p target/shapes
for shape in "${shapes[@]}"; do
    case $shape in
        llama-1b) vocab=models/vocab/ggml-vocab-llama-bpe.gguf ;;
        qwen-3b) vocab=models/vocab/ggml-vocab-qwen2.gguf ;;
        *) echo "shape_models: unknown shape $shape (llama-1b, qwen-3b)" >&2; exit 1 ;;
    esac
    out=target/shapes/$shape-q4_k_m.gguf
    [ -f "$out" ] && continue
    f16=target/shapes/$shape-f16.gguf
    echo "shape_models: writing $f16" >&2
    "$venv/bin/python" scripts/make_shape_model.py "$shape" "$vocab" "$f16"
    echo "shape_models: quantizing to $out" >&2
    LD_LIBRARY_PATH=target/llama/build/bin target/llama/build/bin/llama-quantize \
        "$f16" "$out.tmp" Q4_K_M "$(nproc)" >target/shapes/$shape.quantize.log 2>&1
    mv "$out.tmp" "$out"
    rm -f "$f16"
done
ls -la target/shapes/*.gguf
