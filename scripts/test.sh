#!/usr/bin/env bash
# Runs every test from a fresh clone: fetches the default model if missing, then
# formatting, clippy and the whole test suite (tests run the real model).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --all-targets --quiet -- -D warnings
cargo test --workspace --release --lib --bins --tests 2>&1
