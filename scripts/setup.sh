#!/usr/bin/env bash
# One-time set-up on a fresh machine (idempotent): hangtrace from THIS checkout (editable,
# with its .pth activation line and the optional C hot path), a CPU build of torch pinned
# to the file on this machine's disk, numpy, Ray with its state API, the test tools and the
# training frameworks of the blind framework corpus (Ray Train, Lightning, transformers, accelerate).
set -euo pipefail
cd "$(dirname "$0")/.."
here=$(pwd -P)
PY=${PYTHON:-python3}
# Checked from / so that the checkout itself is not on sys.path: the installed hangtrace
# must be this checkout's (another clone's editable install would be tested otherwise).
installed=$(cd / && "$PY" -c "import hangtrace, torch, ray, pytest, numpy, os, ray.train.torch, \
pytorch_lightning, transformers, accelerate, ruff, importlinter; \
print(os.path.realpath(os.path.dirname(os.path.dirname(hangtrace.__file__))))" 2>/dev/null || true)
# With a C compiler the hot path's extension must be there too: a new clone at the path of
# an old one is "installed" already but has no hangtrace/hooks/_fastrec*.so of its own.
if [ "$installed" = "$here" ] && command -v cc >/dev/null 2>&1 \
    && ! ls hangtrace/hooks/_fastrec*.so >/dev/null 2>&1; then
  installed=""
fi
if [ "$installed" != "$here" ]; then
  "$PY" -m pip install --quiet --root-user-action=ignore --disable-pip-version-check \
      "torch==2.13.0" -e ".[torch,ray,test,frameworks]"
fi
# The start-up bundle (hangtrace/hooks/preload.py): our in-process modules in one file per
# group, rebuilt when a source changed; without it traced processes import them as usual.
(cd / && "$PY" -c "from hangtrace.hooks import preload; preload.refresh()")
# Debian's Chromium for the timeline's browser check (scripts/timeline_screenshot.py --check:
# the written trace loaded in the Perfetto UI, every event counted; ~30 s, 112 MB, once).
# Where it cannot be installed (not root, no apt) those tests skip and say so.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get install -y -q chromium >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }) \
    || echo "setup: chromium not installed: the timeline's browser checks will skip" >&2
fi
