#!/usr/bin/env bash
# The main job: a 4-rank gloo training job that hangs after rollout (one context-parallel
# rank builds an extra micro-batch), run under `hangtrace run`, which prints the verdict.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}
exec "$PY" -m hangtrace run --stall-s 10 --stop-on-stall -- \
    "$PY" examples/train_faults.py --fault "${1:-cp-extra-microbatch}"
