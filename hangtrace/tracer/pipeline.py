"""The pipeline: the ONLY place that composes collect -> store -> analyze -> report.

Every entry point goes through here: ``hangtrace analyze`` (:func:`diagnose_path`),
``hangtrace dump`` and the watcher (:func:`dump_live`), ``hangtrace dump --ray``
(:func:`dump_ray`), ``attach``, ``records``, ``env-diff`` (:func:`env_diff`). Each returns a
typed :class:`Result` (or a Snapshot); nothing prints. Stage modules are imported lazily.

Stages (``tracer/``): ``collect`` (impure: run directory, processes, stacks, Ray) ->
``snapshot.Snapshot`` -> ``analyze`` (pure) -> ``diagnosis.Diagnosis`` -> ``report``
(pure rendering); ``collect.rings.write_diagnosis`` stores diagnosis.json/report.txt
in the snapshot folder.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Set, Tuple

from hangtrace.tracer import config
from hangtrace.tracer.diagnosis import Diagnosis
from hangtrace.tracer.envfacts import ProcessEnv
from hangtrace.tracer.errors import HangtraceError, RunDirError, UnreadableRunError
from hangtrace.tracer.snapshot import Snapshot

Log = Callable[[str], None]


@dataclass(frozen=True)
class Result:
    """One diagnosed snapshot: ``paragraph`` is the verdict paragraph (report.text)."""

    snapshot: Snapshot
    diagnosis: Diagnosis
    paragraph: str


def _stderr_log(line: str) -> None:
    sys.stderr.write("hangtrace: %s\n" % line)


def check_dir(path: str) -> None:
    """A path given as RUN_DIR must be a directory. Raises RunDirError (exit 4)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise RunDirError(
            "%s is not a directory" % path,
            "pass the run directory printed by `hangtrace run` (HANGTRACE_DIR of the "
            "job) or one of its snapshots RUN_DIR/snapshots/<time>",
        )


def require_dir(path: str) -> None:
    """A run directory that must exist already (``dump``, ``env-diff``): nothing is
    created for a mistyped path. Raises RunDirError (exit 4)."""
    check_dir(path)
    if not os.path.isdir(path):
        raise RunDirError(
            "run directory %s does not exist" % path,
            "pass the directory printed by `hangtrace run`, or HANGTRACE_DIR of the job",
        )


def readable(snap: Snapshot, log: Log = _stderr_log) -> Snapshot:
    """``snap`` unless ring files were found but none could be read: then each error line
    goes to ``log`` and UnreadableRunError (exit 3) is raised (an empty directory stays
    exit 4, raised by ``load_run``)."""
    if not snap.processes and snap.errors:
        for e in snap.errors:
            log("error: %s" % e)
        where = snap.path or snap.run_dir
        raise UnreadableRunError(
            "no readable ring file in %s (%d error(s) above)" % (where, len(snap.errors)),
            "copy the ring files again from the run directory, or read them with "
            "the hangtrace version that wrote them",
        )
    return snap


def load_stored(path: str) -> Snapshot:
    """A stored snapshot folder; one taken by ``dump --ray`` gets Ray's records joined."""
    from hangtrace.tracer.collect.nodes.jobsnap import has_parts, with_parts
    from hangtrace.tracer.collect.rings import load_snapshot

    if os.path.exists(os.path.join(path, "ray_state.json")):
        from hangtrace.tracer.collect.ray.raycluster import load_ray_snapshot

        return load_ray_snapshot(path)
    snap = load_snapshot(path)
    return with_parts(snap, path) if has_parts(path) else snap  # issue 39: other nodes' parts


def load_path(path: str) -> Snapshot:
    """A snapshot folder, else the newest snapshot of a run directory, else its rings as
    they are now joined with the torch Flight Recorder dumps found in it (or those dumps
    alone: a directory of ``comm_lib_trace_rank_<r>`` files, issue 10). Raises RunDirError
    when ``path`` is none of these."""
    from hangtrace.tracer.collect.rings import is_snapshot, load_run_or_fr, newest_snapshot

    check_dir(path)
    if is_snapshot(path):
        return load_stored(path)
    newest = newest_snapshot(path) if os.path.isdir(path) else None
    return load_stored(newest) if newest else load_run_or_fr(path)


def recorded_stall_s(envs: List[ProcessEnv]) -> Optional[float]:
    """The stall threshold (s) the run's processes were started with (``HANGTRACE_STALL_S`` in
    their environment records, set by ``hangtrace run --stall-s``) when all agree; else None."""
    seen: Set[str] = set()
    for pe in envs:
        seen.update(v for k, v in pe.environ if k == config.STALL_S)
    if len(seen) != 1:
        return None
    try:
        v = float(seen.pop())
    except ValueError:
        return None
    return v if v > 0 else None


