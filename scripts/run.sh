#!/usr/bin/env bash
# Runs the folio command on the default model, fetching the model and building folio
# first if needed: scripts/run.sh generate "…", scripts/run.sh chat, scripts/run.sh bench.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --quiet -p folio-cli
exec target/release/folio "$@"
