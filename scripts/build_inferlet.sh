#!/usr/bin/env bash
# Builds a Python inferlet into a component: scripts/build_inferlet.sh PROG.py OUT.wasm
#
# PROG.py defines `main(input)` and imports the SDK as `folio` (see docs/inferlets.md).
# componentize-py (pinned) is installed into target/inferlet-venv on first use.
set -euo pipefail
if [ $# -ne 2 ]; then
    echo "usage: $0 PROG.py OUT.wasm" >&2
    exit 2
fi
root="$(cd "$(dirname "$0")/.." && pwd)"
src="$1"
out="$2"
[ -f "$src" ] || { echo "no such file: $src" >&2; exit 2; }
case "$src" in *.py) ;; *) echo "$src: only Python (.py) programs are built here" >&2; exit 2;; esac
venv="${FOLIO_INFERLET_VENV:-$root/target/inferlet-venv}"
version=0.25.1
if [ ! -x "$venv/bin/componentize-py" ] || ! "$venv/bin/pip" show componentize-py 2>/dev/null | grep -q "^Version: $version$"; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "componentize-py==$version"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp "$root/crates/folio-inferlet/sdk/python/folio.py" "$work/folio.py"
cp "$root/crates/folio-inferlet/sdk/python/main_wrapper.py" "$work/app.py"
cp "$src" "$work/program.py"
mkdir -p "$(dirname "$out")"
"$venv/bin/componentize-py" -q -d "$root/crates/folio-inferlet/wit" -w inferlet \
    componentize app -p "$work" -o "$out"
