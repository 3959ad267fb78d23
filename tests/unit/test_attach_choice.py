"""`hangtrace attach` without --pid: which job it picks, and the line that says so
(collect/attach.choose_job; the real processes: tests/integration/test_attach.py)."""

from hangtrace.tracer.collect.attach import choose_job


def proc(pid, port, start, uid=0, rank=0, sid=None, run_id=""):
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)} if port else {}
    if run_id:
        env["TORCHELASTIC_RUN_ID"] = run_id
    return {
        "pid": pid,
        "rank": rank,
        "start_time": start,
        "uid": uid,
        "sid": sid,
        "env": env,
        "cmdline": ["python", "train.py", "--job", str(port)],
    }


def test_newest_own_job_is_chosen_and_named_with_the_reason():
    found = [
        proc(10, 1, 100.0),
        proc(11, 1, 100.5, rank=1),
        proc(20, 2, 200.0),
        proc(21, 2, 200.1, rank=1),
        proc(30, 3, 300.0, uid=1000),
    ]  # another user's job, the newest of all
    chosen, line, notes = choose_job(found, uid=0)
    assert [d["pid"] for d in chosen] == [20, 21]
    assert line.startswith("attaching to pid 20 (rank 0), pid 21 (rank 1): python train.py --job 2 (started ")
    assert "the newest of 2 torch.distributed jobs owned by uid 0; 1 job of other users left out" in line
    assert "pass --pid to choose another" in line
    assert len(notes) == 2 and any("pid 10 (rank 0), pid 11 (rank 1)" in n for n in notes)
    assert any("pid 30" in n for n in notes)


def test_only_own_job_and_other_users_jobs():
    chosen, line, notes = choose_job([proc(10, 1, 100.0)], uid=0)
    assert [d["pid"] for d in chosen] == [10] and notes == []
    assert "the only torch.distributed job owned by uid 0" in line and "--pid" not in line
    chosen, line, _ = choose_job([proc(10, 1, 100.0, uid=7), proc(20, 2, 50.0, uid=8)], uid=0)
    assert [d["pid"] for d in chosen] == [10]
    assert "no torch.distributed job is owned by uid 0; the newest of 2 jobs found (uid 7)" in line


def test_jobs_without_rendezvous_variables_are_told_apart_by_session():
    found = [
        proc(10, None, 100.0, sid=10),
        proc(20, None, 200.0, sid=20),
        proc(21, None, 150.0, sid=20, rank=1),
    ]
    chosen, line, notes = choose_job(found, uid=0)
    assert sorted(d["pid"] for d in chosen) == [20, 21] and len(notes) == 1
    # a restarted rank makes its job the newest (torchrun restarts)
    found = [proc(10, 1, 100.0, run_id="a"), proc(11, 1, 400.0, rank=1, run_id="a"), proc(20, 2, 200.0)]
    assert [d["pid"] for d in choose_job(found, uid=0)[0]] == [10, 11]
