"""Incident: a TrainerCallback writes generated samples every 10 steps on the main process
only, and the user added `torch.distributed.barrier()` "so the other ranks wait until the
samples are written" - inside the `if state.is_world_process_zero:` block. Rank 1 never
calls it and goes on into step 11 (the Trainer's gather of the token count, DDP's gradient
all-reduce); rank 0 waits in a barrier rank 1 never issues.
transformers.Trainer, 2 CPU ranks, gloo, DataLoader with 2 workers; torchrun.
Expected: collective-mismatch (barrier vs the Trainer's all_gather at one sequence number)
or skipped-collective, naming rank 0, at `torch.distributed.barrier()` in
SampleWriter.on_step_end.
"""
LAUNCH = "torchrun"
LAUNCHERS = ["torchrun"]
NPROC = 2
EXPECT = {
    "kind": ["collective-mismatch", "skipped-collective"],
    "culprit_ranks": [0],
    "where": "on_step_end",
}

import os

import torch
import torch.distributed

from _hf_common import TrainerCallback, make_trainer


class SampleWriter(TrainerCallback):
    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % 10 == 0 and state.is_world_process_zero:
            with torch.no_grad():
                ids = model.module.generate if hasattr(model, "module") else model.generate
                out = ids(torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False, pad_token_id=0)
            with open(os.path.join(args.output_dir, "samples.txt"), "a") as f:
                f.write(f"step {state.global_step}: {out.tolist()}\n")
            torch.distributed.barrier()  # only rank 0 gets here


def main():
    trainer = make_trainer("hf_rank0_barrier", callbacks=[SampleWriter()])
    os.makedirs(trainer.args.output_dir, exist_ok=True)
    trainer.train()
    print(f"rank {trainer.args.process_index} pid {os.getpid()} finished", flush=True)


if __name__ == "__main__":
    main()
