#!/usr/bin/env python3
"""Run the blind straggler jobs of this folder as a user would, and judge hangtrace's verdicts.

For each job (every *.py here but this file, or those named on the command line):

1. a fresh run directory under --base (default /tmp/blind-stragglers);
2. ``python -m hangtrace run --stall-s 60 --dir RUN_DIR -- <launcher> JOB.py``, in its own
   session (torchrun --standalone --nproc-per-node NPROC for LAUNCH "torchrun", else
   ``python JOB.py``, which starts its ranks itself);
3. while it runs, once, when rank 0 logs ``step DUMP_AT_STEP`` (a constant of the job,
   after its slowdown began; else 2/3 of STEPS): ``hangtrace dump --json RUN_DIR``;
4. after it ends: ``hangtrace analyze --json RUN_DIR``;
5. both verdicts checked against the job's EXPECT (``EXPECT["dump"]`` overrides it for the
   dump when the two should differ).

One line per job: name, dump verdict, analyze verdict, RIGHT/WRONG and why; then the job's
own per-rank step times (its ``TIMING`` lines), which prove the slowdown is real.

``--tree PATH`` sets PYTHONPATH=PATH for everything run (the job, ``hangtrace run``,
``dump``, ``analyze``): the tool under test can be another checkout. ``--out FILE`` writes
every result (verdict JSON included) as JSON.

    python run_blind.py --tree .                          # every job
    python run_blind.py --tree .          tr_ddp_throttled mp_slow_from_start
"""

import argparse
import ast
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STEP_RE = re.compile(r"\bstep (\d+) loss\b")


def consts(path):
    out = {}
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("LAUNCH", "NPROC", "STEPS", "DUMP_AT_STEP", "EXPECT"):
                out[name] = ast.literal_eval(node.value)
    return out


def job_paths(names):
    every = sorted(
        p for p in glob.glob(os.path.join(HERE, "*.py"))
        if os.path.basename(p) != "run_blind.py" and not os.path.basename(p).startswith("_")
    )
    if not names:
        return every
    out = []
    for n in names:
        n = os.path.basename(n)
        n = n[:-3] if n.endswith(".py") else n
        match = [p for p in every if os.path.basename(p)[:-3] == n]
        if not match:
            sys.exit("no job named %r (have: %s)" % (n, ", ".join(os.path.basename(p)[:-3] for p in every)))
        out += match
    return out


def tool_env(tree):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGTRACE")}
    env["PYTHONUNBUFFERED"] = "1"
    if tree:
        env["PYTHONPATH"] = os.path.abspath(tree)
    return env


def hangtrace_json(args, env, timeout=180):
    """Run ``python -m hangtrace ARGS`` (ARGS include --json); return (verdict dict or None, note)."""
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "hangtrace"] + args, env=env, capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timed out after %d s" % timeout
    took = time.monotonic() - t0
    try:
        return json.loads(p.stdout), "rc=%d, %.1f s" % (p.returncode, took)
    except ValueError:
        return None, "rc=%d, no JSON on stdout; stderr: %s" % (p.returncode, p.stderr.strip()[-400:])


def judge(d, want):
    """(right: bool, verdict text, why) of verdict ``d`` against expectation ``want``."""
    if d is None:
        return False, "no verdict", "the command gave no JSON verdict"
    kind = d.get("kind")
    s = (d.get("details") or {}).get("straggler")
    if s:
        got = "%s, straggler rank %s (%+.0f ms/step, %+.0f %%, phase %s, since step %s, group %s)" % (
            kind, s.get("rank"), s.get("added_ms_per_step") or 0, s.get("added_pct") or 0,
            s.get("phase"), s.get("since_step"), s.get("group"))
    else:
        got = "%s, no straggler" % kind
    if kind != "progressing":
        return False, got, "kind %r, want 'progressing' (the job never stopped)" % kind
    rank = want.get("straggler")
    if rank is None:
        ended = want.get("ended_ok")  # (rank, (lo, hi)): naming it is right only with its end
        if s and ended and s.get("rank") == ended[0] and s.get("until_step") is not None \
                and ended[1][0] <= s["until_step"] <= ended[1][1]:
            return True, got + " until step %s" % s["until_step"], "the episode named with its end"
        if s:
            return False, got, "named rank %s as slow now; no rank is slow now in this job" % s.get("rank")
        return True, got, "no straggler named, as expected"
    if not s:
        return False, got, "no straggler named; want rank %d" % rank
    if s.get("rank") != rank:
        return False, got, "named rank %s; want rank %d" % (s.get("rank"), rank)
    since = want.get("since_step")
    if since is not None:
        got_since = s.get("since_step")
        if got_since is None:
            if not want.get("since_step_null_ok"):
                return False, got, "since_step null; want %d-%d" % since
        elif not since[0] <= got_since <= since[1]:
            return False, got, "since_step %s; want %d-%d" % (got_since, since[0], since[1])
    low = want.get("min_added_pct")
    if low is not None and (s.get("added_pct") or 0) < low:
        return False, got, "added_pct %s < %s" % (s.get("added_pct"), low)
    summary = d.get("summary") or ""
    if "rank %d" % rank not in summary:
        return False, got, "the summary does not name rank %d: %s" % (rank, summary[:200])
    return True, got, "rank %d named as expected" % rank


