"""Environment forensics on real jobs (issue 12): two builds of a library and different
NCCL_* values across two gloo ranks, one then hanging; a rank dying of SIGSEGV inside a
small C library; secret-looking variables masked in everything we write."""

import glob
import json
import os
import secrets
import shutil
import subprocess
import sys

import pytest

from jobs import base_env, free_port, kill_all, wait_line
from hangtrace.tracer.analyze.envdiff import envdiff_evidence, fatal_frame_library
from hangtrace.tracer.collect import forensics as F

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "env_job.py")
PLUGIN_C = """
int plugin_build(void) { return BUILD; }
int crash_here(int *p) { return p[3] + 1; }
int (*volatile crash_fp)(int *) = crash_here;
int call_crash(void) { return crash_fp((int *)0); }
"""


def build_lib(directory, name: str, build: int) -> str:
    """``cc -shared -Wl,--build-id`` a small library into ``directory``; returns its path."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc) on this machine")
    os.makedirs(directory, exist_ok=True)
    src = os.path.join(directory, "plugin.c")
    with open(src, "w") as f:
        f.write(PLUGIN_C)
    out = os.path.join(directory, name)
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O0", "-DBUILD=%d" % build, "-Wl,--build-id", "-o", out, src], check=True
    )
    return out


def start(run_dir, mode: str, libs, envs, port: int) -> list:
    procs = []
    for rank, (lib, extra) in enumerate(zip(libs, envs)):
        env = base_env(
            run_dir,
            True,
            RANK=rank,
            LOCAL_RANK=rank,
            WORLD_SIZE=2,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            **extra,
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, SCRIPT, mode, lib],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def hangtrace(*args: str) -> subprocess.CompletedProcess:
    env = base_env(traced=False)
    return subprocess.run(
        [sys.executable, "-m", "hangtrace"] + list(args), env=env, capture_output=True, text=True, timeout=300
    )


def grep_tree(root, needles) -> list:
    hits = []
    for d, _, files in os.walk(str(root)):
        for n in files:
            with open(os.path.join(d, n), "rb") as f:
                data = f.read()
            hits += ["%s in %s" % (s, os.path.join(d, n)) for s in needles if s.encode() in data]
    return hits


def test_two_builds_and_nccl_values_named_and_secrets_masked(tmp_path) -> None:
    run_dir = tmp_path / "run"
    # a NCCL net plugin's name: matched as "a library whose name mentions nccl"
    libs = [
        build_lib(str(tmp_path / "a"), "libnccl-net-test.so", 1),
        build_lib(str(tmp_path / "b"), "libnccl-net-test.so", 2),
    ]
    ids = [F.read_build_id(p) for p in libs]
    assert ids[0] and ids[1] and ids[0] != ids[1]
    secret_vals = {
        name: "v" + secrets.token_hex(8)
        for name in ("NCCL_TEST_TOKEN", "RAY_API_KEY", "TORCH_SECRET_X", "MASTER_PASSWORD", "CUDA_CREDENTIAL")
    }
    envs = [dict(secret_vals, NCCL_P2P_DISABLE="0"), dict(secret_vals, NCCL_P2P_DISABLE="1")]
    procs = start(run_dir, "hang", libs, envs, free_port())
    try:
        for p in procs:
            wait_line(p, "READY", timeout=240)
        text = hangtrace("env-diff", str(run_dir))
        assert text.returncode == 0, text.stderr
        assert ids[0][:12] in text.stdout and ids[1][:12] in text.stdout, text.stdout
        assert "NCCL_P2P_DISABLE" in text.stdout and "libnccl-net-test.so" in text.stdout
        js = hangtrace("env-diff", str(run_dir), "--json")
        assert js.returncode == 0, js.stderr
        diffs = {d["name"]: d for d in json.loads(js.stdout)["differences"]}
        assert sorted(g["value"] for g in diffs["libnccl-net-test.so"]["groups"]) == sorted(
            "%s (build-id %s)" % (p, i) for p, i in zip(libs, ids)
        )
        assert {tuple(g["ranks"]): g["value"] for g in diffs["NCCL_P2P_DISABLE"]["groups"]} == {
            (0,): "0",
            (1,): "1",
        }
        # the verdict of the hang, then the evidence line the lead wires into it
        dump = hangtrace("dump", str(run_dir), "--json")
        assert dump.returncode == 0, dump.stderr
        verdict = json.loads(dump.stdout)
        assert verdict["culprit_ranks"] == [1], verdict["summary"]
        facts, _ = F.run_env(str(run_dir))
        lines = envdiff_evidence(facts, verdict["culprit_ranks"])
        assert len(lines) == 2 and lines[0].startswith("rank 1 loaded libnccl-net-test.so from ")
        assert ids[1][:12] in lines[0] and ids[0][:12] in lines[0]
        assert lines[1] == "rank 1 runs differently from its peers: NCCL_P2P_DISABLE=1 (peers: 0)"
        # ... and the verdict itself carries them (pipeline), and the text report its section
        assert set(lines) <= set(verdict["evidence"]), verdict["evidence"]
        snaps = sorted(glob.glob(os.path.join(str(run_dir), "snapshots", "*", "report.txt")))
        with open(snaps[-1]) as f:
            assert "Environment differences" in f.read()
        # masked everywhere we write: records, rings, stack files, snapshot, logs; and our output
        for name in secret_vals:
            assert name in text.stdout or name not in js.stdout  # names may show, values never
        hits = grep_tree(run_dir, secret_vals.values())
        assert hits == []
        for out in (text.stdout, js.stdout, dump.stdout):
            assert not [v for v in secret_vals.values() if v in out]
        assert any(f.startswith("env") for f in os.listdir(str(run_dir)))
    finally:
        kill_all(procs)


def test_segfault_in_c_library_named_with_symbol(tmp_path) -> None:
    try:
        with open("/proc/sys/debug/exception-trace") as f:
            if f.read().strip() == "0":
                pytest.skip("the kernel prints no segfault lines (/proc/sys/debug/exception-trace is 0)")
    except OSError:
        pass
    run_dir = tmp_path / "run"
    lib = build_lib(str(tmp_path / "c"), "libcrashy.so", 3)
    fl = {"HANGTRACE_FAULT_LINE": "1"}  # opt-in: keep the kernel fault line (config.FAULT_LINE)
    procs = start(run_dir, "crash", [lib, lib], [fl, fl], free_port())
    try:
        for p in procs:
            wait_line(p, "READY", timeout=240)
        assert procs[1].wait(timeout=120) == -11
        pid = procs[1].pid
        facts, _ = F.run_env(str(run_dir))
        mine = [pe for pe in facts if pe.pid == pid]
        assert mine and mine[0].rank == 1
        # recorded while it lived, when ctypes loaded the library
        assert any(m.path == os.path.realpath(lib) for m in mine[0].mappings)
        text, status = F.kernel_fault_text(pid)
        if status != "read":
            pytest.skip("kernel log unreadable: %s" % status)
        if not text:
            pytest.skip("no kernel segfault line for pid %d (printk rate limit)" % pid)
        got = fatal_frame_library(text, mine[0].mappings, F.symbolize, pid=pid)
        assert got is not None and got.startswith("libcrashy.so, crash_here+0x"), (got, text)
        assert os.path.realpath(lib) in got
        # the same through the verdict's call site (the snapshot's process list)
        from hangtrace.tracer.collect.rings import load_run

        snap = load_run(str(run_dir))
        from hangtrace.tracer.pipeline import verdict_evidence

        lines = verdict_evidence(str(run_dir), snap.processes, [1])
        assert any(ln.startswith("rank 1 died in libcrashy.so, crash_here+0x") for ln in lines), lines
    finally:
        kill_all(procs)
