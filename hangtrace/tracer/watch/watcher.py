"""Node watcher: polls ring headers, detects a stall or a dead rank, snapshots, diagnoses.

Progress is judged from the ring headers alone (4 KiB each per poll): a process made
progress when its progress counter moved (a collective completed, a phase or step
changed, ``tracer.heartbeat()``). A stall is *no progress anywhere in the run* for the
threshold: ``HANGTRACE_STALL_S``, or the largest per-phase threshold
(``HANGTRACE_PHASE_STALL_S``) among the phases the live processes are in. A slow job
whose counters move is progressing and is never reported.

A dead rank — a process that vanished without a clean-exit record, or exited with a
non-zero code — is reported at the next poll.

Run standalone as ``python -m hangtrace.tracer.watch.watcher RUN_DIR`` (what a traced
process starts when no watcher runs on its node), or embedded by ``hangtrace run``.
"""
import dataclasses
import glob
import os
import sys
import time

from hangtrace.tracer import config
from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.ring import reader as R
from hangtrace.tracer.collect.rings import RING_GLOB, live_state


#: seconds between two memory-trend checks of the live rings (each reads every ring once)
MEM_CHECK_S = 5.0


class Incident:
    """What the watcher saw: ``kind`` 'stall' or 'death'; ``detail`` a human line."""

    def __init__(self, kind, detail, keys=()):
        self.kind, self.detail, self.keys = kind, detail, list(keys)


def _starting(h):
    """A ranked process with no progress since its ring was created (the recorder counts
    1 at creation): still importing or in rendezvous, not hung (HANGTRACE_STARTUP_STALL_S)."""
    return h.get("rank", -1) >= 0 and h["progress_count"] <= 1 and not h["phase_strid"]


