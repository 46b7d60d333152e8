#!/usr/bin/env bash
# The long soak (issue 16): 2000 random requests against `folio serve` (completions
# and chats with random max_tokens and n, hang-ups, contexts forked, truncated and
# generated into), then every page free or cached, the page store's invariants
# checked, and the server's RSS curve printed. CI runs the same test with 200.
# FOLIO_SOAK_REQUESTS sets the count.
set -euo pipefail
cd "$(dirname "$0")/.."
export FOLIO_SOAK_REQUESTS="${FOLIO_SOAK_REQUESTS:-2000}"
exec cargo test --release -p folio-cli --test fault soak -- --nocapture
