"""Shared set-up of the blind Hugging Face jobs (not a job: no EXPECT). A tiny GPT-2 built
from a config with random weights (nothing is downloaded), synthetic token ids, and the
TrainingArguments a CPU user writes: ``use_cpu=True, ddp_backend="gloo"``, 2 DataLoader
workers, 40 steps, a log line every 5 steps. Started by ``torchrun --nproc-per-node 2 job.py``
or ``accelerate launch --multi_gpu --num_processes 2 job.py`` (accelerate 1.16:
``--cpu --num_processes 2`` starts a single process, so the CPU job needs ``--multi_gpu``;
``use_cpu=True`` keeps it on the CPU)."""

import os
import tempfile

import torch
from torch.utils.data import Dataset

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments  # noqa: E402


class SyntheticTokens(Dataset):
    def __init__(self, n=1024, seq_len=32, vocab=256):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq_len), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def tiny_gpt2():
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64)
    return GPT2LMHeadModel(cfg)


def make_args(name, max_steps=40, **kw):
    out = os.path.join(tempfile.gettempdir(), "ht-blind-hf", name)
    base = dict(
        output_dir=out,
        use_cpu=True,
        ddp_backend="gloo",
        max_steps=max_steps,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=5,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=2,
        dataloader_persistent_workers=True,
    )
    base.update(kw)
    return TrainingArguments(**base)


class StepPrinter(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % 5 == 0:
            print(f"rank {args.process_index} pid {os.getpid()} step {state.global_step}", flush=True)


def make_trainer(name, callbacks=(), trainer_cls=Trainer, **kw):
    return trainer_cls(
        model=tiny_gpt2(),
        args=make_args(name, **kw),
        train_dataset=SyntheticTokens(),
        callbacks=[StepPrinter()] + list(callbacks),
    )
