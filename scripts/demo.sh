#!/usr/bin/env bash
# Set up .venv and run the demo: a deterministic multi-symbol random walk replayed through
# the engine (CPU, no Redis, no GPU). Extra arguments go to `atc-stream demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/atc-stream demo "$@"
