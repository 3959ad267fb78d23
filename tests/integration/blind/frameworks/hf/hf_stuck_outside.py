"""Incident: a TrainerCallback builds a small held-out "probe" batch in a background thread
(a tokenisation/cache step the user moved off the training loop) and, at step 10, waits for
it with `self.probe_ready.wait()` before running a quick probe forward. On rank 1 the
builder thread died of an exception (a bad record in that rank's shard: ValueError), so the
Event is never set and rank 1 blocks for ever in `Event.wait()` inside `on_step_end`,
outside any collective, while rank 0 goes on into step 11 (the Trainer's per-step gather of
the token count, then DDP's gradient all-reduce) and waits for rank 1 there.
transformers.Trainer, 2 CPU ranks, gloo, DataLoader with 2 workers; torchrun and
`accelerate launch`.
Expected: stuck-outside-collective, rank 1, at `self.probe_ready.wait()` in
ProbeCallback.on_step_end.
"""
LAUNCH = "torchrun"
LAUNCHERS = ["torchrun", "accelerate"]
NPROC = 2
EXPECT = {
    "kind": "stuck-outside-collective",
    "culprit_ranks": [1],
    "cause": "blocked",
    "where": "on_step_end",
}

import os
import threading

import torch

from _hf_common import TrainerCallback, make_trainer


class ProbeCallback(TrainerCallback):
    def __init__(self):
        self.probe_ready = threading.Event()
        self.probe = None

    def _build_probe(self, rank):
        records = ["12 40 7 99", "5 6 7 8", "3 3 x 3" if rank == 1 else "3 3 3 3"]
        self.probe = torch.tensor([[int(t) for t in r.split()] for r in records])  # ValueError on rank 1
        self.probe_ready.set()

    def on_train_begin(self, args, state, control, **kwargs):
        threading.Thread(
            target=self._build_probe, args=(args.process_index,), daemon=True, name="probe-builder"
        ).start()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == 10:
            self.probe_ready.wait()  # rank 1 waits here for ever
            with torch.no_grad():
                out = model(input_ids=self.probe)
            print(f"rank {args.process_index} probe logits {tuple(out.logits.shape)}", flush=True)


def main():
    trainer = make_trainer("hf_stuck_outside", callbacks=[ProbeCallback()])
    trainer.train()
    print(f"rank {trainer.args.process_index} pid {os.getpid()} finished", flush=True)


if __name__ == "__main__":
    main()
