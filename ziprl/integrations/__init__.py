"""Adapters that let other RL libraries train on ZipRL's env (these may import torch; the env layer never does)."""
