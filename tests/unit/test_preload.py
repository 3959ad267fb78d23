"""The start-up bundle (hooks/preload.py, issue 8): our in-process modules run from one
file per group; never wrong, at worst the usual imports."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from jobs import REPO, base_env

from hangtrace.hooks import preload

# imported before any bundle can be read: the .pth's two packages, bootstrap and preload itself,
# and the C extension (not Python code)
NOT_BUNDLED = {
    "hangtrace",
    "hangtrace.hooks",
    "hangtrace.hooks.bootstrap",
    "hangtrace.hooks.preload",
    "hangtrace.hooks._fastrec",
}


def _python(code, env, cwd=None):
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=cwd or "/",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_every_module_of_a_traced_torch_start_comes_from_the_bundle(tmp_path):
    """The drift check: a module added to the start-up path but not to ``GROUPS`` (or out of
    its group's order: served by the cycle finder, still marked) shows up here."""
    pytest.importorskip("torch")
    preload.refresh()
    out = _python(
        """
        import sys
        import torch.distributed
        from hangtrace.hooks import preload
        print(preload.status())
        for name, mod in sorted(sys.modules.copy().items()):
            if name.startswith("hangtrace"):
                spec = getattr(mod, "__spec__", None)
                print(name, getattr(spec, "loader_state", None) == preload.MARK, type(mod.__loader__).__name__,
                      mod.__file__ == getattr(spec, "origin", None))
    """,
        base_env(tmp_path / "run"),
    )
    lines = out.splitlines()
    assert "'activate': 'loaded" in lines[0] and "'torch': 'loaded" in lines[0], lines[0]
    rows = [line.split() for line in lines[1:]]
    bundled = {r[0] for r in rows if r[1] == "True"}
    assert {r[0] for r in rows} - bundled == NOT_BUNDLED, out
    assert bundled <= {n for names in preload.GROUPS.values() for n in names}
    for name, _marked, loader, same_file in rows:  # the attributes an import gives
        assert same_file == "True", name
        if name in bundled:
            assert loader == "SourceFileLoader", name


@pytest.fixture
def copy_root(tmp_path):
    """A copy of the package, so its sources can be changed: (root, env importing it)."""
    root = tmp_path / "tree"
    shutil.copytree(
        os.path.join(REPO, "hangtrace"),
        root / "hangtrace",
        ignore=shutil.ignore_patterns("__pycache__", "*.so"),
    )
    env = base_env(traced=False, PYTHONPATH=str(root), HANGTRACE_PURE_PYTHON="1")
    _python(
        "from hangtrace.hooks import preload; assert preload._ROOT == %r; preload.build()" % str(root),
        env,
        cwd=str(root),
    )
    return root, env


CHECK = """
import sys
from hangtrace.hooks import preload
n = preload.load("activate")
print(n, preload.status()["activate"])
import hangtrace.hooks.mem.memory as m
print(getattr(m.__spec__, "loader_state", None) == preload.MARK)
"""


def test_a_fresh_bundle_runs_its_modules_and_they_behave_as_imported(copy_root):
    root, env = copy_root
    out = _python(
        CHECK
        + """
import importlib, inspect
print(inspect.getsource(m.MemoryInstrumentor).startswith("class MemoryInstrumentor"))
print(importlib.reload(m) is m, m.__spec__.loader_state)
import hangtrace.tracer as t
print(t.__path__ == [%r], t.api is sys.modules["hangtrace.tracer.api"])
"""
        % str(root / "hangtrace" / "tracer"),
        env,
        cwd=str(root),
    ).split("\n")
    assert out[0] == "%d loaded %d" % (len(preload.GROUPS["activate"]), len(preload.GROUPS["activate"]))
    assert out[1:5] == ["True", "True", "True None", "True True"]  # (reloaded: an ordinary import again)


def test_a_changed_source_makes_the_whole_group_import_as_usual(copy_root):
    root, env = copy_root
    src = root / "hangtrace" / "hooks" / "mem" / "cgroup.py"
    src.write_text(src.read_text() + "\nCHANGED = 1\n")
    out = _python(
        CHECK + "import hangtrace.hooks.mem.cgroup as c; print(c.CHANGED)", env, cwd=str(root)
    ).split("\n")
    assert out[0] == "0 stale: %s changed" % src
    assert out[1:3] == ["False", "1"]
    assert (
        _python(
            "from hangtrace.hooks import preload; print(preload.refresh() == [preload.bundle_path('activate')])",
            env,
            cwd=str(root),
        ).strip()
        == "True"
    )
    assert _python(CHECK, env, cwd=str(root)).split("\n")[1] == "True"


def test_a_module_that_raises_is_left_to_its_import_which_raises_the_same(copy_root):
    root, env = copy_root
    src = root / "hangtrace" / "hooks" / "mem" / "cgroup.py"
    src.write_text(src.read_text() + "\nraise RuntimeError('broken on purpose')\n")
    _python("from hangtrace.hooks import preload; preload.build(['activate'])", env, cwd=str(root))
    out = _python(
        """
        import sys
        from hangtrace.hooks import preload
        print(preload.load("activate"), "hangtrace.hooks.mem.cgroup" in sys.modules, "hangtrace.hooks.mem.memory" in sys.modules)
        print(preload.status()["activate"])
        try:
            import hangtrace.hooks.mem.memory
        except RuntimeError as e:
            print("raised", e)
    """,
        env,
        cwd=str(root),
    ).split("\n")
    assert out[0] == "0 False False"  # (memory imports cgroup: it stopped there, neither is left half-made)
    assert out[1].startswith("stopped: RuntimeError('broken on purpose')")
    assert out[2] == "raised broken on purpose"


@pytest.mark.parametrize("what", ["magic", "garbage", "names"])
def test_a_foreign_or_corrupt_bundle_is_not_used(copy_root, what):
    root, env = copy_root
    path = _python(
        "from hangtrace.hooks import preload; print(preload.bundle_path('activate'))", env, cwd=str(root)
    ).strip()
    import marshal

    with open(path, "rb") as f:
        magic, opt, entries = marshal.loads(f.read())
    data = {
        "magic": marshal.dumps((b"\0\0\r\n", opt, entries)),
        "garbage": b"\x00not a bundle",
        "names": marshal.dumps((magic, opt, entries[1:])),
    }[what]
    with open(path, "wb") as f:
        f.write(data)
    out = _python(CHECK, env, cwd=str(root)).split("\n")
    reason = {
        "magic": "0 built by another interpreter or -O level",
        "garbage": "0 unreadable: ",
        "names": "0 built for another module list",
    }[what]
    assert out[0].startswith(reason) and out[1] == "False", out
