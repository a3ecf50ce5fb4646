#!/usr/bin/env bash
# Make .venv and install atc-stream into it (with the test extras when asked: setup.sh test).
# Idempotent: re-running only installs what changed. Needs python3 >= 3.10 with venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
extras=""
[ "${1:-}" = "test" ] && extras="[test,redis,live,metrics]"
.venv/bin/python -m pip install -q -e ".${extras}"
