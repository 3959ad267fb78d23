"""Environment forensics (issue 12): maps parsing, build-id reader, masking, the differ,
the evidence line, the report section and the crashing-frame lookup."""

import json
import shutil
import socket
import subprocess

import pytest

from hangtrace.tracer import envfacts as E
from hangtrace.tracer.analyze.envdiff import (
    diff_env,
    envdiff_evidence,
    fatal_frame_library,
    parse_kernel_faults,
    rank_ranges,
)
from hangtrace.tracer.collect import forensics as F
from hangtrace.tracer.report.envdiff import environment_section, render_json, render_text

NCCL_A = "9f3a1b2c3d4e5f60718293a4b5c6d7e8f9012345"
NCCL_B = "1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d"


def proc(rank: int, host: str, nccl: str, version: str, env: dict) -> E.ProcessEnv:
    lib = E.Library(
        path="/opt/nccl/lib/libnccl.so.%s" % version,
        size=100,
        build_id=nccl,
        version=version,
        version_source="file name",
    )
    torch_lib = E.Library(path="/site/torch/lib/libtorch_cpu.so", size=5, build_id="ab" * 20)
    return E.ProcessEnv(
        host=host,
        pid=1000 + rank,
        rank=rank,
        python="3.11.7",
        torch="2.13.0",
        libraries=(lib, torch_lib),
        environ=E.mask_environ(env),
    )


def cluster() -> list:
    envs = [proc(r, "a", NCCL_B, "2.23.4", {"NCCL_SOCKET_IFNAME": "eth0"}) for r in range(4)]
    envs += [
        proc(r, "b", NCCL_A, "2.21.5", {"NCCL_SOCKET_IFNAME": "eth0" if r < 7 else "ib0"})
        for r in range(4, 8)
    ]
    return envs


def test_parse_maps_keeps_executable_file_mappings() -> None:
    text = (
        "7f00a000-7f00b000 r--p 00000000 08:01 11 /lib/libx.so\n"
        "7f00b000-7f00c000 r-xp 00001000 08:01 11 /lib/libx.so\n"
        "7f00c000-7f00d000 rw-p 00000000 00:00 0 \n"
        "7ffd0000-7ffd1000 r-xp 00000000 00:00 0 [vdso]\n"
        "7f00e000-7f00f000 r-xp 00002000 08:01 12 /lib/with space.so (deleted)\n"
    )
    maps = F.parse_maps(text)
    assert maps == [
        E.Mapping(0x7F00B000, 0x7F00C000, 0x1000, "/lib/libx.so"),
        E.Mapping(0x7F00E000, 0x7F00F000, 0x2000, "/lib/with space.so (deleted)"),
    ]


def test_fast_build_id_reader_agrees_with_pyelftools() -> None:
    with open("/proc/self/maps") as f:
        paths = sorted({m.path for m in F.parse_maps(f.read()) if ".so" in m.path})
    assert paths
    for p in paths[:40]:
        assert F.read_build_id(p) == F._elftools_build_id(p), p
    assert F.read_build_id(__file__) is None


def test_secret_names_masked_and_irrelevant_variables_dropped() -> None:
    env = {
        "NCCL_IB_HCA": "mlx5",
        "RAY_API_KEY": "s3cr3t",
        "TORCH_token_x": "t0k",
        "MASTER_PASSWORD": "pw",
        "CUDA_CREDENTIALS": "cred",
        "PYTORCH_SECRET": "sec",
        "HOME": "/root",
        "HF_TOKEN": "hf",
        "LD_PRELOAD": "/x.so",
    }
    masked = dict(E.mask_environ(env))
    assert masked == {
        "NCCL_IB_HCA": "mlx5",
        "RAY_API_KEY": E.MASK,
        "TORCH_token_x": E.MASK,
        "MASTER_PASSWORD": E.MASK,
        "CUDA_CREDENTIALS": E.MASK,
        "PYTORCH_SECRET": E.MASK,
        "LD_PRELOAD": "/x.so",
    }
    # a record written by someone else with a clear secret is masked on reading and writing
    pe = proc(0, "a", NCCL_A, "2.21.5", {})._replace(environ=(("NCCL_KEY", "clear"),))
    assert "clear" not in json.dumps(E.to_json(pe))
    d = E.to_json(pe)
    d["environ"] = {"NCCL_KEY": "clear"}
    assert dict(E.from_json(d).environ) == {"NCCL_KEY": E.MASK}


