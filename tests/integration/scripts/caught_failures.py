"""Failures that launchers and frameworks swallow: torch.multiprocessing.spawn, plain
multiprocessing (fork and spawn), and an asyncio task nobody awaits. argv[1] picks one."""

import sys
import asyncio
import multiprocessing as mp


def work(i):
    if i == 1:
        raise ValueError("bad batch shape %d" % i)


def mpwork():
    raise KeyError("missing key")


async def bad():
    raise RuntimeError("tokenizer server returned 503")


async def amain():
    t = asyncio.create_task(bad())  # noqa: F841 (kept alive: its exception is never printed)
    await asyncio.sleep(0.2)


if __name__ == "__main__":
    which = sys.argv[1]
    if which == "spawn":
        import torch.multiprocessing as tmp

        try:
            tmp.spawn(work, nprocs=2)
        except Exception as e:
            print("parent saw", type(e).__name__)
    elif which in ("fork", "spawnmp"):
        ctx = mp.get_context("fork" if which == "fork" else "spawn")
        p = ctx.Process(target=mpwork)
        p.start()
        p.join()
        print("exitcode", p.exitcode)
    else:
        asyncio.run(amain())
