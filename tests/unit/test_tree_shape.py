"""The shape of the tree, kept (issues 8 and 42): no module of the package over 400 lines
(the C file aside), no function over 30 decision points (radon's cyclomatic complexity,
which counts the function itself as 1: at most 31), no folder over 20 modules (``rules/``
aside: one module per verdict rule, listed in its registry), no import circle among our
modules, the import directions of pyproject.toml's import-linter contracts, and one
formatter and linter (ruff, configured in pyproject.toml) clean over the whole tree."""

import glob
import os
import subprocess
import sys

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
ROOT = os.path.join(REPO, "hangtrace")
MAX_LINES = 400
MAX_MODULES = 20  # per folder, __init__.py not counted
MAX_COMPLEXITY = 31  # 30 decision points + 1


def _modules():
    return sorted(glob.glob(os.path.join(ROOT, "**", "*.py"), recursive=True))


def test_no_module_over_400_lines():
    long = {
        os.path.relpath(p, ROOT): n for p in _modules() for n in [sum(1 for _ in open(p))] if n > MAX_LINES
    }
    assert not long, "modules over %d lines (split them): %s" % (MAX_LINES, long)


def test_no_function_over_30_decision_points():
    from radon.complexity import cc_visit  # (a test dependency: setup.cfg [test])

    heavy = {}
    for p in _modules():
        for block in cc_visit(open(p).read()):
            for f in [block, *getattr(block, "methods", ()), *getattr(block, "closures", ())]:
                if getattr(f, "complexity", 0) > MAX_COMPLEXITY:
                    heavy["%s:%d %s" % (os.path.relpath(p, ROOT), f.lineno, f.name)] = f.complexity
    assert not heavy, "functions over 30 decision points (split them): %s" % heavy


def test_no_folder_over_20_modules():
    crowded = {}
    for dirpath, _dirs, files in os.walk(ROOT):
        n = sum(1 for f in files if f.endswith(".py") and f != "__init__.py")
        if n > MAX_MODULES and os.path.basename(dirpath) != "rules":
            crowded[os.path.relpath(dirpath, ROOT)] = n
    assert not crowded, "folders over %d modules (group them by concern): %s" % (MAX_MODULES, crowded)


def _import_circles():
    """Strongly connected components (Tarjan) of the import graph of our modules, as grimp
    (import-linter's graph) builds it: every import, function-local ones included, except
    those under ``if TYPE_CHECKING:``. Returns ``[sorted module names]`` of each circle."""
    import grimp  # (a test dependency: import-linter, setup.cfg [test])

    graph = grimp.build_graph("hangtrace", exclude_type_checking_imports=True, cache_dir=None)
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):  # iterative enough for our depth; recursion limit raised below
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 10000))
    try:
        for m in sorted(edges):
            if m not in index:
                visit(m)
    finally:
        sys.setrecursionlimit(old)
    return circles


def test_no_import_circles():
    circles = _import_circles()
    assert not circles, "import circles (move the shared data down, by data not call-backs): %s" % circles


def test_import_directions_kept():
    """pyproject.toml's ``[tool.importlinter]`` contracts: hooks load no collection, analysis,
    rendering, watcher or CLI code; collection never imports analysis or rendering."""
    out = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def _ruff(*args):
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )


def test_formatter_clean():
    out = _ruff("format", "--check", ".")
    assert out.returncode == 0, "run `ruff format .`:\n" + out.stdout[-4000:] + out.stderr[-2000:]


def test_linter_clean():
    out = _ruff("check", ".")
    assert out.returncode == 0, "run `ruff check .`:\n" + out.stdout[-4000:] + out.stderr[-2000:]
