"""env-diff on a real traced gloo job (issue 41): two builds of a small library built by
``cc`` under a name outside any list (``libhtprobe.so``), in two directories, loaded by its
bare name through ctypes; the odd rank's LD_LIBRARY_PATH finds the other build and its
PYTHONPATH another version of a package. ``hangtrace env-diff`` names both, and the
verdict of the job (the odd rank stalls outside the collective its peers wait in) carries
the evidence lines. One job of 3 ranks; about 20-40 s on the 2-core CI machine."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from jobs import base_env, free_port, kill_all, wait_line
from hangtrace.tracer.collect import elffacts

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "envdiff_job.py")
PROBE_C = "int htprobe_build(void) { return BUILD; }\n"
WORLD, ODD = 3, 1


def build(root, build: int, version: str) -> str:
    """``root/lib/libhtprobe.so`` (``cc``, GNU build-id) and ``root/site/htpkg`` with its
    ``htpkg-<version>.dist-info``; returns ``root``."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc) on this machine")
    lib, site = os.path.join(root, "lib"), os.path.join(root, "site")
    os.makedirs(lib)
    os.makedirs(os.path.join(site, "htpkg"))
    os.makedirs(os.path.join(site, "htpkg-%s.dist-info" % version))
    with open(os.path.join(site, "htpkg", "__init__.py"), "w") as f:
        f.write("VERSION = %r\n" % version)
    src = os.path.join(root, "probe.c")
    with open(src, "w") as f:
        f.write(PROBE_C)
    out = os.path.join(lib, "libhtprobe.so")
    subprocess.run(
        [cc, "-shared", "-fPIC", "-DBUILD=%d" % build, "-Wl,--build-id", "-o", out, src], check=True
    )
    return root


def hangtrace(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hangtrace"] + list(args),
        env=base_env(traced=False),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_shadowing_library_and_package_named_in_env_diff_and_verdict(tmp_path) -> None:
    run_dir = tmp_path / "run"
    a, b = build(str(tmp_path / "a"), 1, "1.0"), build(str(tmp_path / "b"), 2, "2.0")
    ida = elffacts.elf_build_id(os.path.join(a, "lib", "libhtprobe.so"))[0]
    idb = elffacts.elf_build_id(os.path.join(b, "lib", "libhtprobe.so"))[0]
    assert ida and idb and ida != idb
    port, procs = free_port(), []
    try:
        for r in range(WORLD):
            root = b if r == ODD else a
            env = base_env(
                run_dir,
                True,
                RANK=r,
                LOCAL_RANK=r,
                WORLD_SIZE=WORLD,
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                LD_LIBRARY_PATH=os.path.join(root, "lib"),
            )
            env["PYTHONPATH"] = os.pathsep.join(
                [os.path.join(root, "site")] + [p for p in [os.environ.get("PYTHONPATH")] if p]
            )
            procs.append(
                subprocess.Popen(
                    [sys.executable, SCRIPT, str(ODD)],
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        ready = sorted(wait_line(p, "READY", timeout=240) for p in procs)
        assert ready == ["READY 0 1 1.0", "READY 1 2 2.0", "READY 2 1 1.0"]  # the shadowing happened

        text = hangtrace("env-diff", str(run_dir))
        assert text.returncode == 0, text.stderr
        print(text.stdout)
        lib_line = next(ln for ln in text.stdout.splitlines() if "library libhtprobe.so" in ln)
        assert "rank 1 on host" in lib_line and idb[:12] in lib_line and ida[:12] in lib_line, text.stdout
        assert (
            "package htpkg: rank 1 on host" in text.stdout and ": 2.0; the others (ranks 0, 2" in text.stdout
        )
        js = hangtrace("env-diff", str(run_dir), "--json")
        assert js.returncode == 0, js.stderr
        diffs = {(d["kind"], d["name"]): d for d in json.loads(js.stdout)["differences"]}
        groups = {tuple(g["ranks"]): g["value"] for g in diffs[("library", "libhtprobe.so")]["groups"]}
        assert groups == {
            (1,): "%s/lib/libhtprobe.so (build-id %s)" % (b, idb),
            (0, 2): "%s/lib/libhtprobe.so (build-id %s)" % (a, ida),
        }
        assert {tuple(g["ranks"]): g["value"] for g in diffs[("package", "htpkg")]["groups"]} == {
            (1,): "2.0",
            (0, 2): "1.0",
        }

        dump = hangtrace("dump", str(run_dir), "--json")
        assert dump.returncode == 0, dump.stderr
        verdict = json.loads(dump.stdout)
        print("\n".join(verdict["evidence"]))
        assert verdict["culprit_ranks"] == [ODD], verdict["summary"]
        want = (
            "rank 1 loaded libhtprobe.so from %s/lib (build-id %s…) where ranks 0, 2 loaded it from %s/lib (build-id %s…)"
            % (
                b,
                idb[:12],
                a,
                ida[:12],
            )
        )
        assert want in verdict["evidence"], verdict["evidence"]
        rest = [e for e in verdict["evidence"] if e.startswith("rank 1 runs differently from its peers: ")]
        assert len(rest) == 1 and "htpkg 2.0 (peers: 1.0)" in rest[0], verdict["evidence"]
        assert "LD_LIBRARY_PATH=%s/lib (peers: %s/lib)" % (b, a) in rest[0]
    finally:
        kill_all(procs)
