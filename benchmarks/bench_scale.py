"""Scale: ``hangtrace analyze --json RUN_DIR`` on N ranks of REAL rings (issue 40).

The rings are those of a real traced run, cloned: ``benchmarks/scale_job.py`` runs as a
4-rank gloo job under ``HANGTRACE=1`` (DDP, whose C++-issued all-reduces only torch's
Flight Recorder sees; 2 persistent DataLoader workers per rank; ``--steps`` steps in
phases, 'eval' phases with a barrier; the 1 Hz memory sampler on), ends hung (rank 3 sleeps
in a 'checkpoint' phase, ranks 0-2 block in one more all_reduce), its Flight Recorder dumps
are requested (``RUN_DIR/fr``), then every process is SIGKILLed. That run is the template
(``--template DIR`` keeps/reuses it).

Each clone rank r takes the rings of template rank ``r % 3`` (rank ``--culprit``: template
rank 3) and of that rank's DataLoader workers, with the header patched (pid, ppid, rank,
local rank, world size N, host ``bench-node-<r // 8>``: a host other than this one, as
seen from a login node), the world group's definition rewritten to N ranks (the old entry
becomes an unused string, the new one is appended: string ids are offsets and stay valid),
and its Flight Recorder dump and environment record copied under the new host/pid. Slots
never written stay holes in the file (a real ring's are zeros). The template's own
verdict is printed beside the clones'.

Each code version runs ``python -m hangtrace analyze --json --stall-s 10 RUN_DIR`` (the template is minutes
old: a 10 s stall threshold makes its hang a hang) in its own
subprocess, interleaved over ``--repeats`` rounds; wall time (median), peak RSS and CPU
time (``resource.getrusage(RUSAGE_CHILDREN)`` in a fresh helper process per run) are
reported side by side with the verdict's kind and culprits. ``--prev DIR`` is a checkout
of the previous code (``git worktree add /tmp/prev <commit>``); its run gets
``PYTHONPATH=DIR``.

    python benchmarks/bench_scale.py --prev /tmp/prev [--ranks 4096] [--template DIR]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

from hangtrace.tracer.ring import layout as F  # noqa: E402
from hangtrace.tracer.ring import reader as R  # noqa: E402


TEMPLATE_WORLD = 4
WORKERS_PER_RANK = 2
JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scale_job.py")


def record_template(run_dir: str, steps: int, step_sleep_s: float) -> None:
    """Run ``scale_job.py`` as a traced 4-rank gloo job into ``run_dir`` until it hangs,
    request its Flight Recorder dumps, let the memory sampler tick, SIGKILL every process."""
    from hangtrace.tracer.collect.frrequest import request_fr_dumps

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(TEMPLATE_WORLD):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HANGTRACE")}
        env.update(
            HANGTRACE="1",
            HANGTRACE_AUTO_WATCH="0",
            HANGTRACE_DIR=run_dir,
            PYTHONPATH=HERE,
            RANK=str(r),
            LOCAL_RANK=str(r),
            WORLD_SIZE=str(TEMPLATE_WORLD),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            PYTHONUNBUFFERED="1",
        )
        cmd = [sys.executable, JOB, "--steps", str(steps), "--step-sleep-s", str(step_sleep_s)]
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
        )
    try:
        for p in procs:
            line = p.stdout.readline() if p.stdout else ""
            if not line.startswith("HANGING"):
                raise SystemExit("template job failed: rank printed %r (rc %s)" % (line, p.poll()))
        time.sleep(2.5)
        got = request_fr_dumps(run_dir, [p.pid for p in procs], timeout_s=20)
        print("template: %d Flight Recorder dumps" % len(got), file=sys.stderr)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.wait()


def _rings(run_dir: str) -> List[Tuple[str, bytes, Dict[str, Any]]]:
    out = []
    for path in sorted(glob.glob(os.path.join(run_dir, "ring-*.htr"))):
        with open(path, "rb") as f:
            head = f.read(F.HEADER_SIZE)
            hdr = R.read_header(head, path)
            buf = head + f.read(hdr["nslots"] * F.SLOT_SIZE + hdr["strtab_used"])
        out.append((path, buf, hdr))
    return out


def _world_group_rewritten(buf: bytearray, hdr: Dict[str, Any], world: int) -> bytearray:
    """The ring with its world group's definition (ranks 0..3) replaced by one of ``world``
    ranks: the old entry's tag becomes T_STR (an unused string), the new entry is appended."""
    off, used = hdr["strtab_off"], hdr["strtab_used"]
    tab = buf[off : off + used]
    pos, extra = 8, b""
    while pos + F.STR_ENTRY.size <= used:
        tag, n = F.STR_ENTRY.unpack_from(tab, pos)
        body = bytes(tab[pos + F.STR_ENTRY.size : pos + F.STR_ENTRY.size + n])
        if tag == F.T_GROUP:
            g = json.loads(body)
            if g.get("ranks") == list(range(TEMPLATE_WORLD)):
                g["ranks"] = list(range(world))
                new = json.dumps(g, separators=(",", ":")).encode()
                extra += F.STR_ENTRY.pack(F.T_GROUP, len(new)) + new
                F.STR_ENTRY.pack_into(buf, off + pos, F.T_STR, n)
        pos += F.STR_ENTRY.size + n
    if used + len(extra) > hdr["strtab_size"]:
        raise SystemExit("string table too small for a %d-rank group" % world)
    F.STRUSED.pack_into(buf, F.STRUSED_OFF, used + len(extra))
    return buf + extra