def diagnose_snapshot(snap: Snapshot, store: bool = False, stall_s: Optional[float] = None) -> Result:
    """Analyse ``snap``; with ``store`` (and ``snap.path``) write diagnosis.json and
    report.txt into its folder. ``stall_s``: the stall threshold (s) for a snapshot not
    taken at a detected stall (default: the one the run was started with,
    :func:`recorded_stall_s`, else ``diagnose``'s, 300 s)."""
    from hangtrace.tracer.analyze.diagnose import diagnose
    from hangtrace.tracer.report.text import text_report, verdict_paragraph

    envs = _run_envs(snap)
    if stall_s is None:
        stall_s = recorded_stall_s(envs)
    diag = diagnose(snap, stall_s=stall_s, envs=envs)
    env_section = _environment(snap, diag, envs)
    if store:
        from hangtrace.tracer.collect.rings import write_diagnosis
        from hangtrace.tracer.report.text import diagnosis_json

        text = text_report(diag, snap)
        write_diagnosis(snap, diagnosis_json(diag), text + ("\n" + env_section + "\n" if env_section else ""))
        write_timeline(snap, diag)
    return Result(snap, diag, verdict_paragraph(diag))


def _run_envs(snap: Snapshot) -> List[ProcessEnv]:
    """The run's environment records (``collect.forensics.run_env``; a stored snapshot reads
    its run directory's), [] when it has none. Never raises."""
    try:
        from hangtrace.tracer.collect.forensics import run_env

        root = snap.path or snap.run_dir
        if not root or not (
            os.path.isdir(os.path.join(snap.run_dir or "", "env")) or os.path.isdir(os.path.join(root, "env"))
        ):
            return []
        procs = [p for p in snap.processes if p.ring_path] or None  # (read already: not again)
        return list(run_env(root, enrich_local=False, processes=procs)[0])
    except Exception:
        return []


def _environment(snap: Snapshot, diag: Diagnosis, envs: List[ProcessEnv]) -> str:
    """Issue 12: the culprits' library/environment differences and a crashing native frame
    appended to ``diag.evidence``; returns the text report's section ("" when nothing
    differs or the run has no environment records). Never raises."""
    try:
        from hangtrace.tracer.analyze.envdiff import diff_env
        from hangtrace.tracer.report.envdiff import environment_section

        if not envs:
            return ""
        diff = diff_env(envs)  # (once: at 512 ranks a second diff was 3 % of the analysis)
        diag.evidence += verdict_evidence(snap.path or snap.run_dir, snap.processes, diag.culprit_ranks, diff)
        return environment_section(diff)
    except Exception:
        return ""


def crash_frame(
    run_dir: str,
    host: str,
    pid: int,
    read_log: Optional[Callable[[], Tuple[List[Tuple[float, str]], str]]] = None,
) -> Optional[str]:
    """Library and symbol of the native frame where process ``host:pid`` of ``run_dir``
    took its fatal signal (``analyze.envdiff.fatal_frame_library`` over what
    ``collect.forensics.kernel_fault`` reads: the kernel's log line and the recorded
    mappings); None when that is not known (another host, no kernel line, no log)."""
    from hangtrace.tracer.analyze.envdiff import fatal_frame_library
    from hangtrace.tracer.collect.forensics import kernel_fault, symbolize

    got = kernel_fault(run_dir, host, pid, read_log)
    return None if got is None else fatal_frame_library(got[0], got[1], symbolize, pid=pid)


def verdict_evidence(
    run_dir: str,
    processes: Sequence[Any],
    culprit_ranks: Sequence[int],
    envs: Optional[Any] = None,
) -> List[str]:
    """The evidence lines issue 12 adds to a verdict: the culprits' environment differences
    (``analyze.envdiff.envdiff_evidence``) and, for a culprit that died with a fatal-signal
    dump, the crashing native frame ("rank 1 died in libX.so, sym+0x9 (segfault; path
    +0xOFF)"). ``processes``: the snapshot's ProcessInfo list (host, pid, rank, state,
    signals); ``envs``: the records (ProcessEnv list) or their EnvDiff, if read. Never raises."""
    from hangtrace.tracer.analyze.envdiff import envdiff_evidence
    from hangtrace.tracer.collect.forensics import run_env

    out: List[str] = []
    try:
        if envs is None:
            envs, _ = run_env(run_dir, enrich_local=False)
        out += envdiff_evidence(envs, culprit_ranks)
        for p in processes:
            if p.rank in culprit_ranks and p.state != "alive" and "fatal" in (p.signals or {}):
                frame = crash_frame(run_dir, p.host, p.pid)
                if frame:
                    out.append("rank %d died in %s" % (p.rank, frame))
    except Exception:
        pass
    return out


