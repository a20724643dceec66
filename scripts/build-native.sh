#!/usr/bin/env bash
# Compiles the native job launcher (native/job-launcher.c) into OUTDIR/slotbroker-job-launcher
# for this machine. Optional: on a platform other than Linux, without a C compiler ($CC, else
# cc) or when the compile fails, one line on stderr says so and it exits 0: the execserver
# then starts jobs through its Node launcher script, or forks them itself.
#   scripts/build-native.sh OUTDIR
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: scripts/build-native.sh OUTDIR}"
cc="${CC:-cc}"
skip() {
  echo "slotbroker: native job launcher not built ($1); jobs start without it" >&2
  exit 0
}
[ "$(uname -s)" = Linux ] || skip "Linux only"
command -v "$cc" >/dev/null 2>&1 || skip "no C compiler: $cc"
mkdir -p "$out" || skip "cannot create $out"
tmp="$out/slotbroker-job-launcher.$$"
if ! errors=$("$cc" -std=gnu11 -O2 -Wall -Wextra -o "$tmp" native/job-launcher.c 2>&1); then
  rm -f "$tmp"
  first=$(printf '%s\n' "$errors" | grep -m1 -i 'error' || printf '%s\n' "$errors" | head -n1)
  skip "$cc failed${first:+: $first}"
fi
mv -f "$tmp" "$out/slotbroker-job-launcher"
