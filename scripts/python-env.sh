#!/usr/bin/env bash
# A Python virtualenv with grpcio and grpcio-tools, in tools/python (ignored by git), for
# the polyglot client example and its test. Prints the interpreter path; reuses it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/tools/python"
want="grpcio==1.85.3 grpcio-tools==1.85.1"
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.requirements" 2>/dev/null)" = "$want" ]; then
  echo "$venv/bin/python"
  exit 0
fi
command -v python3 >/dev/null || { echo "python-env: python3 is required" >&2; exit 1; }
python3 -m venv "$venv" >&2
"$venv/bin/pip" install --quiet --disable-pip-version-check $want >&2
echo "$want" > "$venv/.requirements"
echo "$venv/bin/python"