def write_timeline(snap: Snapshot, diag: Any, log: Log = _stderr_log) -> Optional[str]:
    """``timeline.json`` (Perfetto trace, issue 11) next to report.txt in the snapshot
    folder, unless ``HANGTRACE_TIMELINE=0``. Returns its path or None. Never raises: a
    failure is one line in ``log``."""
    if not config.timeline_enabled() or not snap.path:
        return None
    try:
        from hangtrace.tracer.report.text import diagnosis_json
        from hangtrace.tracer.report.timeline.load import write_incident_timeline

        return write_incident_timeline(snap, diagnosis_json(diag))
    except Exception as e:
        log("timeline not written: %r" % (e,))
        return None


def diagnose_path(path: str, log: Log = _stderr_log, stall_s: Optional[float] = None) -> Result:
    """``hangtrace analyze``: offline analysis of a run directory or snapshot (nothing
    written); ``stall_s`` as in :func:`diagnose_snapshot`. Raises RunDirError (exit 4),
    UnreadableRunError (exit 3)."""
    from hangtrace.tracer.collect.nodes.jobsnap import as_job  # issue 39: one node of several
    from hangtrace.tracer.collect.nodes.jobverdictfile import stored_job_verdict

    snap, jv = stored_job_verdict(readable(load_path(path), log))  # node 0's, on a node that saw less
    if jv is not None:
        return Result(snap, jv.diagnosis, jv.paragraph)
    return diagnose_snapshot(as_job(snap), stall_s=stall_s)


def diagnose_paths(paths: Sequence[str], log: Log = _stderr_log, stall_s: Optional[float] = None) -> Result:
    """``hangtrace analyze DIR1 DIR2 ...``: node-local run directories (or snapshots) copied
    from several nodes of one job, combined (``collect/nodes/jobsnap.combine``) and
    analysed as one job. Raises what :func:`diagnose_path` raises, naming the path."""
    from hangtrace.tracer.collect.nodes.jobsnap import combine

    snaps = [readable(load_path(p), log) for p in paths]
    return diagnose_snapshot(combine(snaps), stall_s=stall_s)


def records(run_dir: str, log: Log = _stderr_log) -> Snapshot:
    """``hangtrace records``: the run's processes with EVERY record decoded (not the
    summary). Raises RunDirError, UnreadableRunError."""
    from hangtrace.tracer.collect.rings import load_run

    check_dir(run_dir)
    return readable(load_run(run_dir, records=True), log)


def dump_live(
    run_dir: str,
    reason: str,
    native: bool = False,
    with_stacks: bool = True,
    log: Optional[Log] = None,
    stall_s: Optional[float] = None,
    window_s: Optional[float] = None,
) -> Result:
    """Snapshot a live run (stacks of alive processes), analyse it, store diagnosis.json and
    report.txt (``hangtrace dump``, the watcher, ``hangtrace run``).

    For a Ray run (``collect.ray.rayjob.is_ray_run``) the snapshot comes from every alive node
    (``ray_collect``, unless ``HANGTRACE_RAY_COLLECT=0``); when Ray cannot be reached it is
    this node's only, and ``log`` (default stderr) says why. ``stall_s``: as in
    ``diagnose_snapshot``. ``window_s`` (``hangtrace dump``; not for a snapshot taken at a
    detected stall or death): the snapshot is taken between two readings of the ring headers
    and torch's counters at least that many seconds apart (``watch/progress.window``), and
    judged hung only when nothing advanced between them (``analyze/context.judged_window``).
    Raises RunDirError.
    """
    log = log or _stderr_log

    def take() -> Snapshot:
        return _live_snapshot(run_dir, reason, native, with_stacks, log)

    if window_s is None or reason in ("stall", "death"):
        snap = take()
    else:
        from hangtrace.tracer.collect.rings import write_window
        from hangtrace.tracer.watch.progress import window

        w, got = window(run_dir, window_s, during=take)
        assert got is not None
        snap = dataclasses.replace(got, window=w)
        write_window(snap)
    return diagnose_snapshot(snap, store=True, stall_s=stall_s)


