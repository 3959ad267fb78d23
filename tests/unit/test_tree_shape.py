"""The shape issue 8 asks of the tree, kept: no module of the package over 400 lines (the C
file aside), no function over 30 decision points (radon's cyclomatic complexity, which
counts the function itself as 1: at most 31)."""

import glob
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "hangtrace")
MAX_LINES = 400
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
