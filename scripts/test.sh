#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite: unit and integration tests with real
# processes, gloo groups, signals, tmpfs mounts and Ray where the machine allows.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}
exec "$PY" -m pytest -q -p no:cacheprovider tests "$@"
