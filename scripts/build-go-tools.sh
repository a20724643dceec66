#!/usr/bin/env bash
# Builds the Go tools the ecosystem checks use into tools/bin (ignored by git) and reuses
# each one while its pinned version is there: grpcurl (reflection checks against real
# servers), protoc-gen-go / protoc-gen-go-grpc (the Go client's stubs, through the
# committed buf template examples/clients/go/buf.gen.yaml) and promtool (`promtool check
# metrics` on the real /metrics endpoints; Prometheus 3.x is the module's v0.3xx line).
# Prints the bin directory. None of them is packaged for this machine; the Go module proxy
# serves all four.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/tools/bin"
tools=(
  "grpcurl github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.3"
  "protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12"
  "protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.0"
  "promtool github.com/prometheus/prometheus/cmd/promtool@v0.316.0"
)
mkdir -p "$bin"
# Test files run in parallel and each asks for the tools: one builds, the others wait for
# it and then find every tool there (three builds of the same modules at once on a cold Go
# cache took longer than the tests wait).
exec 9>"$bin/.build.lock"
flock 9
for entry in "${tools[@]}"; do
  name=${entry%% *}
  pkg=${entry#* }
  stamp="$bin/$name.version"
  if [ -x "$bin/$name" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$pkg" ]; then continue; fi
  command -v go >/dev/null || { echo "build-go-tools: Go is required to build $name" >&2; exit 1; }
  echo "build-go-tools: building $pkg" >&2
  GOBIN="$bin" CGO_ENABLED=0 GOFLAGS=-buildvcs=false go install "$pkg" >&2
  echo "$pkg" > "$stamp"
done
echo "$bin"
