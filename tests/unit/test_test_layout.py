"""The test tree itself: pytest imports test files by basename (no packages under tests/),
so two test files with one basename in different folders break collection of the whole
suite ("import file mismatch"), which a run of one folder does not show."""

import collections
import glob
import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_test_file_basenames_are_unique_across_folders():
    seen = collections.defaultdict(list)
    for path in glob.glob(os.path.join(TESTS, "**", "test_*.py"), recursive=True):
        if "/blind/" in path.replace(os.sep, "/"):
            continue  # blind jobs are run as programs, never collected
        seen[os.path.basename(path)].append(os.path.relpath(path, TESTS))
    dup = {k: v for k, v in seen.items() if len(v) > 1}
    assert not dup, dup
