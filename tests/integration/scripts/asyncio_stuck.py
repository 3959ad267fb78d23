"""A torchrun job (2 ranks, gloo) where rank 1 serves through an asyncio event loop that
never returns: its main task awaits a task 'fetch-weights' that waits on an Event nobody
sets, while rank 0 waits in an all_reduce for it."""

import argparse
import asyncio

import torch
import torch.distributed as dist


async def wait_for_weights(ready: asyncio.Event) -> None:
    await ready.wait()


async def fetch_weights(ready: asyncio.Event) -> None:
    await wait_for_weights(ready)


async def serve() -> None:
    ready = asyncio.Event()
    await asyncio.create_task(fetch_weights(ready), name="fetch-weights")


def main() -> None:
    argparse.ArgumentParser().parse_known_args()  # run_example adds --fault, --timeout-s
    dist.init_process_group("gloo")
    t = torch.ones(4)
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        asyncio.run(serve())
    dist.all_reduce(t)


if __name__ == "__main__":
    main()
