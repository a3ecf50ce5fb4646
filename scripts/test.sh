#!/usr/bin/env bash
# The full test run (what CI runs): set up .venv, lint, the main suite, then the CUDA
# kernels under numba's simulator in their own pytest process (the variable must be
# set before numba is imported). Extra arguments go to the main pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
bash scripts/ensure_redis.sh
.venv/bin/ruff check atc_stream tests benchmarks examples
.venv/bin/python -m pytest -q -m "not cudasim" "$@"
NUMBA_ENABLE_CUDASIM=1 .venv/bin/python -m pytest -q -m cudasim tests/
