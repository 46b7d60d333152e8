#!/usr/bin/env bash
# The reproducible benchmark: folio and llama.cpp on the same GGUF file, the same
# threads and the same loads, taking turns round by round. Prints the tables, writes
# docs/bench/latest.json (every figure, every round, the machine), the plots in
# docs/bench/*.svg and docs/BENCHMARKS.md.
#
#   scripts/bench.sh                 # everything; builds llama.cpp first (minutes)
#   scripts/bench.sh --no-llama      # folio's figures alone
#   REPS=5 scripts/bench.sh          # rounds per figure (default 3)
#   FIGURES="--serve-figures" scripts/bench.sh   # other figure sets than --all
#
# llama.cpp comes from scripts/build_llama.sh (the sources inside llama-cpp-python's
# sdist, built for this machine's ISA); when it cannot be built, folio's figures are
# printed alone and the tables say so.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release -p folio-cli
out=docs/bench
mkdir -p "$out"
flags=()
if [ "${1:-}" = "--no-llama" ]; then
    flags+=(--no-llama)
elif env=$(scripts/build_llama.sh); then
    eval "$env"
else
    echo "bench: llama.cpp could not be built: folio's figures alone" >&2
    flags+=(--no-llama)
fi
# shellcheck disable=SC2086 # FIGURES is a list of flags
target/release/folio bench ${FIGURES:---all} --reps "${REPS:-3}" --json "$out/latest.json" "${flags[@]}" \
    | tee "$out/latest.txt"

if [ ! -x target/plot-venv/bin/python ]; then
    python3 -m venv target/plot-venv
    target/plot-venv/bin/pip install --quiet --disable-pip-version-check matplotlib
fi
target/plot-venv/bin/python scripts/bench_plots.py "$out/latest.json" "$out" docs/BENCHMARKS.md
