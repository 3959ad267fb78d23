"""Evaluation tool: loads a 'checkpoint' (here: re-creates data), computes
per-sample metrics, prints a report to stdout."""
import argparse
import sys

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--step", type=int, required=True)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--per-sample", action="store_true")
    args = ap.parse_args()

    g = torch.Generator().manual_seed(args.step)
    x = torch.randn(args.samples, 16, generator=g)
    w = torch.randn(16, 1, generator=g)
    pred = x @ w
    target = x.sum(dim=1, keepdim=True)
    err = (pred - target).abs().squeeze(1)

    print(f"eval report step {args.step}: {args.samples} samples")
    if args.per_sample:
        for i in range(args.samples):
            row = " ".join(f"{v:+.5f}" for v in x[i].tolist())
            print(f"sample {i:06d} err={err[i].item():.6f} pred={pred[i].item():+.6f} "
                  f"target={target[i].item():+.6f} feats=[{row}]")
    print(f"mean_abs_err={err.mean().item():.6f} max_abs_err={err.max().item():.6f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
