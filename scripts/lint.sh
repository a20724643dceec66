#!/usr/bin/env bash
# The type check and the type-aware lint, side by side: each is one single-threaded
# process (~25 s and ~75 s on one core), so on two cores the pair takes as long as eslint.
# Both always run to the end; the exit status is non-zero when either failed.
set -uo pipefail
cd "$(dirname "$0")/.."
npx tsc --noEmit -p tsconfig.json &
tsc=$!
npx eslint .
eslint=$?
wait "$tsc"
tsc=$?
[ "$tsc" -eq 0 ] || echo "lint: tsc --noEmit failed (exit $tsc)" >&2
[ "$eslint" -eq 0 ] || echo "lint: eslint failed (exit $eslint)" >&2
exit $((tsc || eslint))
