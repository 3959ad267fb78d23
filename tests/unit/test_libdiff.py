"""env-diff of every mapped shared object and of the imported packages' versions (issue 41):
build-ids read at analysis time only where ranks map different files, files that cannot
be read named and compared by path, the evidence line, and the in-process package record."""

import os
import shutil
import subprocess
import types

import pytest

from hangtrace.hooks.env import pkgversions as P
from hangtrace.tracer import envfacts as E
from hangtrace.tracer.analyze.envdiff import diff_env, envdiff_evidence
from hangtrace.tracer.collect import elffacts as X
from hangtrace.tracer.report.envdiff import render_text

HOST = "h"
PROBE_C = "int htprobe_build(void) { return BUILD; }\n"


def cc_lib(
    directory, build: int, name: str = "libhtprobe.so", build_id: bool = True, soname: str = ""
) -> str:
    """A small shared library built by ``cc`` (``BUILD`` changes its content, hence its
    GNU build-id); returns its path."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc) on this machine")
    os.makedirs(str(directory), exist_ok=True)
    src = os.path.join(str(directory), "probe.c")
    with open(src, "w") as f:
        f.write(PROBE_C)
    out = os.path.join(str(directory), name)
    flags = ["-Wl,--build-id" if build_id else "-Wl,--build-id=none"]
    flags += ["-Wl,-soname," + soname] if soname else []
    subprocess.run([cc, "-shared", "-fPIC", "-DBUILD=%d" % build] + flags + ["-o", out, src], check=True)
    return out


def rank(r: int, paths, host: str = HOST, packages=()) -> E.ProcessEnv:
    """A rank's record mapping ``paths`` (inodes as the maps would name them)."""
    maps = tuple(E.Mapping(0x1000 * (i + 1), 0x1000 * (i + 1) + 0x800, 0, p) for i, p in enumerate(paths))
    files = []
    for p in paths:
        try:
            files.append((p, os.stat(p).st_ino))
        except OSError:
            files.append((p, 7))
    return E.ProcessEnv(
        host=host, pid=100 + r, rank=r, mappings=maps, files=tuple(files), packages=tuple(packages)
    )


def test_two_builds_read_and_named_in_diff_and_evidence(tmp_path) -> None:
    a, b = cc_lib(tmp_path / "a" / "lib", 1), cc_lib(tmp_path / "b" / "lib", 2)
    common = cc_lib(tmp_path / "c", 3, name="libcommon.so")
    ida, idb = X.elf_build_id(a)[0], X.elf_build_id(b)[0]
    assert ida and idb and ida != idb
    envs = [rank(r, [common, b if r == 1 else a]) for r in range(4)]
    reads = []

    def read(path, inode):
        reads.append(path)
        return X.read_library(path, inode)

    got, notes = X.every_library(envs, host=HOST, read=read)
    assert notes == [] and sorted(set(reads)) == sorted([a, b])  # libcommon.so: one file, not read
    diff = diff_env(got)
    [d] = diff.differences
    assert (d.kind, d.name, [g.ranks for g in d.groups]) == ("library", "libhtprobe.so", [(1,), (0, 2, 3)])
    assert d.groups[0].value == "%s (build-id %s)" % (b, idb)
    assert "library libhtprobe.so: rank 1 on host h: %s (build-id %s…)" % (b, idb[:12]) in render_text(diff)
    [line] = envdiff_evidence(got, [1])
    assert (
        line == "rank 1 loaded libhtprobe.so from %s (build-id %s…) where ranks 0, 2–3 loaded it from %s "
        "(build-id %s…)"
        % (
            os.path.dirname(b),
            idb[:12],
            os.path.dirname(a),
            ida[:12],
        )
    )
    # rank 0 loaded what most of its peers did (ranks 2-3): nothing to say about it
    assert envdiff_evidence(got, [0]) == []
    # two culprits, rank 2 with its peers: only rank 1's library is named
    assert envdiff_evidence(got, [1, 2]) == [
        "rank 1 loaded libhtprobe.so from %s (build-id %s…) where ranks 0, 3 loaded it from %s (build-id %s…)"
        % (os.path.dirname(b), idb[:12], os.path.dirname(a), ida[:12])
    ]


def test_a_renamed_copy_is_compared_under_its_soname(tmp_path) -> None:
    a = cc_lib(tmp_path / "a", 1, soname="libhtprobe.so")
    b = cc_lib(tmp_path / "b", 2, name="libhtprobe_v2.so", soname="libhtprobe.so")
    nameless = cc_lib(tmp_path / "c", 3, name="libother.so")  # only rank 0 maps it; no soname
    envs = [rank(0, [a, nameless]), rank(1, [b]), rank(2, [a])]
    got, notes = X.every_library(envs, host=HOST)
    assert notes == [] and X.elf_soname(b) == "libhtprobe.so" and X.elf_soname(nameless) is None
    [d] = diff_env(got).differences
    assert (d.name, [g.ranks for g in d.groups]) == ("libhtprobe.so", [(1,), (0, 2)])
    [line] = envdiff_evidence(got, [1])
    assert line.startswith("rank 1 loaded libhtprobe_v2.so from %s (build-id " % os.path.dirname(b)), line
    assert line.endswith(
        "where ranks 0, 2 loaded it from %s (build-id %s…)" % (os.path.dirname(a), X.elf_build_id(a)[0][:12])
    )
    # without the sonames they are two libraries, each loaded by some ranks only: no difference
    got, _ = X.every_library(envs, host=HOST, soname=lambda p, i: None)
    assert diff_env(got).differences == ()


