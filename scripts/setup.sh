#!/usr/bin/env bash
# One-time set-up on a fresh machine (idempotent): hangtrace (editable, with its .pth
# activation line), a CPU build of torch pinned to the file on this machine's disk,
# Ray with its state API, and the test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import hangtrace, torch, ray, pytest" >/dev/null 2>&1 || \
   ! "$PY" -c "import importlib.metadata as m; m.version('hangtrace')" >/dev/null 2>&1; then
  "$PY" -m pip install --quiet --root-user-action=ignore --disable-pip-version-check \
      "torch==2.13.0" -e ".[torch,ray,test]"
fi