def test_record_round_trips_through_json(tmp_path) -> None:
    pe = F.collect_self("test", host="h")
    F.write(str(tmp_path), pe)
    envs, errors = F.load_env(str(tmp_path))
    assert errors == [] and len(envs) == 1
    got = envs[0]
    assert got._replace(path=None) == pe
    assert any(lb.key == "libc.so" for lb in got.libraries) or any(
        "libpython" in lb.name for lb in got.libraries
    )
    (tmp_path / "env" / "h-1.json").write_text("{not json")
    envs, errors = F.load_env(str(tmp_path))
    assert len(envs) == 1 and len(errors) == 1 and "h-1.json" in errors[0]


def test_diff_groups_ranks_by_host_with_majority_as_the_others() -> None:
    diff = diff_env(cluster())
    by = {(d.kind, d.name): d for d in diff.differences}
    assert set(by) == {("library", "libnccl.so"), ("environment", "NCCL_SOCKET_IFNAME")}
    nccl = by[("library", "libnccl.so")]
    assert [g.ranks for g in nccl.groups] == [(4, 5, 6, 7), (0, 1, 2, 3)]
    text = render_text(diff)
    assert (
        "library libnccl.so: ranks 4–7 on host b: /opt/nccl/lib/libnccl.so.2.21.5 (build-id 9f3a1b2c3d4e…, "
        "2.21.5); the others (ranks 0–3 on host a): /opt/nccl/lib/libnccl.so.2.23.4 (build-id "
        "1c2d3e4f5a6b…, 2.23.4)"
    ) in text
    assert "rank 7 on host b: ib0" in text
    j = render_json(diff)
    assert j["differences"][0]["groups"][0]["value"] == (
        "/opt/nccl/lib/libnccl.so.2.21.5 (build-id %s, 2.21.5)" % NCCL_A
    )


def test_helpers_without_rank_are_left_out_and_missing_facts_named() -> None:
    envs = cluster()[:2]
    helper = proc(-1, "a", NCCL_A, "2.21.5", {})._replace(pid=5)
    bare = envs[1]._replace(libraries=envs[1].libraries[1:], environ=())
    diff = diff_env([envs[0], bare, helper])
    assert diff.processes == 2
    vals = {d.name: [g.value for g in d.groups] for d in diff.differences}
    assert vals["libnccl.so"][0] == "(not loaded)" and vals["NCCL_SOCKET_IFNAME"][0] == "(unset)"
    assert diff_env([]).differences == ()


def test_evidence_names_what_the_culprit_runs_differently() -> None:
    lines = envdiff_evidence(cluster(), [7])
    assert len(lines) == 2
    # its node peers share its libnccl: measured against all other ranks, the majority is host a's
    assert lines[0] == (
        "rank 7 (as did ranks 4–6) loaded libnccl.so.2.21.5 from /opt/nccl/lib (build-id 9f3a1b2c3d4e…) "
        "where ranks 0–3 loaded libnccl.so.2.23.4 from /opt/nccl/lib (build-id 1c2d3e4f5a6b…)"
    )
    assert lines[1] == "rank 7 runs differently from its peers: NCCL_SOCKET_IFNAME=ib0 (peers: eth0)"
    assert envdiff_evidence(cluster()[:4], [1]) == []  # the same everywhere: no line
    assert envdiff_evidence(cluster(), []) == []
    assert envdiff_evidence(cluster(), list(range(8))) == []  # no peers to differ from


