"""A torchrun job whose failing rank's exception reaches torchelastic's error file
(``@record``): ``--mode self``: rank 1's main raises; ``--mode child``: rank 1 forks a
``@record``-decorated child (inheriting TORCHELASTIC_ERROR_FILE) that raises, then exits 3
without an exception of its own (fork: the death is within a second of rank 0's wait). Rank 0 waits in an all_reduce until torchrun stops it."""

import argparse
import time

from torch.distributed.elastic.multiprocessing.errors import record


@record
def child() -> None:
    raise ValueError("bad shard 7: expected 128 rows, got 0")


@record
def main() -> None:
    import os
    import torch
    import torch.distributed as dist

    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="self")
    a, _ = ap.parse_known_args()  # run_example adds --fault, --timeout-s
    dist.init_process_group("gloo")
    t = torch.ones(4)
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        if a.mode == "self":
            raise KeyError("tokenizer vocab 'pad' missing")
        import multiprocessing

        c = multiprocessing.get_context("fork").Process(target=child)
        c.start()
        c.join()
        print("child exited with", c.exitcode, flush=True)
        os._exit(3)
    dist.all_reduce(t)
    time.sleep(60)


if __name__ == "__main__":
    main()