class Watcher:
    """Stall/death detector over the ring headers of ``run_dir``.

    ``stall_s``: seconds without progress anywhere before a stall; ``phase_stall``:
    {phase name: seconds}; ``clock``: monotonic seconds (injectable for tests).
    """

    def __init__(self, run_dir, stall_s=None, phase_stall=None, clock=time.monotonic):
        self.run_dir = run_dir
        self.stall_s = config.get_float(config.STALL_S) if stall_s is None else float(stall_s)
        self.phase_stall = config.phase_stall_s() if phase_stall is None else dict(phase_stall)
        self.startup_stall_s = config.get_float(config.STARTUP_STALL_S)
        self.clock = clock
        self.seen = {}  # path -> (progress_count, phase, step, state)
        self.dead = set()
        self.last_progress = clock()
        self.reported_stall = False
        self.headers = {}
        # memory early warnings (issue 5): checked every MEM_CHECK_S, once per process and metric
        self.mem_warned = set()
        self.mem_next = clock() + MEM_CHECK_S
        self.mem_log = None  # callable(line); default: append to RUN_DIR/watcher-<host>.log
        self.log = None  # callable(line) for other notes; default: the same log file

    def _read_headers(self):
        out = {}
        for path in glob.glob(os.path.join(self.run_dir, RING_GLOB)):
            try:
                with open(path, "rb") as f:
                    head = f.read(F.HEADER_SIZE)
                h = R.read_header(head, path)
                if h["phase_strid"]:
                    with open(path, "rb") as f:
                        f.seek(h["strtab_off"] + h["phase_strid"])
                        tag, n = F.STR_ENTRY.unpack(f.read(F.STR_ENTRY.size))
                        h["phase"] = f.read(min(n, 4096)).decode("utf-8", "replace")
                else:
                    h["phase"] = None
                out[path] = h
            except Exception:
                continue  # a file being created or a foreign file: the collector reports it
        return out

    def threshold(self):
        """Stall threshold in seconds for the phases live processes are in now."""
        t = self.stall_s
        for h in self.headers.values():
            if h["state"] == F.ST_EXITED:
                continue
            ph = h.get("phase")
            if ph in self.phase_stall:
                t = max(t, self.phase_stall[ph])
            if _starting(h):
                t = max(t, self.startup_stall_s)
        return t

    def poll(self):
        """One poll. Returns an Incident or None."""
        now = self.clock()
        self.headers = self._read_headers()
        progressed = False
        alive_progressed = False
        deaths = []
        alive_any = False
        for path, h in self.headers.items():
            sig = (h["progress_count"], h["phase_strid"], h["step"], h["state"])
            changed = self.seen.get(path) != sig
            if changed:
                progressed = True
                self.seen[path] = sig
            if path in self.dead:
                continue
            st = live_state(h)
            if st == "alive":
                alive_any = True
                if changed:
                    alive_progressed = True
            elif st == "killed" or (st == "exited" and h["exit_code"] != 0):
                self.dead.add(path)
                deaths.append((path, h, st))
        if progressed:
            self.last_progress = now
        if alive_progressed:
            # only a process that is still alive and moved is progress after a stall: the
            # state change of a process dying (stopped by the user or the launcher) is not
            self.reported_stall = False
        if now >= self.mem_next:
            self.mem_next = now + MEM_CHECK_S
            self.memory_warnings()
        if deaths:
            lines = []
            for path, h, st in deaths:
                what = "vanished without a clean-exit record" if st == "killed" else "exited with code %d" % h["exit_code"]
                lines.append("rank %d (pid %d on %s) %s" % (h["rank"], h["pid"], h["host"], what))
            if self.reported_stall:
                # a stall was reported and nothing progressed since: these deaths are the
                # hung job being stopped (user's signal, launcher, --stop-on-stall), not a
                # new incident; the stall verdict and its snapshot stay the newest
                for line in lines:
                    self._log("%s: stopped after the stall" % line)
                return None
            return Incident("death", "; ".join(lines), [p for p, _, _ in deaths])
        if alive_any and not self.reported_stall and now - self.last_progress >= self.threshold():
            self.reported_stall = True
            return Incident("stall", "no progress in any traced process for %.1f s (threshold %.1f s)"
                            % (now - self.last_progress, self.threshold()))
        return None

    def memory_warnings(self):
        """Early warning before an OOM kill (issue 5): for every live process whose memory
        grows steadily step after step (tracer.memory.watch_lines), one line per process
        and metric in the watcher log. Returns the new lines; never raises."""
        new = []
        try:
            from hangtrace.tracer.analyze.memory import watch_lines
            for path, h in self.headers.items():
                if h["state"] == F.ST_EXITED or live_state(h) != "alive":
                    continue
                try:
                    ring = R.read_ring(path, records=False)
                except Exception:
                    continue
                label = "rank %d (pid %d on %s)" % (h["rank"], h["pid"], h["host"]) if h["rank"] >= 0 else \
                    "pid %d on %s" % (h["pid"], h["host"])
                for key, line in watch_lines(list(ring.summary.memory), label):
                    if (path, key) in self.mem_warned:
                        continue
                    self.mem_warned.add((path, key))
                    new.append(line)
            for line in new:
                self._mem_log(line)
        except Exception:
            pass
        return new

    def _log(self, line):
        """Watcher log line: ``self.log`` (callable) if set, else the watcher log file."""
        if self.log is not None:
            self.log(line)
            return
        self._write_log(line)

    def _mem_log(self, line):
        if self.mem_log is not None:
            self.mem_log(line)
            return
        self._write_log(line)

    def _write_log(self, line):
        import socket
        try:
            with open(os.path.join(self.run_dir, "watcher-%s.log" % socket.gethostname()), "a") as f:
                f.write("%s %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), line))
        except OSError:
            pass

    def any_alive(self):
        return any(live_state(h) == "alive" for h in self.headers.values())


def is_ray_run(run_dir):
    """True when a ring of ``run_dir`` belongs to a Ray worker (Ray node id in its metadata)."""
    for path in glob.glob(os.path.join(run_dir, RING_GLOB)):
        try:
            if R.read_ring(path, records=False).meta.get("ray_node_id"):
                return True
        except Exception:
            continue
    return False


#: Cluster-wide collection of a Ray run (``ray_collect``): seconds allowed to the node
#: tasks, and to the whole collector process (connect, tasks, Ray state) before it is killed.
RAY_TASK_TIMEOUT_S = 60.0
RAY_COLLECT_TIMEOUT_S = 100.0

_RAY_COLLECT_CODE = (
    "import sys\n"
    "from hangtrace.tracer.collect.raycluster import dump_cluster\n"
    "run_dir, address, reason, native, timeout_s = sys.argv[1:6]\n"
    "snap = dump_cluster(run_dir, address=address or None, native=native == '1', timeout_s=float(timeout_s),\n"
    "                    reason=reason)\n"
    "print('SNAPSHOT ' + snap.path, flush=True)\n")


def _gcs_unreachable(address, timeout_s=3.0):
    """Why the Ray GCS at ``address`` (HOST:PORT) cannot be reached by TCP, or None.

    ``ray.init`` to an address nobody listens on retries for minutes (measured here: more
    than 200 s), so the watcher checks first.
    """
    import socket
    if address.startswith("ray://"):
        address = address[len("ray://"):]  # Ray client: its server port is checked the same way
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "/" in host:
        return None  # 'auto', 'ray://…' or a form we do not parse: let Ray decide
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
        return None
    except OSError as e:
        return "%s: %s" % (address, e)


def ray_collect(run_dir, reason, native=False, log=None, address=None, timeout_s=RAY_COLLECT_TIMEOUT_S):
    """The same cluster-wide collection as ``hangtrace dump --ray``, from a watcher.

    Runs ``raycollect.dump_cluster`` in a child process (tracing stripped, its own session)
    so the watcher never becomes a Ray driver itself: the child is killed after
    ``timeout_s`` seconds. ``address``: the Ray GCS address (default ``RAY_ADDRESS``, which
    ``hooks.autowatch`` sets to the cluster of the Ray worker that started the watcher;
    else ``auto``). Returns the Snapshot (``raycollect.load_ray_snapshot``), or None after
    writing one line to ``log`` (callable; default stderr) saying why.
    """
    import signal
    import subprocess
    log = log or (lambda line: sys.stderr.write("hangtrace: %s\n" % line))
    address = address or os.environ.get("RAY_ADDRESS") or ""
    why = _gcs_unreachable(address) if address else None
    if why:
        log("cluster-wide collection skipped: Ray unreachable (%s); this node only" % why)
        return None
    p = subprocess.Popen([sys.executable, "-c", _RAY_COLLECT_CODE, run_dir, address, reason, "1" if native else "0",
                          str(min(RAY_TASK_TIMEOUT_S, max(5.0, timeout_s - 20.0)))],
                         env=config.helper_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.communicate()
        log("cluster-wide collection (Ray at %s) did not finish in %.0f s; this node only" % (address or "auto", timeout_s))
        return None
    path = None
    for line in out.decode("utf-8", "replace").splitlines():
        if line.startswith("SNAPSHOT "):
            path = line[len("SNAPSHOT "):].strip()
    if p.returncode != 0 or not path:
        lines = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
        log("cluster-wide collection (Ray at %s) failed (exit %s: %s); this node only"
            % (address or "auto", p.returncode, lines[-1][-500:] if lines else "no output"))
        return None
    from hangtrace.tracer.collect.raycluster import load_ray_snapshot
    snap = dataclasses.replace(load_ray_snapshot(path), reason=reason, path=path)
    log("cluster-wide collection (Ray at %s): %d node(s), %d process(es)"
        % (address or "auto", len(getattr(snap, "ray_nodes", None) or ()), len(snap.processes)))
    return snap


def diagnose_and_report(run_dir, reason, native=False, with_stacks=True, log=None):
    """Snapshot the run, analyse it, store diagnosis.json/report.txt. Returns (snap, diag, paragraph).

    For a Ray run (``is_ray_run``) the snapshot comes from every alive node (``ray_collect``,
    unless ``HANGTRACE_RAY_COLLECT=0``); when Ray cannot be reached it is this node's
    only, and ``log`` (callable(line); default stderr) says why.
    """
    from hangtrace.tracer.analyze.diagnose import diagnose
    from hangtrace.tracer.collect.rings import take_snapshot, write_diagnosis
    from hangtrace.tracer.report.text import text_report, verdict_paragraph
    snap = None
    if with_stacks and is_ray_run(run_dir) and os.environ.get(config.RAY_COLLECT, "1") != "0":
        # a Ray job: the same cluster-wide collection as `hangtrace dump --ray`, so the
        # ranks on other nodes are seen too; on failure, this node's snapshot
        try:
            snap = ray_collect(run_dir, reason, native=native, log=log)
        except Exception as e:
            snap = None
            (log or (lambda line: sys.stderr.write("hangtrace: %s\n" % line)))(
                "cluster-wide collection failed (%r); this node only" % (e,))
    if snap is None:
        snap = take_snapshot(run_dir, reason=reason, native=native, with_stacks=with_stacks)
    diag = diagnose(snap)
    para = verdict_paragraph(diag)
    write_diagnosis(snap, diag, text_report(diag, snap))
    return snap, diag, para


def main(argv=None):
    """Standalone node watcher: ``python -m hangtrace.tracer.watch.watcher RUN_DIR``.

    Logs to RUN_DIR/watcher-<host>.log; exits when no traced process of the run is
    alive on this node any more (after a grace period of 2 polls).
    """
    import socket
    argv = sys.argv[1:] if argv is None else argv
    run_dir = argv[0]
    poll = config.get_float(config.POLL_S)
    log_path = os.path.join(run_dir, "watcher-%s.log" % socket.gethostname())
    w = Watcher(run_dir)
    idle = 0
    w.mem_log = lambda line: log(line)  # issue 5: memory early warnings
    w.log = lambda line: log(line)

    def log(msg):
        with open(log_path, "a") as f:
            f.write("%s %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), msg))

    log("watcher started, pid %d, stall threshold %.1f s" % (os.getpid(), w.stall_s))
    while True:
        inc = w.poll()
        if inc is not None:
            log("%s: %s" % (inc.kind, inc.detail))
            try:
                snap, diag, para = diagnose_and_report(run_dir, inc.kind, log=log)
                log("verdict: %s" % para)
                log("snapshot: %s" % snap.path)
            except Exception as e:
                log("diagnosis failed: %r" % (e,))
        if w.any_alive() or not w.headers:
            idle = 0
        else:
            idle += 1
            if idle >= 2:
                log("no traced process alive on this node; watcher exits")
                return 0
        time.sleep(poll)


if __name__ == "__main__":
    sys.exit(main())