def run_job(path, args, env):
    c = consts(path)
    name = os.path.basename(path)[:-3]
    run_dir = os.path.join(args.base, "%s-%s" % (name, time.strftime("%Y%m%dT%H%M%S")))
    if os.path.exists(run_dir):
        shutil.rmtree(run_dir)
    os.makedirs(os.path.dirname(run_dir), exist_ok=True)
    if c["LAUNCH"] == "torchrun":
        launcher = [shutil.which("torchrun") or "torchrun", "--standalone", "--nproc-per-node",
                    str(c["NPROC"]), path]
    else:
        launcher = [sys.executable, path]
    cmd = [sys.executable, "-m", "hangtrace", "run", "--stall-s", str(args.stall_s), "--dir", run_dir,
           "--"] + launcher
    dump_at = c.get("DUMP_AT_STEP") or (2 * c.get("STEPS", 60)) // 3
    res = {"job": name, "run_dir": run_dir, "cmd": cmd, "dump_at_step": dump_at}
    lines, state = [], {"step": -1, "dump": None}

    def do_dump():
        state["dump_step0"] = state["step"]
        d, note = hangtrace_json(["dump", "--json", "--stall-s", str(args.stall_s), run_dir], env)
        state["dump"], state["dump_note"], state["dump_step1"] = d, note, state["step"]

    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    dumper = None
    timer = threading.Timer(args.timeout, lambda: os.killpg(p.pid, signal.SIGKILL))
    timer.start()
    try:
        for line in p.stdout:
            lines.append(line.rstrip("\n"))
            if args.verbose:
                print("   | " + line.rstrip("\n"), flush=True)
            m = STEP_RE.search(line)
            if m:
                state["step"] = max(state["step"], int(m.group(1)))
                if dumper is None and state["step"] >= dump_at:
                    dumper = threading.Thread(target=do_dump)
                    dumper.start()
        p.wait()
    finally:
        timer.cancel()
        try:
            os.killpg(p.pid, signal.SIGKILL)  # anything left of the job's session
        except OSError:
            pass
    res["rc"], res["wall_s"] = p.returncode, round(time.monotonic() - t0, 1)
    if dumper is not None:
        dumper.join()
    res["timing"] = [l[l.index("TIMING"):] for l in lines if re.search(r"TIMING rank \d", l)]
    res["console_verdicts"] = [lines[i + 1] for i, l in enumerate(lines[:-1]) if "==== hangtrace verdict" in l]
    res["last_step"] = state["step"]
    res["tail"] = lines[-15:]

    want = c["EXPECT"]
    want_dump = dict(want, **want.get("dump", {}))
    if state["dump"] is None and dumper is None:
        res["dump"] = {"right": False, "verdict": "no dump", "why": "rank 0 never logged step %d" % dump_at}
    else:
        ok, got, why = judge(state["dump"], want_dump)
        res["dump"] = {"right": ok, "verdict": got, "why": why, "note": state.get("dump_note"),
                       "steps": (state.get("dump_step0"), state.get("dump_step1")),
                       "summary": (state["dump"] or {}).get("summary"),
                       "straggler": ((state["dump"] or {}).get("details") or {}).get("straggler")}
    d, note = hangtrace_json(["analyze", "--json", run_dir], env)
    ok, got, why = judge(d, want)
    snaps = sorted(glob.glob(os.path.join(run_dir, "snapshots", "*", "diagnosis.json")))
    res["snapshots"] = []
    for f in snaps:
        try:
            sd = json.load(open(f))
            res["snapshots"].append("%s %s%s" % (os.path.basename(os.path.dirname(f)), sd.get("kind"),
                                                 " (dump)" if "window" in (sd.get("details") or {}) else ""))
        except (OSError, ValueError):
            pass
    res["analyze"] = {"right": ok, "verdict": got, "why": why, "note": note,
                      "from_dump_snapshot": "window" in ((d or {}).get("details") or {}),
                      "summary": (d or {}).get("summary"),
                      "straggler": ((d or {}).get("details") or {}).get("straggler")}
    # Informational: `analyze RUN_DIR` reads the newest snapshot (here the mid-run dump's), so
    # also analyse a copy of the run without its snapshots: the verdict of the whole run's rings.
    rings = run_dir + "-rings"
    try:
        shutil.copytree(run_dir, rings, ignore=shutil.ignore_patterns("snapshots"))
        d, note = hangtrace_json(["analyze", "--json", rings], env)
    except (OSError, shutil.Error) as e:
        d, note = None, "copy failed: %s" % e
    ok, got, why = judge(d, want)
    res["rings"] = {"right": ok, "verdict": got, "why": why, "note": note,
                    "summary": (d or {}).get("summary"),
                    "straggler": ((d or {}).get("details") or {}).get("straggler")}
    if p.returncode != 0:
        res["job_error"] = "the job exited %s (it must run to completion)" % p.returncode
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("jobs", nargs="*", help="job names (default: all)")
    ap.add_argument("--tree", help="checkout of hangtrace to test (PYTHONPATH for everything run)")
    ap.add_argument("--base", default="/tmp/blind-stragglers", help="where run directories go")
    ap.add_argument("--stall-s", type=int, default=60, help="hangtrace run/dump --stall-s (default 60)")
    ap.add_argument("--timeout", type=int, default=300, help="kill a job after this many seconds")
    ap.add_argument("--out", help="write all results as JSON here")
    ap.add_argument("-v", "--verbose", action="store_true", help="echo the job's console")
    args = ap.parse_args()
    env = tool_env(args.tree)
    results = []
    for path in job_paths(args.jobs):
        r = run_job(path, args, env)
        results.append(r)
        both = r["dump"]["right"] and r["analyze"]["right"] and "job_error" not in r
        print("%-24s dump: %s | analyze: %s | %s: dump %s; analyze %s%s" % (
            r["job"], r["dump"]["verdict"], r["analyze"]["verdict"], "RIGHT" if both else "WRONG",
            r["dump"]["why"], r["analyze"]["why"],
            ("; JOB FAILED: " + r["job_error"]) if "job_error" in r else ""), flush=True)
        print("    run %s (rc %s, %.0f s, last step %s, dump at steps %s)" % (
            r["run_dir"], r["rc"], r["wall_s"], r["last_step"], r["dump"].get("steps")), flush=True)
        print("    snapshots in the run dir (analyze reads the newest): %s" % (
            ", ".join(r["snapshots"]) or "none"), flush=True)
        print("    the run's rings without its snapshots (informational): %s: %s" % (
            r["rings"]["verdict"], "right" if r["rings"]["right"] else "wrong"), flush=True)
        for k in ("dump", "analyze"):
            if not r[k]["right"] and r[k].get("summary"):
                print("    %s said: %s" % (k, r[k]["summary"][:300]), flush=True)
        for t in r["timing"]:
            print("    " + t, flush=True)
        for v in r["console_verdicts"]:
            print("    console: " + v, flush=True)
        if "job_error" in r:
            for t in r["tail"]:
                print("    | " + t)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1, default=str)
    right = sum(1 for r in results if r["dump"]["right"] and r["analyze"]["right"] and "job_error" not in r)
    print("%d of %d jobs RIGHT" % (right, len(results)))


if __name__ == "__main__":
    main()
