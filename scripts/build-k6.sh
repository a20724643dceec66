#!/usr/bin/env bash
# Builds k6 with Go into tools/bin (ignored by git) and reuses it when the pinned version
# is already there. k6 is not packaged for this machine; the Go module proxy serves it.
# The module path is go.k6.io/k6 (its v2 path is not served by the proxy here).
set -euo pipefail
K6_MODULE=${K6_MODULE:-go.k6.io/k6}
K6_VERSION=${K6_VERSION:-v1.8.1}
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/tools/bin"
stamp="$bin/k6.version"
if [ -x "$bin/k6" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$K6_MODULE@$K6_VERSION" ]; then
  echo "$bin/k6"
  exit 0
fi
command -v go >/dev/null || { echo "build-k6: Go is required to build k6" >&2; exit 1; }
mkdir -p "$bin"
echo "build-k6: building $K6_MODULE@$K6_VERSION (first time takes a few minutes)" >&2
GOBIN="$bin" CGO_ENABLED=0 go install "$K6_MODULE@$K6_VERSION" >&2
echo "$K6_MODULE@$K6_VERSION" > "$stamp"
echo "$bin/k6"
