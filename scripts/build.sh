#!/usr/bin/env bash
# npm run build: src/ and gen/ → dist/ as plain JavaScript (tsc), plus every other file the
# code reads next to itself (SQL migrations, descriptor sets). dist/src/cli.js is the
# `slotbroker` command of the package; dist/native/ holds the native job launcher when it
# could be compiled (scripts/build-native.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf dist
npx tsc -p tsconfig.build.json
node -e '
  const { cpSync } = require("node:fs");
  for (const dir of ["src", "gen"]) cpSync(dir, `dist/${dir}`, { recursive: true, filter: (p) => !p.endsWith(".ts") });
'
chmod 755 dist/src/cli.js
# The native job launcher, next to dist/src/ where the execserver looks for it (optional).
scripts/build-native.sh dist/native
