#!/usr/bin/env bash
# Set up (if needed) and run the tests. `scripts/test.sh [PYTEST_ARGS...]`: the whole suite,
# unit and integration tests with real processes, gloo groups, signals, tmpfs mounts and Ray
# where the machine allows. `scripts/test.sh unit [PYTEST_ARGS...]`: tests/unit only (fast).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}
TESTS=tests
if [ "${1:-}" = unit ]; then TESTS=tests/unit; shift; fi
exec "$PY" -m pytest -q -p no:cacheprovider --durations=60 "$TESTS" "$@"
