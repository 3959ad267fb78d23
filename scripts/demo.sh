#!/usr/bin/env bash
# The main job: a 4-rank gloo training job that hangs after rollout (one context-parallel
# rank builds an extra micro-batch), run under `hangtrace run`, which prints the verdict
# and then stops the hung job (--stop-on-stall). Exits 0 when the job was stopped after a
# verdict (status 143 = SIGTERM from hangtrace), else with the job's own status.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit $?
PY=${PYTHON:-python3}
"$PY" -m hangtrace run --stall-s 10 --stop-on-stall -- \
    "$PY" examples/train_faults.py --fault "${1:-cp-extra-microbatch}"
status=$?
if [ "$status" -eq 143 ]; then
  echo "demo: the job hung, hangtrace printed the verdict above and stopped it" >&2
  exit 0
fi
exit "$status"
