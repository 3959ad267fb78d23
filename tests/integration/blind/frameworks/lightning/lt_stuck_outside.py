"""Incident: each rank hands its metrics to a background "uploader" thread through a
queue and, every 10 steps, waits for the uploader's acknowledgement before it goes on
(`self.acks.get()`). On rank 1 the uploader thread died at its first upload (a KeyError
building the payload; the thread's traceback scrolls by in the log and nobody notices), so
at step 10 rank 1 blocks for ever in `queue.Queue.get()` inside the Callback's
`on_train_batch_end`, outside any collective, while rank 0 goes on into step 11 and waits in
DDP's gradient all-reduce (issued by DDP in C++ during backward).
Lightning, `python job.py`, 2 CPU ranks, gloo, DataLoader with 2 workers.
Expected: stuck-outside-collective, rank 1, at `ack = self.acks.get()` in
UploadCallback.on_train_batch_end.
"""
LAUNCH = "python"
NPROC = 2
EXPECT = {
    "kind": "stuck-outside-collective",
    "culprit_ranks": [1],
    "cause": "blocked",
    "where": "on_train_batch_end",
}

import os
import queue
import threading

from _lt_common import StepPrinter, TinyRegressor, make_trainer, pl


class UploadCallback(pl.Callback):
    def __init__(self):
        self.jobs = queue.Queue()
        self.acks = queue.Queue()
        self.thread = None

    def _uploader(self, rank):
        while True:
            step, loss = self.jobs.get()
            meta = {"step": step, "loss": loss}
            if rank == 1:
                meta = {"loss": loss}  # this rank's schema lost its "step" key
            payload = "%d:%f" % (meta["step"], meta["loss"])  # KeyError on rank 1: thread dies
            self.acks.put(payload)

    def on_train_start(self, trainer, pl_module):
        self.thread = threading.Thread(
            target=self._uploader, args=(trainer.global_rank,), daemon=True, name="uploader"
        )
        self.thread.start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step % 10 == 0:
            self.jobs.put((step, float(outputs["loss"])))
            ack = self.acks.get()  # rank 1 blocks here for ever at step 10
            print(f"rank {trainer.global_rank} uploaded {ack}", flush=True)


def main():
    trainer = make_trainer("lt_stuck_outside", callbacks=[StepPrinter(), UploadCallback()])
    trainer.fit(TinyRegressor())
    print(f"rank {trainer.global_rank} pid {os.getpid()} finished", flush=True)


if __name__ == "__main__":
    main()
