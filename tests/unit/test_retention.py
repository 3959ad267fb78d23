"""The retention planner (issue 13) on synthetic run facts: pure, no file system."""

from hangtrace.tracer.watch.retention import MIB, Policy, RunFacts, plan

NOW = 1_000_000.0


def run(name: str, age_s: float, mib: float = 1.0, live: tuple = (), unknown: tuple = ()) -> RunFacts:
    return RunFacts(
        path="/base/" + name,
        last_active_s=NOW - age_s,
        disk_bytes=int(mib * MIB),
        apparent_bytes=int(mib * MIB) * 3,
        live=live,
        unknown=unknown,
    )


def deleted(p) -> list:
    return [d.run.path.rsplit("/", 1)[1] for d in p.to_delete]


def test_keep_deletes_oldest_beyond_n() -> None:
    runs = [run("r%d" % i, 3600 * (i + 1)) for i in range(5)]  # r0 newest
    p = plan(runs, Policy(keep=2, max_bytes=10**12), NOW)
    assert deleted(p) == ["r4", "r3", "r2"]  # oldest first
    assert [d.run.path for d in p.decisions][0] == "/base/r0"  # decisions newest first
    assert all("more than 2 runs" in d.reason for d in p.to_delete)
    assert p.freed_bytes == 3 * MIB and p.kept_bytes == 2 * MIB


def test_max_bytes_deletes_oldest_until_within() -> None:
    runs = [run("new", 3600, 1.0), run("mid", 7200, 1.0), run("old", 9000, 1.0)]
    p = plan(runs, Policy(keep=100, max_bytes=int(2.5 * MIB)), NOW)
    assert deleted(p) == ["old"]
    assert "MiB >" in p.to_delete[0].reason
    assert plan(runs, Policy(keep=100, max_bytes=3 * MIB), NOW).to_delete == ()


def test_live_and_unknown_runs_survive_over_both_limits_and_still_count() -> None:
    runs = [
        run("new", 3600, 1.0),
        run("live", 7200, 50.0, live=("rank 0 pid 7 on h",)),
        run("remote", 8000, 1.0, unknown=("pid 9 on other",)),
        run("old", 9000, 1.0),
    ]
    p = plan(runs, Policy(keep=0, max_bytes=0), NOW)
    assert deleted(p) == ["old", "new"]
    why = {d.run.path: d.reason for d in p.kept}
    assert why["/base/live"].startswith("alive: rank 0 pid 7")
    assert why["/base/remote"].startswith("liveness unknown")
    # the live run's 50 MiB count towards the budget: the small dead runs go
    p2 = plan(runs, Policy(keep=100, max_bytes=10 * MIB), NOW)
    assert deleted(p2) == ["old", "new"]


def test_recent_runs_are_kept_by_age() -> None:
    runs = [run("fresh", 10.0, 5.0), run("old", 4000.0, 5.0)]
    p = plan(runs, Policy(keep=0, max_bytes=0, min_age_s=300.0), NOW)
    assert deleted(p) == ["old"]
    assert p.kept[0].reason.startswith("written 10 s ago")


def test_within_policy_deletes_nothing() -> None:
    runs = [run("a", 4000.0), run("b", 5000.0)]
    p = plan(runs, Policy(), NOW)
    assert p.to_delete == () and len(p.kept) == 2
    assert plan([], Policy(keep=0, max_bytes=0), NOW).decisions == ()
