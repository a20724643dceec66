#!/usr/bin/env bash
# Validates Kubernetes manifests against the API schemas of a Kubernetes version, offline:
# kubernetes-validate (PyPI) carries the JSON schemas of every supported version, so no
# cluster and no download at validation time. The virtualenv lives in tools/ (ignored by
# git) and is reused. Strict: unknown fields are errors, not warnings.
#   scripts/kubernetes-validate.sh [FILE…]   (default: deploy/kubernetes/*.yaml)
# KUBERNETES_VERSION picks the schemas (default 1.30.0).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/tools/kubernetes-validate"
want="kubernetes-validate==1.37.0"
if ! [ -x "$venv/bin/kubernetes-validate" ] || [ "$(cat "$venv/.requirements" 2>/dev/null)" != "$want" ]; then
  command -v python3 >/dev/null || { echo "kubernetes-validate: python3 is required" >&2; exit 1; }
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check "$want" >&2
  echo "$want" > "$venv/.requirements"
fi
if [ $# -eq 0 ]; then set -- "$root"/deploy/kubernetes/*.yaml; fi
exec "$venv/bin/kubernetes-validate" --strict --quiet -k "${KUBERNETES_VERSION:-1.30.0}" "$@"
