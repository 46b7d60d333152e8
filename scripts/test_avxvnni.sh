#!/usr/bin/env bash
# The AVX-VNNI kernel path's tests, and which way they ran on this machine.
#
# They run natively where the CPU runs AVX-VNNI's VEX vpdpbusd; where it faults (AMD
# Zen 4) or lacks it, under the test-only SIGILL emulator in a forked child (see
# crates/folio/src/kernels/tests_vnni.rs). Both are part of `cargo test --lib`; this
# script runs only them, with their messages.
#
# --qemu also fetches Debian's qemu-user (static, from deb.debian.org, checked by
# sha256) into target/qemu and asks whether its TCG runs AVX-VNNI; if it does, the
# kernel tests run again under it with FOLIO_ISA=avxvnni. (QEMU 10.0 and 11.1 do not:
# "TCG doesn't support requested feature: ... avx-vnni".)
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --release -p folio --lib --no-run
bin=$(cargo test --release -p folio --lib --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["lib"]:
        print(m["executable"])' | tail -1)
"$bin" kernels::detect kernels::tests_vnni kernels::vnni_emulator model::tests_avxvnni --nocapture --test-threads=1 2>&1 |
    grep -E "this CPU runs|skipped|emulated|^test |test result"

[ "${1:-}" = "--qemu" ] || exit 0

deb=qemu-user_10.0.13+ds-0+deb13u1_amd64.deb
sum=ca6ede739327a20ae5a3498230c8a3a9a072c586e131bc6bcc1201eb1725e336
dir=target/qemu
mkdir -p "$dir"
if [ ! -x "$dir/usr/bin/qemu-x86_64" ]; then
    curl -fsS -o "$dir/$deb" "https://deb.debian.org/debian/pool/main/q/qemu/$deb"
    echo "$sum  $dir/$deb" | sha256sum -c -
    dpkg-deb --fsys-tarfile "$dir/$deb" | tar -x -C "$dir" ./usr/bin/qemu-x86_64
fi
qemu="$dir/usr/bin/qemu-x86_64"
"$qemu" -version | head -1
runs=$("$qemu" -cpu max,+avx-vnni "$bin" kernels::detect::tests::names_round_trip --nocapture 2>&1 |
    grep "this CPU runs" || true)
echo "under qemu -cpu max,+avx-vnni: $runs"
if [[ "$runs" == *AvxVnni* ]]; then
    FOLIO_ISA=avxvnni "$qemu" -cpu max,+avx-vnni "$bin" kernels:: 2>&1 | grep -E "skipped|test result"
else
    echo "this QEMU's TCG does not run AVX-VNNI: the tests above are what ran"
fi
