"""Shared set-up of the blind plain-Accelerate jobs (not a job: no EXPECT): a small MLP
classifier on synthetic features, a dataset "cached" to disk by the main process first
(`accelerator.main_process_first()`), a DataLoader with 2 workers. Each job writes its own
training loop (`Accelerator(cpu=True)`, `accelerator.prepare`, `accelerator.backward`, a
`gather` of the loss every 5 steps, `wait_for_everyone()` at the end), started by
``accelerate launch --multi_gpu --num_processes 2 job.py``."""

import os
import tempfile

import torch
from torch.utils.data import DataLoader, TensorDataset


def build_dataset(accelerator, name, n=2048, dim=32, classes=4):
    """The main process builds and caches the features; the others load the cache."""
    path = os.path.join(tempfile.gettempdir(), "ht-blind-acc", name, "features.pt")
    with accelerator.main_process_first():
        if accelerator.is_main_process:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            g = torch.Generator().manual_seed(0)
            x = torch.randn(n, dim, generator=g)
            y = (x[:, :classes].argmax(dim=1)).long()
            torch.save({"x": x, "y": y}, path)
        data = torch.load(path)
    return TensorDataset(data["x"], data["y"])


def make_model(dim=32, classes=4):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(dim, 128), torch.nn.ReLU(), torch.nn.Linear(128, classes))


def make_loader(ds):
    return DataLoader(ds, batch_size=16, shuffle=True, num_workers=2, persistent_workers=True)
