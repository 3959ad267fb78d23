"""Time from stall onset to the printed verdict, with 4 local gloo ranks.

Part 1, end to end. Each run starts::

    python -m hangtrace run --stall-s S --stop-on-stall --dir RUN -- \\
        python examples/train_faults.py --fault stuck-queue --world-size 4

(rank 1 waits forever on a queue whose producer thread died; ranks 0, 2, 3 block in the
scoring all_reduce). hangtrace's stderr is read line by line as it arrives; each line is
stamped with ``time.time_ns()`` (and ``time.monotonic()``) on arrival.

The **stall onset** is the last progress anywhere in the run: the largest header field
``progress_wall_ns`` over the ring files of the run, read with
``hangtrace.tracer.ring.reader.read_ring`` from the snapshot hangtrace stored when it gave
the verdict (``RUN/snapshots/<time>/rings``; the live rings are read too, after the run,
and any difference is reported). Reported per run:

* onset -> "stall detected" line;
* onset -> "==== hangtrace verdict ====" block printed;
* verdict - threshold (target: at most 3 s);
* the verdict's kind and culprit (expected: rank 1, stuck-outside-collective).

Runs alternate S = 5 and S = 10 (``--thresholds``), ``--repeats`` (3) of each.

Part 2, breakdown. A fresh interpreter starts the same job traced (no watcher), waits
until it hangs, then times, ``--rounds`` times (the first round is cold: it includes the
imports of the analysis modules, as the first incident of ``hangtrace run`` does):

* ``load_run`` (read every ring);
* ``take_snapshot(with_stacks=False)`` (read + compact copies + processes.json);
* ``stacks.dump_stacks`` of the 5 traced processes (launcher + 4 ranks; py-spy in parallel);
* ``diagnose`` on the snapshot with stacks;
* ``text_report`` + ``verdict_paragraph``;
* ``write_diagnosis``;
* ``pipeline.dump_live`` end to end (what ``hangtrace run`` calls; ``watcher.diagnose_and_report``
  before issue 8).

Usage::

    python3 benchmarks/bench_verdict_latency.py [--repeats 3] [--thresholds 5,10]
        [--rounds 5] [--out results.json] [--quick]
"""

import argparse
import glob
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "examples", "train_faults.py")
FAULT = ["--fault", "stuck-queue", "--world-size", "4"]
EXPECTED = [1]


def _clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("HANGTRACE")}


def _max_progress(ring_dir):
    """(max progress_wall_ns over the rings in ring_dir, {rank: progress_wall_ns})."""
    from hangtrace.tracer.ring import reader as R

    per = {}
    for path in glob.glob(os.path.join(ring_dir, "ring-*.htr")):
        try:
            h = R.read_ring(path).header
        except Exception:
            continue
        per["%d:%d" % (h["rank"], h["pid"])] = h["progress_wall_ns"]
    return (max(per.values()) if per else 0), per


# --------------------------------------------------------------------------- part 1
def one_run(stall_s, tmp, timeout_s=180.0):
    run_dir = os.path.join(tmp, "run-%s-%d" % (stall_s, time.time_ns()))
    cmd = [
        sys.executable,
        "-m",
        "hangtrace",
        "run",
        "--stall-s",
        str(stall_s),
        "--stop-on-stall",
        "--dir",
        run_dir,
        "--",
        sys.executable,
        EXAMPLE,
    ] + FAULT
    lines = []
    t_start = time.time_ns()
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=_clean_env(),
        start_new_session=True,
        cwd=REPO,
    )

    def reader():
        for raw in iter(p.stderr.readline, b""):
            lines.append((time.time_ns(), time.monotonic(), raw.decode(errors="replace").rstrip("\n")))

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    killed = False
    try:
        p.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        killed = True
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    th.join(timeout=5)
    r = {"stall_s": stall_s, "rc": p.returncode, "killed_by_bench": killed, "run_dir": run_dir}
    detected = next(((w, m, ln) for w, m, ln in lines if "stall detected:" in ln), None)
    verdict = next(
        (i for i, (w, m, ln) in enumerate(lines) if ln.startswith("==== hangtrace verdict ====")), None
    )
    snaps = sorted(glob.glob(os.path.join(run_dir, "snapshots", "*", "rings")))
    onset, per = _max_progress(snaps[0]) if snaps else (0, {})
    live_onset, live_per = _max_progress(run_dir)
    r["onset_wall_ns"] = onset
    r["onset_source"] = "snapshot rings" if snaps else None
    r["live_onset_differs_ns"] = (live_onset - onset) if onset and live_onset else None
    r["progress_per_process"] = per
    r["start_to_onset_s"] = (onset - t_start) / 1e9 if onset else None
    if detected and onset:
        r["onset_to_detected_s"] = (detected[0] - onset) / 1e9
        r["detected_line"] = detected[2]
    if verdict is not None and onset:
        w = lines[verdict][0]
        r["onset_to_verdict_s"] = (w - onset) / 1e9
        r["verdict_minus_threshold_s"] = r["onset_to_verdict_s"] - stall_s
        r["verdict_text"] = lines[verdict + 1][2] if verdict + 1 < len(lines) else ""
        if detected:
            r["detected_to_verdict_s"] = (w - detected[0]) / 1e9
    diag = sorted(glob.glob(os.path.join(run_dir, "snapshots", "*", "diagnosis.json")))
    if diag:
        with open(diag[0]) as f:
            d = json.load(f)
        r["kind"], r["culprit_ranks"] = d.get("kind"), d.get("culprit_ranks")
    r["stderr_tail"] = [ln for _w, _m, ln in lines[-6:]]
    return r


