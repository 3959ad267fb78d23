"""hangtrace run's end: the empty stack files of gone processes (tracer/watch/housekeeping.tidy_gone)."""

import os


def test_the_end_of_a_run_removes_empty_stack_files_of_gone_processes_only(tmp_path):
    """`hangtrace run`'s end (issue 40: 62 of 69 stack files of a Ray Train run were empty):
    a gone process's empty file goes; a live process's empty file (its faulthandler may still
    write) and a file with content stay; another host's files are not judged here."""
    import subprocess
    import sys

    from hangtrace.tracer.watch.housekeeping import tidy_gone

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    st = tmp_path / "stacks"
    st.mkdir()
    (st / ("sigterm-h1-%d.txt" % gone.pid)).write_text("")
    (st / ("fatal-h1-%d.txt" % gone.pid)).write_text("Fatal Python error: Segmentation fault\n")
    (st / ("dump-h1-%d.txt" % os.getpid())).write_text("")
    (st / ("sigterm-h2-%d.txt" % gone.pid)).write_text("")
    assert tidy_gone(str(tmp_path), host="h1") == 1
    assert sorted(p.name for p in st.iterdir()) == sorted(
        ["fatal-h1-%d.txt" % gone.pid, "dump-h1-%d.txt" % os.getpid(), "sigterm-h2-%d.txt" % gone.pid]
    )
    for p in st.iterdir():
        p.unlink()
    assert tidy_gone(str(tmp_path), host="h1") == 0 and not st.exists()
    assert tidy_gone(str(tmp_path / "nowhere")) == 0


def test_a_zombie_is_gone_and_an_owner_that_exits_within_the_wait_is_waited_for(tmp_path):
    import subprocess
    import sys

    from hangtrace.tracer.watch.housekeeping import tidy_gone

    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    st = tmp_path / "stacks"
    st.mkdir()
    (st / ("dump-h1-%d.txt" % zombie.pid)).write_text("")
    (st / ("dump-h1-%d.txt" % late.pid)).write_text("")
    import time

    time.sleep(0.3)  # the first has exited, unreaped: a zombie
    try:
        assert tidy_gone(str(tmp_path), host="h1", wait_s=10.0) == 2
    finally:
        zombie.wait()
        late.wait()
