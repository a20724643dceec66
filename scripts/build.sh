#!/usr/bin/env bash
# npm run build: src/ and gen/ → dist/ as plain JavaScript (tsc), plus every other file the
# code reads next to itself (SQL migrations, descriptor sets). dist/src/cli.js is the
# `slotbroker` command of the package; dist/native/ holds the native job launcher when it
# could be compiled (scripts/build-native.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# dist/ built from exactly these inputs is left as it is: `npm install` runs this script,
# and so does the first `npx slotbroker` of a checkout (npx installs the checkout into its
# cache), which would otherwise repeat a whole build a moment after the first.
inputs=$( { find src gen native -type f -print0 | sort -z | xargs -0 sha256sum; sha256sum tsconfig.json tsconfig.build.json package.json scripts/build.sh scripts/build-native.sh; } | sha256sum | cut -d' ' -f1)
if [ -f dist/.inputs ] && [ "$(cat dist/.inputs)" = "$inputs" ] && [ -f dist/src/cli.js ]; then
  echo "slotbroker: dist/ is up to date with src/, gen/ and native/"
  exit 0
fi
rm -rf dist
npx tsc -p tsconfig.build.json
node -e '
  const { cpSync } = require("node:fs");
  for (const dir of ["src", "gen"]) cpSync(dir, `dist/${dir}`, { recursive: true, filter: (p) => !p.endsWith(".ts") });
'
chmod 755 dist/src/cli.js
# The native job launcher, next to dist/src/ where the execserver looks for it (optional).
scripts/build-native.sh dist/native
echo "$inputs" > dist/.inputs