def _write_sparse(path: str, buf: bytes, hdr: Dict[str, Any]) -> None:
    """Write ``buf`` leaving the never-written slots as a hole (zeros when read)."""
    off = hdr["strtab_off"]
    used_slots = min(hdr["next_idx"], hdr["nslots"])
    head_end = F.HEADER_SIZE + used_slots * F.SLOT_SIZE
    with open(path, "wb") as f:
        f.write(buf[:head_end])
        f.seek(off)
        f.write(buf[off:])


def write_run(template: str, run_dir: str, world: int, culprit: int) -> Tuple[int, float]:
    """Write the clones of ``template`` for ``world`` ranks into ``run_dir``; returns (ring
    bytes as read, seconds)."""
    t0 = time.perf_counter()
    rings = _rings(template)
    # a rank joined the world group; its DataLoader workers inherit RANK only as a hint
    by_rank = {h["rank"]: (p, b, h) for p, b, h in rings if h["rank_source"] == F.RANK_FROM_GROUP}
    kids: Dict[int, List[Tuple[str, bytes, Dict[str, Any]]]] = {}
    for p, b, h in rings:
        if h["rank_source"] != F.RANK_FROM_GROUP:
            kids.setdefault(h["ppid"], []).append((p, b, h))
    for d in ("fr", "env"):
        os.makedirs(os.path.join(run_dir, d), exist_ok=True)
    total = 0
    for rank in range(world):
        src = TEMPLATE_WORLD - 1 if rank == culprit else rank % (TEMPLATE_WORLD - 1)
        _p, b, h = by_rank[src]
        host = "bench-node-%d" % (rank // 8)
        pid = 100000 + rank * (WORKERS_PER_RANK + 1)
        procs = [(b, h, pid, 1)] + [
            (kb, kh, pid + 1 + i, pid) for i, (_kp, kb, kh) in enumerate(kids.get(h["pid"], []))
        ]
        for buf0, hd, npid, nppid in procs:
            buf = bytearray(buf0)
            _o, _pp, wall, mono, _t = F.IDENT.unpack_from(buf, F.IDENT_OFF)
            F.IDENT.pack_into(buf, F.IDENT_OFF, npid, nppid, wall, mono, 0)
            buf[F.HOST_OFF : F.HOST_OFF + F.HOST_LEN] = host.encode().ljust(F.HOST_LEN, b"\0")
            r0, lr0, w0, sig = F.RANK.unpack_from(buf, F.RANK_OFF)
            if r0 >= 0:
                F.RANK.pack_into(buf, F.RANK_OFF, rank, rank % 8, world, sig)
            buf = _world_group_rewritten(buf, hd, world)
            hd2 = dict(hd, strtab_used=F.STRUSED.unpack_from(buf, F.STRUSED_OFF)[0])
            _write_sparse(os.path.join(run_dir, "ring-%s-%d.htr" % (host, npid)), bytes(buf), hd2)
            total += len(buf)
            _copy_sidecars(template, run_dir, hd, host, npid, rank, world)
    return total, time.perf_counter() - t0


def _copy_sidecars(
    template: str, run_dir: str, hd: Dict[str, Any], host: str, pid: int, rank: int, world: int
) -> None:
    """The process's Flight Recorder dump (+ its meta sidecar) and environment record."""
    old = "%s-%d" % (hd["host"], hd["pid"])
    new = "%s-%d" % (host, pid)
    fr = os.path.join(template, "fr", old + ".pkl")
    if os.path.exists(fr):
        shutil.copyfile(fr, os.path.join(run_dir, "fr", new + ".pkl"))
        with open(os.path.join(template, "fr", old + ".meta.json")) as f:
            meta = json.load(f)
        meta.update(rank=rank, world_size=world, host=host, pid=pid)
        with open(os.path.join(run_dir, "fr", new + ".meta.json"), "w") as f:
            json.dump(meta, f)
    env = os.path.join(template, "env", old + ".json")
    if os.path.exists(env):
        with open(env) as f:
            text = f.read()
        with open(os.path.join(run_dir, "env", new + ".json"), "w") as f:
            f.write(text.replace(hd["host"], host).replace('"pid": %d' % hd["pid"], '"pid": %d' % pid))


def run_analyze(code_dir: str, run_dir: str, timeout_s: float) -> Dict[str, Any]:
    """``python -m hangtrace analyze --json RUN_DIR`` with ``PYTHONPATH=code_dir``:
    {'wall_s', 'maxrss_mib', 'rc', 'kind', 'culprits'} (wall/RSS of that child alone)."""
    env = dict(os.environ, PYTHONPATH=code_dir)
    env.pop("HANGTRACE", None)
    t0 = time.perf_counter()
    p = subprocess.Popen(
        [sys.executable, "-m", "hangtrace", "analyze", "--json", "--stall-s", "10", run_dir],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd="/",
    )
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return {"wall_s": None, "maxrss_mib": None, "rc": "timeout", "kind": None, "culprits": None}
    wall = time.perf_counter() - t0
    # the child is reaped by communicate(); RUSAGE_CHILDREN sums/maximises over every child
    # so far, so each run is measured in a fresh helper process (see _measure)
    try:
        d = json.loads(out)
        kind, culprits = d.get("kind"), d.get("culprit_ranks")
    except ValueError:
        kind, culprits = None, None
    return {
        "wall_s": wall,
        "rc": p.returncode,
        "kind": kind,
        "culprits": culprits,
        "stderr": err.decode("utf-8", "replace")[-300:] if p.returncode else "",
    }


def _measure(code_dir: str, run_dir: str, timeout_s: float) -> Dict[str, Any]:
    """One measurement in a fresh helper process, so ``RUSAGE_CHILDREN.ru_maxrss`` is the
    peak RSS of that one analyze run."""
    code = (
        "import json, resource, sys; sys.path.insert(0, %r); import bench_scale as B; "
        "r = B.run_analyze(%r, %r, %r); "
        "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
        "r['maxrss_mib'] = u.ru_maxrss / 1024; r['cpu_s'] = u.ru_utime + u.ru_stime; "
        "print(json.dumps(r))" % (os.path.dirname(os.path.abspath(__file__)), code_dir, run_dir, timeout_s)
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=HERE)
    )
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"wall_s": None, "maxrss_mib": None, "rc": "helper failed: %s" % out.stderr[-300:]}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=300, help="steps of the template job")
    ap.add_argument("--step-sleep-s", type=float, default=0.03, help="compute per template step")
    ap.add_argument("--template", default=None, help="template run directory (recorded when absent)")
    ap.add_argument("--culprit", type=int, default=1234)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prev", default=None, help="checkout of the previous code (PYTHONPATH for its run)")
    ap.add_argument("--prev-repeats", type=int, default=1, help="runs of the previous code (slow)")
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--dir", default=None, help="run directory to write (default: a temp dir, removed)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    a = ap.parse_args(argv)
    culprit = min(a.culprit, a.ranks - 1)
    run_dir = a.dir or tempfile.mkdtemp(prefix="hangtrace-bench-scale-")
    os.makedirs(run_dir, exist_ok=True)
    template = a.template or tempfile.mkdtemp(prefix="hangtrace-bench-scale-template-")
    try:
        if not glob.glob(os.path.join(template, "ring-*.htr")):
            record_template(template, a.steps, a.step_sleep_s)
        four = tempfile.mkdtemp(prefix="hangtrace-bench-scale-4-")
        write_run(template, four, TEMPLATE_WORLD, TEMPLATE_WORLD - 1)
        tv = run_analyze(HERE, four, a.timeout_s)
        shutil.rmtree(four, ignore_errors=True)
        print("the template's 4 ranks as clones: %s %s" % (tv["kind"], tv["culprits"]), file=sys.stderr)
        nbytes, took = write_run(template, run_dir, a.ranks, culprit)
        print(
            "wrote %d ranks' rings (%.0f MiB used) in %.1f s; culprit rank %d"
            % (a.ranks, nbytes / 2**20, took, culprit),
            file=sys.stderr,
        )
        versions = [("this", HERE, a.repeats)] + ([("previous", a.prev, a.prev_repeats)] if a.prev else [])
        res: Dict[str, List[Dict[str, Any]]] = {name: [] for name, _, _ in versions}
        for i in range(max(n for _, _, n in versions)):
            for name, d, n in versions:
                if i < n:
                    r = _measure(d, run_dir, a.timeout_s)
                    print(
                        "%s round %d: %s" % (name, i, {k: v for k, v in r.items() if k != "stderr"}),
                        file=sys.stderr,
                    )
                    res[name].append(r)
        print(
            "| code | ranks (real rings) | wall s (median) | CPU s (median) | peak RSS MiB | verdict | culprits |"
        )
        print("|---|---|---|---|---|---|---|")
        for name, runs in res.items():
            ok = [r for r in runs if r.get("wall_s") is not None and r.get("rc") == 0]
            wall = "%.2f" % statistics.median(r["wall_s"] for r in ok) if ok else str(runs[0].get("rc"))
            rss = "%.0f" % max(r["maxrss_mib"] for r in ok) if ok else "-"
            cpu = "%.2f" % statistics.median(r["cpu_s"] for r in ok) if ok else "-"
            v = ok[0] if ok else {}
            print(
                "| %s | %d | %s | %s | %s | %s | %s |"
                % (name, a.ranks, wall, cpu, rss, v.get("kind"), v.get("culprits"))
            )
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"ranks": a.ranks, "steps": a.steps, "results": res}, f, indent=2)
    finally:
        if not a.dir:
            shutil.rmtree(run_dir, ignore_errors=True)
        if not a.template:
            shutil.rmtree(template, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
