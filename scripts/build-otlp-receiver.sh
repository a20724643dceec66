#!/usr/bin/env bash
# Builds the trace tests' OTLP receiver with Go into tools/bin (ignored by git) and reuses
# it while its sources are unchanged: a minimal OpenTelemetry Collector made of the
# collector's own OTLP receiver (go.opentelemetry.io/collector/receiver/otlpreceiver,
# pinned in test/ecosystem/tracing/otlp-receiver/go.mod) writing what it receives as OTLP
# JSON lines. No collector distribution is packaged for this machine; the Go module proxy
# serves the receiver. Prints the binary's path.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src="$root/test/ecosystem/tracing/otlp-receiver"
bin="$root/tools/bin/otlp-receiver"
stamp="$bin.version"
version=$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-16)
if [ -x "$bin" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ]; then
  echo "$bin"
  exit 0
fi
command -v go >/dev/null || { echo "build-otlp-receiver: Go is required to build the OTLP receiver" >&2; exit 1; }
mkdir -p "$(dirname "$bin")"
echo "build-otlp-receiver: building (with an empty Go build cache: about 90 s of CPU)" >&2
start=$(date +%s)
(cd "$src" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -o "$bin" .) >&2
echo "build-otlp-receiver: built in $(($(date +%s) - start)) s" >&2
echo "$version" > "$stamp"
echo "$bin"