def test_environment_section_is_short() -> None:
    assert environment_section(diff_env(cluster()[:4])) == ""
    sec = environment_section(diff_env(cluster()), max_lines=1)
    assert sec.splitlines()[0].startswith("Environment differences")
    assert len(sec.splitlines()) == 3 and "1 more" in sec


def test_rank_ranges() -> None:
    assert rank_ranges([7, 0, 1, 2, 3, 5]) == "0–3, 5, 7"


KLINE_NEW = (
    "python[23323]: segfault at c ip 00007f526ca46109 sp 00007ffe9b51dd50 error 4 in "
    "libcrash.so[1109,7f526ca46000+1000] likely on CPU 0 (core 0, socket 0)"
)
KLINE_OLD = (
    "python[42]: segfault at 0 ip 00007f526ca46109 sp 00007ffe9b51dd50 error 4 in "
    "libcrash.so[7f526ca46000+1000]"
)
KLINE_TRAP = (
    "traps: python[77] trap divide error ip:7f526ca46109 sp:7ffe9b51dd50 error:0 in "
    "libcrash.so[1109,7f526ca46000+1000]"
)


def test_parse_kernel_fault_lines_of_old_and_new_kernels_and_traps() -> None:
    new, old, trap = parse_kernel_faults("\n".join([KLINE_NEW, KLINE_OLD, "unrelated", KLINE_TRAP]))
    assert (new.pid, new.ip, new.name, new.file_offset) == (23323, 0x7F526CA46109, "libcrash.so", 0x1109)
    assert (old.pid, old.file_offset, old.base) == (42, None, 0x7F526CA46000)
    assert (trap.pid, trap.what, trap.file_offset) == (77, "divide error", 0x1109)


