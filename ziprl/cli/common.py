"""What several commands parse the same way: config overrides from flags, and the arguments of a training run."""

from __future__ import annotations

import argparse


def overrides(flags: dict[str, object], sets: list[str]) -> list[str]:
    """``section.field=value`` overrides of the flags given (None: not given), then the ``--set`` ones."""
    return [f"{k}={v}" for k, v in flags.items() if v is not None] + sets


def add_run_arguments(ap: argparse.ArgumentParser) -> None:
    """The arguments ``train`` and ``launch`` share: config, steps, run directory, SFT checkpoint, overrides."""
    ap.add_argument("--config")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--out")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--overwrite", action="store_true", help="delete the run already in --out and start afresh")
    ap.add_argument("--sft-checkpoint")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")


def run_flags(args: argparse.Namespace) -> dict[str, object]:
    """The config fields :func:`add_run_arguments`'s flags set."""
    return {"learner.steps": args.steps, "run.out_dir": args.out, "run.sft_checkpoint": args.sft_checkpoint,
            "run.resume": True if args.resume else None}