def test_same_build_at_two_paths_is_a_path_difference(tmp_path) -> None:
    a = cc_lib(tmp_path / "a", 1)
    b = str(tmp_path / "b" / "libhtprobe.so")
    os.makedirs(os.path.dirname(b))
    shutil.copy(a, b)
    got, _ = X.every_library([rank(0, [a]), rank(1, [a]), rank(2, [b])], host=HOST)
    [d] = diff_env(got).differences
    assert [g.value for g in d.groups] == [
        "%s (build-id %s)" % (b, X.elf_build_id(a)[0]),
        "%s (build-id %s)" % (a, X.elf_build_id(a)[0]),
    ]


def test_unreadable_files_are_named_and_the_rest_compared(tmp_path) -> None:
    a, b = cc_lib(tmp_path / "a", 1), cc_lib(tmp_path / "b", 2)
    gone = cc_lib(tmp_path / "gone", 3)
    noid = cc_lib(tmp_path / "noid", 4, build_id=False)
    text = tmp_path / "t" / "libhtprobe.so"
    os.makedirs(str(text.parent))
    text.write_text("not an ELF file\n")
    folder = tmp_path / "d" / "libhtprobe.so"
    folder.mkdir(parents=True)
    envs = [
        rank(0, [a]),
        rank(1, [a]),
        rank(2, [b]),
        rank(3, [gone]),
        rank(4, [noid]),
        rank(5, [str(text)]),
        rank(6, [str(folder)]),  # a directory where the file was: unreadable
        rank(7, [a], host="other"),
        rank(8, [a + " (deleted)"]),
    ]
    os.unlink(gone)
    got, notes = X.every_library(envs, host=HOST)
    assert sorted(notes) == sorted(
        [
            "%s (deleted): build-id unknown (deleted while mapped), compared by path only (rank 8)" % a,
            "%s: build-id unknown (recorded on host other), compared by path only (rank 7)" % a,
            "%s: build-id unknown (vanished since the run), compared by path only (rank 3)" % gone,
            "%s: build-id unknown (unreadable: Is a directory), compared by path only (rank 6)" % folder,
            "%s: build-id unknown (not an ELF file), compared by path only (rank 5)" % text,
        ]
    )
    libs = {pe.rank: pe.libraries[0] for pe in got}
    assert libs[4].note == X.NO_BUILD_ID and libs[2].build_id == X.elf_build_id(b)[0]
    # some build-ids unknown: the paths alone are compared, every path still named
    [d] = diff_env(got).differences
    values = [g.value for g in d.groups]
    assert values[-1] == a and len(d.groups[-1].ranks) == 3  # ranks 0, 1, 7 share the path
    assert set(values) == {a, b, gone, noid, str(text), str(folder), a + " (deleted)"}


def test_two_files_of_one_name_in_every_rank_are_not_read() -> None:
    both = ["/site/torch/_C.cpython-311-x86_64-linux-gnu.so", "/site/myop/_C.cpython-311-x86_64-linux-gnu.so"]
    envs = [rank(0, both), rank(1, both)]
    got, notes = X.every_library(envs, host=HOST, read=lambda p, i: pytest.fail("read %s" % p))
    assert notes == [] and diff_env(got).differences == ()
    envs.append(rank(2, both[:1]))  # rank 2 lacks the custom op: the ranks differ, both read
    seen = []
    got, _ = X.every_library(
        envs, host=HOST, read=lambda p, i: seen.append(p) or (None, "vanished since the run")
    )
    assert sorted(set(seen)) == sorted(both)
    [d] = diff_env(got).differences
    assert [g.ranks for g in d.groups] == [(2,), (0, 1)] and d.groups[0].value == both[0]


def test_one_path_on_two_hosts_is_not_read() -> None:
    envs = [rank(0, ["/usr/lib/libz.so.1"]), rank(1, ["/usr/lib/libz.so.1"], host="other")]
    envs[1] = envs[1]._replace(files=(("/usr/lib/libz.so.1", 99999),))  # another file system
    got, notes = X.every_library(envs, host=HOST, read=lambda p, i: pytest.fail("read %s" % p))
    assert notes == [] and diff_env(got).differences == ()


def test_replaced_file_is_not_read(tmp_path) -> None:
    a, b = cc_lib(tmp_path / "a", 1), cc_lib(tmp_path / "b", 2)
    envs = [rank(0, [a]), rank(1, [b])]
    envs[1] = envs[1]._replace(files=((b, os.stat(b).st_ino + 1),))
    got, notes = X.every_library(envs, host=HOST)
    assert len(notes) == 1 and "replaced since the run (inode" in notes[0] and b in notes[0]
    assert got[1].libraries[0].build_id is None and got[0].libraries[0].build_id


