#!/usr/bin/env bash
# Evaluates every pod template in Kubernetes manifests against a Pod Security Standards
# level, offline, with the checks of the API server's PodSecurity admission (the Go package
# k8s.io/pod-security-admission/policy, pinned in scripts/pod-security-check/go.mod).
# Builds the checker into tools/bin (ignored by git) once per source version.
#   scripts/pod-security-check.sh [FILE…]   (default: deploy/kubernetes/*.yaml)
# POD_SECURITY_LEVEL picks the level (default restricted).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src="$root/scripts/pod-security-check"
bin="$root/tools/bin/pod-security-check"
stamp=$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-16)
if ! [ -x "$bin" ] || [ "$(cat "$bin.version" 2>/dev/null)" != "$stamp" ]; then
  command -v go >/dev/null || { echo "pod-security-check: Go is required to build the checker" >&2; exit 1; }
  mkdir -p "$root/tools/bin"
  (cd "$src" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -o "$bin" .) >&2
  echo "$stamp" > "$bin.version"
fi
if [ $# -eq 0 ]; then set -- "$root"/deploy/kubernetes/*.yaml; fi
exec "$bin" -level "${POD_SECURITY_LEVEL:-restricted}" "$@"