def _live_snapshot(run_dir: str, reason: str, native: bool, with_stacks: bool, log: Log) -> Snapshot:
    """The snapshot of :func:`dump_live`: every alive Ray node's, else this node's."""
    from hangtrace.tracer.collect.ray.rayjob import is_ray_run, ray_collect
    from hangtrace.tracer.collect.rings import take_snapshot

    if with_stacks and is_ray_run(run_dir) and os.environ.get(config.RAY_COLLECT, "1") != "0":
        try:
            snap = ray_collect(run_dir, reason, native=native, log=log)
            if snap is not None:
                return snap
        except Exception as e:  # any failure of the cluster-wide path: this node's snapshot
            log("cluster-wide collection failed (%r); this node only" % (e,))
    return take_snapshot(run_dir, reason=reason, native=native, with_stacks=with_stacks)


def dump_ray(
    run_dir: Optional[str], address: Optional[str], native: bool = False, stall_s: Optional[float] = None
) -> Result:
    """``hangtrace dump --ray``: collector tasks pinned to every alive Ray node, one local
    snapshot, diagnosed and stored. ``address``: default RAY_ADDRESS, else the run's own
    cluster (the ``--gcs-address`` its Ray workers were started with: ``auto`` picks any
    cluster of this host, and there may be several), else ``auto``. ``stall_s``: as in
    ``dump_live``. Raises HangtraceError when the GCS at the address does not answer within 3 s."""
    from hangtrace.tracer.collect.ray.raycluster import dump_cluster
    from hangtrace.tracer.collect.ray.raygcs import gcs_unreachable
    from hangtrace.tracer.collect.ray.rayjob import ray_address_of_run

    run_dir = run_dir or os.environ.get(config.DIR)
    addr = address or os.environ.get("RAY_ADDRESS")
    source = "given"
    if not addr and run_dir and os.path.isdir(run_dir):
        addr, source = ray_address_of_run(run_dir), "the run's Ray workers (--gcs-address)"
    why = gcs_unreachable(addr, timeout_s=3.0) if addr and addr != "auto" else None
    if why:
        raise HangtraceError(
            "cannot reach the Ray cluster at %s (address %s)" % (why, source),
            "pass --address HOST:PORT of the running cluster's GCS (`ray status` on its head, "
            "or ray.get_runtime_context().gcs_address in the driver) or set RAY_ADDRESS; "
            "check that the cluster is up (a job's own ray.init cluster ends with the job)",
        )
    snap = dump_cluster(run_dir, address=addr or None, native=native)
    return diagnose_snapshot(snap, store=True, stall_s=stall_s)


def attach(
    pids: Optional[List[int]] = None,
    native: bool = False,
    out_dir: Optional[str] = None,
    log: Log = _stderr_log,
    window_s: Optional[float] = None,
) -> Result:
    """``hangtrace attach``: stacks of a job not started with hangtrace (two samples
    ``window_s`` seconds apart, default ``collect.attach.WINDOW_S``), the stack-only
    verdict, stored with the snapshot. Without ``pids``: the job this user started most
    recently, named on ``log`` with the reason. Raises NoProcessesError."""
    from hangtrace.tracer.analyze.diagnose import diagnose
    from hangtrace.tracer.collect.attach import collect
    from hangtrace.tracer.collect.rings import write_diagnosis
    from hangtrace.tracer.collect.attach import WINDOW_S
    from hangtrace.tracer.report.text import diagnosis_json, text_report, verdict_paragraph

    snap = collect(
        pids, native=native, out_dir=out_dir, log=log, window_s=WINDOW_S if window_s is None else window_s
    )
    diag = diagnose(snap)  # reason 'attach': the stack_only rule
    write_diagnosis(snap, diagnosis_json(diag), text_report(diag, snap))
    # the stack_only rule writes its own summary (stacks-only wording, as report.txt shows
    # it); the paragraph renderer knows flight records and would say "not enough data"
    return Result(snap, diag, diag.summary or verdict_paragraph(diag))


def env_diff(run_dir: str) -> Tuple[Any, List[str]]:
    """``hangtrace env-diff``: a run's env records (collect.forensics), their differences (analyze.envdiff)
    out with the error lines; RunDirError when the directory is missing or holds no readable record."""
    from hangtrace.tracer.analyze.envdiff import diff_env
    from hangtrace.tracer.collect.forensics import run_env

    require_dir(run_dir)
    envs, errors = run_env(run_dir)
    if not envs:
        raise RunDirError(
            "no %senvironment records (env/*.json) in %s%s"
            % ("readable " if errors else "", run_dir, "".join("\n  " + e for e in errors)),
            "records are written by traced processes of this hangtrace version "
            "(HANGTRACE=1); pass their run directory",
        )
    return diff_env(envs), list(errors)