def crash_lib(tmp_path) -> tuple:
    """A ``cc``-built library, a recorded mapping of it and a kernel line for pid 9."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc) on this machine")
    src = tmp_path / "crash.c"
    src.write_text("int crash_here(int *p) { return p[3] + 1; }\nint other(void) { return 2; }\n")
    lib = tmp_path / "libcrash.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O0", "-Wl,--build-id", "-o", str(lib), str(src)], check=True)
    from elftools.elf.elffile import ELFFile

    with open(lib, "rb") as f:
        sym = ELFFile(f).get_section_by_name(".symtab").get_symbol_by_name("crash_here")[0]["st_value"]
    base = 0x7F526CA45000
    # the text segment of a small -shared library: file offset == vaddr (one page in)
    maps = [E.Mapping(base + 0x1000, base + 0x2000, 0x1000, str(lib))]
    ip = base + sym + 5
    line = "python[9]: segfault at c ip %016x sp 00007ffe9b51dd50 error 4 in libcrash.so[%x,%x+1000]" % (
        ip,
        sym + 5,
        base + 0x1000,
    )
    return lib, sym, maps, line


def test_fatal_frame_from_recorded_maps_and_symbol_table(tmp_path) -> None:
    lib, sym, maps, line = crash_lib(tmp_path)
    got = fatal_frame_library(line, maps, F.symbolize, pid=9)
    assert got is not None and got.startswith(
        "libcrash.so, crash_here+0x5 (segfault; %s +0x%x)" % (lib, sym + 5)
    )
    # without maps (process recorded nothing): the kernel's file offset and name still place it
    assert fatal_frame_library(line, [], None).startswith("libcrash.so (segfault; libcrash.so +0x")
    assert fatal_frame_library(line, maps, F.symbolize, pid=10) is None
    assert fatal_frame_library("Fatal Python error: Aborted", maps, F.symbolize) is None


def test_crash_frame_reads_the_record_and_the_kernel_log(tmp_path) -> None:
    from hangtrace.tracer.pipeline import crash_frame

    lib, sym, maps, line = crash_lib(tmp_path)
    run = str(tmp_path / "run")
    F.write(run, E.ProcessEnv(host=socket.gethostname(), pid=9, mappings=tuple(maps)))
    log = lambda: ([(1.0, "python[8]: segfault at 0 ip 0000000000000001 sp 0 error 4"), (2.0, line)], "read")
    assert crash_frame(run, socket.gethostname(), 9, log).startswith("libcrash.so, crash_here+0x5")
    assert crash_frame(run, socket.gethostname(), 9, lambda: ([], "/dev/kmsg: denied")) is None
    assert crash_frame(run, "another-host", 9, log) is None


class _Rt:
    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.lines = []

        class Rec:
            host = "h"

        self.recorder = Rec()

    def log(self, msg: str, key: str = None) -> None:
        self.lines.append(msg)


def test_in_process_record_never_raises_and_skips_known_libraries(tmp_path) -> None:
    from hangtrace.hooks.env import envrecord

    bad = tmp_path / "a-file"
    bad.write_text("x")
    rt = _Rt(str(bad))  # the run directory is a file: nothing can be written
    envrecord.record(rt, "test")
    assert rt.lines and "environment record failed" in rt.lines[0]
    good = _Rt(str(tmp_path / "run"))
    envrecord.record(good, "test")
    assert good.lines == [] and len(F.load_env(good.run_dir)[0]) == 1
    libc = next(p for p in envrecord.recorded_paths() if "libc" in p)
    assert not envrecord._loaded_new(libc) and not envrecord._loaded_new(None)
    assert envrecord._loaded_new(str(tmp_path / "libnew.so"))
    # bare names compare by file name; the sets follow the newest record (made lazily)
    assert not envrecord._loaded_new(libc.rpartition("/")[2]) and envrecord._loaded_new("libnothere.so.9")
    envrecord.record(good, "again")
    assert libc in envrecord.recorded_paths() and not envrecord._loaded_new(libc)


def test_library_name_rules_match_the_issue_12_patterns() -> None:
    """The string rules of the in-process writer agree with the patterns they replaced
    (compiling these two regular expressions cost every traced start-up about 0.5 ms)."""
    import re

    matter = re.compile(
        r"^(libtorch|libc10|libnccl|libgloo|libcuda|libcudart|libnvidia-ml|libibverbs|"
        r"libmpi|libpython|libc\.so|libc-)|nccl|cuda",
        re.IGNORECASE,
    )
    version = re.compile(r"\.so\.(\d+\.\d+\.\d+(?:\.\d+)*)$")
    names = [
        "libnccl.so.2.21.5",
        "LIBTORCH_cpu.so",
        "libc.so.6",
        "libc-2.31.so",
        "libcrypt.so.1",
        "libm.so.6",
        "libpython3.11.so.1.0",
        "libfoo-cuda.so",
        "my_NCCL_plugin.so",
        "libgloo.so",
        "libmpi_cxx.so.40.30.1",
        "libx.so.1.0",
        "libx.so.1.2.3.so.4.5.6",
        "libx.so..1.2",
        "libx.so.1.2.",
        "libx.so.12.3.45.6",
        "libx.so.1.2.3 (deleted)",
        "libc10.so",
        "libibverbs.so.1.14.39.0",
        "libnvidia-ml.so.1",
        "python3.11",
    ]
    for n in names:
        assert F.matters("/some/dir/" + n) == bool(matter.search(n)), n
        m = version.search(n)
        assert F.name_version(n) == (m.group(1) if m else None), n


def test_maps_lines_parsed_again_after_a_change() -> None:
    a = "7f00b000-7f00c000 r-xp 00001000 08:01 11 /lib/libx.so\n"
    b = "7f00e000-7f00f000 r-xp 00000000 08:01 12 /lib/liby.so\n"
    assert F.parse_maps(a) == [E.Mapping(0x7F00B000, 0x7F00C000, 0x1000, "/lib/libx.so")]
    assert [m.path for m in F.parse_maps(a + b)] == ["/lib/libx.so", "/lib/liby.so"]
    assert [m.path for m in F.parse_maps(b)] == ["/lib/liby.so"]