# --------------------------------------------------------------------------- part 2
def _wait_hung(run_dir, proc, quiet_s=3.0, timeout_s=120.0):
    """Wait until 5 rings exist and no progress for quiet_s; return the rings' pids."""
    from hangtrace.tracer.ring import layout as F
    from hangtrace.tracer.ring import reader as R

    t0 = time.monotonic()
    last, since = None, time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError("job exited with %s before hanging" % proc.returncode)
        heads = []
        for path in glob.glob(os.path.join(run_dir, "ring-*.htr")):
            try:
                with open(path, "rb") as f:
                    heads.append(R.read_header(f.read(F.HEADER_SIZE), path))
            except Exception:
                pass
        ranked = [h for h in heads if h["rank"] >= 0]
        cur = tuple(sorted((h["pid"], h["progress_count"]) for h in heads))
        if cur != last:
            last, since = cur, time.monotonic()
        elif len(ranked) == 4 and all(h["step"] >= 2 for h in ranked) and time.monotonic() - since >= quiet_s:
            return [h["pid"] for h in heads]
        time.sleep(0.2)
    raise RuntimeError("job did not hang within %.0f s" % timeout_s)


def child_breakdown(rounds, tmp):
    run_dir = os.path.join(tmp, "breakdown-run")
    os.makedirs(run_dir)
    env = dict(_clean_env(), HANGTRACE="1", HANGTRACE_DIR=run_dir, HANGTRACE_AUTO_WATCH="0")
    proc = subprocess.Popen(
        [sys.executable, EXAMPLE] + FAULT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd=REPO,
    )
    out = {"rounds": []}
    try:
        pids = _wait_hung(run_dir, proc)
        out["pids"] = pids
        for i in range(rounds):
            r = {}
            t = time.perf_counter()
            from hangtrace.tracer.collect.rings import load_run, take_snapshot, write_diagnosis

            r["import_collect_s"] = time.perf_counter() - t
            t = time.perf_counter()
            load_run(run_dir)
            r["load_run_s"] = time.perf_counter() - t
            t = time.perf_counter()
            take_snapshot(run_dir, reason="request", with_stacks=False)
            r["snapshot_copy_s"] = time.perf_counter() - t
            t = time.perf_counter()
            from hangtrace.tracer.collect import stacks as S

            r["import_stacks_s"] = time.perf_counter() - t
            t = time.perf_counter()
            res = S.dump_stacks(pids)
            r["pyspy_5_processes_s"] = time.perf_counter() - t
            r["pyspy_ok"] = sum(1 for v in res.values() if v.get("threads"))
            snap = take_snapshot(run_dir, reason="request", with_stacks=True)
            t = time.perf_counter()
            from hangtrace.tracer.analyze.diagnose import diagnose
            from hangtrace.tracer.report.text import diagnosis_json, text_report, verdict_paragraph

            r["import_analysis_report_s"] = time.perf_counter() - t
            t = time.perf_counter()
            diag = diagnose(snap)
            r["diagnose_s"] = time.perf_counter() - t
            t = time.perf_counter()
            text = text_report(diag, snap)
            verdict_paragraph(diag)
            r["report_s"] = time.perf_counter() - t
            t = time.perf_counter()
            write_diagnosis(snap, diagnosis_json(diag), text)
            r["write_diagnosis_s"] = time.perf_counter() - t
            from hangtrace.tracer.pipeline import dump_live

            t = time.perf_counter()
            d2 = dump_live(run_dir, "request").diagnosis
            r["diagnose_and_report_s"] = time.perf_counter() - t
            r["kind"], r["culprit_ranks"] = d2.kind, d2.culprit_ranks
            out["rounds"].append(r)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
    print("RESULT " + json.dumps(out))


