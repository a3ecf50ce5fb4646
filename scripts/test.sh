#!/usr/bin/env bash
# The full test run (what CI runs): set up .venv, the static checks (lint, format, the
# import floors, types), the main suite, then the CUDA kernels under numba's simulator in
# their own pytest process (the variable must be set before numba is imported). Extra
# arguments go to the main pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
bash scripts/ensure_redis.sh
PY_DIRS=(atc_stream tests benchmarks examples)
.venv/bin/ruff check "${PY_DIRS[@]}"
.venv/bin/ruff format --check "${PY_DIRS[@]}"
.venv/bin/lint-imports
.venv/bin/mypy
.venv/bin/python -m pytest -ra --strict-markers -q -m "not cudasim" "$@"
NUMBA_ENABLE_CUDASIM=1 .venv/bin/python -m pytest -ra --strict-markers -q -m cudasim tests/
