"""What runs inside traced processes: bootstrap, recorder, torch.distributed wrappers."""