# --------------------------------------------------------------------------- parent
def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _f(x, nd=2):
    return "—" if x is None else ("%." + str(nd) + "f") % x


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--thresholds", default="5,10")
    ap.add_argument("--rounds", type=int, default=5, help="breakdown rounds (the first is cold)")
    ap.add_argument("--quick", action="store_true", help="1 repeat of S=5, 2 breakdown rounds")
    ap.add_argument("--no-breakdown", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tmp", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child == "breakdown":
        return child_breakdown(a.rounds, a.tmp)
    if a.quick:
        a.repeats, a.thresholds, a.rounds = 1, "5", 2
    thresholds = [float(x) for x in a.thresholds.split(",")]
    tmp = tempfile.mkdtemp(prefix="bench_verdict_")
    res = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_start": os.getloadavg(),
        },
        "command": "hangtrace run --stall-s S --stop-on-stall -- python examples/train_faults.py "
        + " ".join(FAULT),
        "runs": [],
        "problems": [],
    }
    try:
        for rep in range(a.repeats):
            for s in thresholds:
                r = one_run(s, tmp)
                r["loadavg"] = os.getloadavg()[0]
                res["runs"].append(r)
                print(
                    "S=%g run %d: onset->detected %s s, onset->verdict %s s, %s %s"
                    % (
                        s,
                        rep + 1,
                        _f(r.get("onset_to_detected_s")),
                        _f(r.get("onset_to_verdict_s")),
                        r.get("kind"),
                        r.get("culprit_ranks"),
                    ),
                    file=sys.stderr,
                    flush=True,
                )
                if r.get("onset_to_verdict_s") is None:
                    res["problems"].append(
                        "S=%g run %d: no verdict/onset; stderr tail: %s" % (s, rep + 1, r["stderr_tail"])
                    )
                elif r.get("culprit_ranks") != EXPECTED:
                    res["problems"].append(
                        "S=%g run %d: culprit %s, expected %s"
                        % (s, rep + 1, r.get("culprit_ranks"), EXPECTED)
                    )
                elif r["verdict_minus_threshold_s"] > 3.0:
                    res["problems"].append(
                        "S=%g run %d: verdict %.2f s after threshold (target <= 3 s)"
                        % (s, rep + 1, r["verdict_minus_threshold_s"])
                    )
        if not a.no_breakdown:
            btmp = os.path.join(tmp, "bd")
            os.makedirs(btmp)
            p = subprocess.run(
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--child",
                    "breakdown",
                    "--rounds",
                    str(a.rounds),
                    "--tmp",
                    btmp,
                ],
                capture_output=True,
                text=True,
                env=_clean_env(),
            )
            line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line:
                res["breakdown"] = json.loads(line[7:])
            else:
                res["problems"].append("breakdown failed: %s" % p.stderr[-1500:])
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    res["machine"]["loadavg_end"] = os.getloadavg()
    print_tables(res)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)
    return 1 if res["problems"] else 0


def print_tables(res):
    print(
        "\n### Stall onset -> verdict, 4 local gloo ranks, fault stuck-queue (`hangtrace run --stop-on-stall`)\n"
    )
    print(
        "| S (threshold) | run | onset -> 'stall detected' | onset -> verdict printed | verdict - S | "
        "detected -> verdict | verdict | culprit | load (1 min) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---|---|---:|")
    by = {}
    for r in res["runs"]:
        by.setdefault(r["stall_s"], []).append(r)
    for s, rs in by.items():
        for i, r in enumerate(rs):
            print(
                "| %g s | %d | %s s | %s s | **%s s** | %s s | %s | %s | %.1f |"
                % (
                    s,
                    i + 1,
                    _f(r.get("onset_to_detected_s")),
                    _f(r.get("onset_to_verdict_s")),
                    _f(r.get("verdict_minus_threshold_s")),
                    _f(r.get("detected_to_verdict_s")),
                    r.get("kind"),
                    r.get("culprit_ranks"),
                    r.get("loadavg", 0),
                )
            )
        print(
            "| %g s | median | %s s | %s s | **%s s** | %s s | | | |"
            % (
                s,
                _f(_med([r.get("onset_to_detected_s") for r in rs])),
                _f(_med([r.get("onset_to_verdict_s") for r in rs])),
                _f(_med([r.get("verdict_minus_threshold_s") for r in rs])),
                _f(_med([r.get("detected_to_verdict_s") for r in rs])),
            )
        )
    bd = res.get("breakdown")
    if bd and bd.get("rounds"):
        rounds = bd["rounds"]
        print("\n### Where the verdict time goes (live hung job, 5 traced processes; ms)\n")
        keys = [
            ("load_run_s", "read rings (`load_run`)"),
            ("snapshot_copy_s", "snapshot copy (`take_snapshot`, no stacks)"),
            ("pyspy_5_processes_s", "py-spy stacks of 5 processes (`dump_stacks`)"),
            ("diagnose_s", "`diagnose`"),
            ("report_s", "`text_report` + `verdict_paragraph`"),
            ("write_diagnosis_s", "`write_diagnosis`"),
            ("diagnose_and_report_s", "**total: `diagnose_and_report`**"),
            ("import_analysis_report_s", "import analysis + report modules"),
        ]
        print("| step | cold (round 1) | warm (median of rounds 2-%d) |" % len(rounds))
        print("|---|---:|---:|")
        for k, label in keys:
            cold = rounds[0].get(k)
            warm = _med([r.get(k) for r in rounds[1:]]) if len(rounds) > 1 else None
            print(
                "| %s | %s | %s |"
                % (
                    label,
                    _f(cold * 1e3 if cold is not None else None, 1),
                    _f(warm * 1e3 if warm is not None else None, 1),
                )
            )
        print(
            "\nverdict in every round: %s" % sorted({(r["kind"], tuple(r["culprit_ranks"])) for r in rounds})
        )
    if res["problems"]:
        print("\nPROBLEMS:")
        for p in res["problems"]:
            print("- " + p)


if __name__ == "__main__":
    sys.exit(main())
