#!/usr/bin/env bash
# Builds an inferlet into a component of the folio:inferlet world:
#   scripts/build_inferlet.sh PROG.py OUT.wasm   (Python, componentize-py)
#   scripts/build_inferlet.sh PROG.js OUT.wasm   (JavaScript, componentize-js)
#
# PROG.py defines `main(input)` and imports the SDK as `folio`; PROG.js is an ES
# module that exports `main(input)` and imports the SDK from "./folio.js" (see
# docs/inferlets.md). The build puts the SDK next to the program. The compilers are
# pinned and installed on first use: componentize-py into target/inferlet-venv
# (PyPI), componentize-js (0.23.0, its dependencies locked by
# crates/folio-inferlet/sdk/js/package-lock.json) into target/inferlet-js (npm).
set -euo pipefail
if [ $# -ne 2 ]; then
    echo "usage: $0 PROG.py|PROG.js OUT.wasm" >&2
    exit 2
fi
root="$(cd "$(dirname "$0")/.." && pwd)"
src="$1"
out="$2"
[ -f "$src" ] || { echo "no such file: $src" >&2; exit 2; }
wit="$root/crates/folio-inferlet/wit"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"
case "$src" in
*.py)
    venv="${FOLIO_INFERLET_VENV:-$root/target/inferlet-venv}"
    version=0.25.1
    if [ ! -x "$venv/bin/componentize-py" ] || ! "$venv/bin/pip" show componentize-py 2>/dev/null | grep -q "^Version: $version$"; then
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check "componentize-py==$version"
    fi
    cp "$root/crates/folio-inferlet/sdk/python/folio.py" "$work/folio.py"
    cp "$root/crates/folio-inferlet/sdk/python/main_wrapper.py" "$work/app.py"
    cp "$src" "$work/program.py"
    "$venv/bin/componentize-py" -q -d "$wit" -w inferlet componentize app -p "$work" -o "$out"
    ;;
*.js | *.mjs)
    js="${FOLIO_INFERLET_JS:-$root/target/inferlet-js}"
    sdk="$root/crates/folio-inferlet/sdk/js"
    bin="$js/node_modules/.bin/componentize-js"
    # componentize-js and everything it pulls in are pinned by sdk/js/package-lock.json.
    if [ ! -x "$bin" ] || ! cmp -s "$sdk/package-lock.json" "$js/package-lock.json" \
        || ! cmp -s "$sdk/package.json" "$js/package.json"; then
        command -v npm >/dev/null || { echo "npm is needed to build JavaScript inferlets" >&2; exit 3; }
        mkdir -p "$js"
        cp "$sdk/package.json" "$sdk/package-lock.json" "$js/"
        npm ci --prefix "$js" --no-audit --no-fund --loglevel=error >/dev/null \
            || { echo "npm ci of @bytecodealliance/componentize-js failed" >&2; exit 3; }
    fi
    cp "$root/crates/folio-inferlet/sdk/js/folio.js" "$work/folio.js"
    cp "$root/crates/folio-inferlet/sdk/js/main_wrapper.js" "$work/app.js"
    cp "$src" "$work/program.js"
    # The host grants no HTTP: leave out StarlingMonkey's wasi:http imports.
    "$bin" "$work/app.js" -w "$wit" -n inferlet -d http fetch-event -o "$out" >/dev/null
    ;;
*)
    echo "$src: only Python (.py) and JavaScript (.js) programs are built here" >&2
    exit 2
    ;;
esac