def test_presence_of_other_libraries_is_no_difference_but_a_library_that_matters_is() -> None:
    envs = [rank(0, ["/x/libplugin.so", "/x/libnccl.so.2"]), rank(1, [])]
    diff = diff_env(X.every_library(envs, host=HOST)[0])
    assert [(d.name, [g.value for g in d.groups]) for d in diff.differences] == [
        ("libnccl.so", ["(not loaded)", "/x/libnccl.so.2"])
    ]


def test_package_versions_differ_and_name_the_culprit() -> None:
    envs = [
        rank(r, [], packages=[("numpy", "2.0.1" if r == 2 else "1.26.4"), ("torch", "2.4.0")])
        for r in range(3)
    ]
    envs[0] = envs[0]._replace(packages=envs[0].packages + (("htonly", "1.0"),))  # only rank 0 imported it
    diff = diff_env(envs)
    assert [(d.kind, d.name) for d in diff.differences] == [("package", "numpy")]
    assert "package numpy: rank 2 on host h: 2.0.1; the others (ranks 0–1 on host h): 1.26.4" in render_text(
        diff
    )
    assert envdiff_evidence(envs, [2]) == [
        "rank 2 runs differently from its peers: numpy 2.0.1 (peers: 1.26.4)"
    ]


def test_record_round_trips_files_and_packages() -> None:
    pe = E.ProcessEnv(host="h", pid=1, files=(("/a/x.so", 12),), packages=(("numpy", "1.26.4"),))
    d = E.to_json(pe)
    assert d["files"] == {"/a/x.so": "12"} and d["packages"] == {"numpy": "1.26.4"}
    assert E.from_json(d) == pe
    del d["files"], d["packages"]  # a record of an older version
    assert E.from_json(d)._replace(files=pe.files, packages=pe.packages) == pe


def _module(path: str) -> types.ModuleType:
    m = types.ModuleType("m")
    m.__file__ = path
    return m


def test_package_versions_from_installed_metadata(tmp_path, monkeypatch) -> None:
    site = tmp_path / "site"
    (site / "ht_pkg").mkdir(parents=True)
    (site / "ht_pkg" / "__init__.py").write_text("")
    (site / "Ht.Pkg-1.2.3.dist-info").mkdir()  # names compared normalized (PEP 503)
    (site / "yamlish.py").write_text("")
    (site / "PyYamlish-6.0.dist-info").mkdir()
    (site / "PyYamlish-6.0.dist-info" / "top_level.txt").write_text("yamlish\n")
    (site / "oldegg.py").write_text("")
    (site / "oldegg.egg-info").mkdir()
    (site / "oldegg.egg-info" / "PKG-INFO").write_text(
        "Metadata-Version: 1.0\nName: oldegg\nVersion: 0.9\n\nbody\n"
    )
    (site / "mine.py").write_text("")  # no metadata: left out
    for cache in ("_dists", "_tops", "_read", "_resolved"):
        monkeypatch.setattr(P, cache, {})
    assert P.resolve("ht_pkg", _module(str(site / "ht_pkg" / "__init__.py"))) == ("Ht.Pkg", "1.2.3")
    assert P.resolve("yamlish", _module(str(site / "yamlish.py"))) == ("PyYamlish", "6.0")
    assert P.resolve("oldegg", _module(str(site / "oldegg.py"))) == ("oldegg", "0.9")
    assert P.resolve("mine", _module(str(site / "mine.py"))) is None
    assert P.normalize("Ht.-_Pkg") == "ht_pkg"


def test_loaded_packages_match_importlib_metadata() -> None:
    import importlib.metadata as md

    import pytest as _pytest  # noqa: F401 (imported: a package with installed metadata)

    got = P.loaded_packages()
    assert got.get("pytest") == md.version("pytest")
    for name, version in got.items():
        assert md.version(name) == version, name


def test_env_diff_without_a_readable_record_names_the_unreadable_ones(tmp_path, capsys) -> None:
    """Bad input: a run whose env records are all unreadable (truncated JSON) is an error
    that names each file and why, not "no environment records"; an empty env/ says none."""
    from hangtrace import cli

    env = tmp_path / "env"
    env.mkdir()
    assert cli.main(["env-diff", str(tmp_path)]) == 4
    assert "error: no environment records (env/*.json) in %s" % tmp_path in capsys.readouterr().err
    for pid in (10, 11):
        (env / ("h-%d.json" % pid)).write_text('{"host": "h", "pid": %d' % pid)
    assert cli.main(["env-diff", str(tmp_path)]) == 4
    err = capsys.readouterr().err
    assert "error: no readable environment records (env/*.json) in %s" % tmp_path in err
    for pid in (10, 11):
        assert "%s: unreadable env record (" % (env / ("h-%d.json" % pid)) in err, err
    assert "remedy: " in err
