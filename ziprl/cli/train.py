"""Single-process ZipRL training (no Ray): the training loop with this process's engine as the rollout source.

    python -m ziprl.train [--config FILE.yaml] [--steps N] [--out runs/train] [--resume | --overwrite]
                          [--sft-checkpoint DIR] [--set section.field=value ...]

For debugging and small runs (the library is :mod:`ziprl.loop.in_process`); ``python -m ziprl.launch`` runs
the same loop (``ziprl.loop.training``) with Ray rollout actors. Stage 2 only: it trains from ``--sft-checkpoint``
(``run.sft_checkpoint``) or else the base model; it never runs Stage 1 (``launch`` does). The run's configuration
goes to ``config.json``; each step writes its trajectories (Parquet), TensorBoard scalars and, every
``run.checkpoint_every`` steps (and on SIGINT or SIGTERM, which stop it), a checkpoint that ``--resume`` continues
from exactly.
"""

from __future__ import annotations

import argparse
import sys

from ziprl.boundary import run_command
from ziprl.cli.common import add_run_arguments, check_inputs, command_line, overrides, run_flags
from ziprl.config import load_config
from ziprl.loop.in_process import train
from ziprl.loop.summary import config_arguments, run_arguments, summary_for
from ziprl.rundir import claim_run_dir, plan_run_dir, write_config


@run_command
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(ap)
    args = ap.parse_args(argv)
    cfg = load_config(args.config, overrides(run_flags(args), args.set))
    plan = plan_run_dir(cfg.run.out_dir, cfg.run.resume, args.overwrite, steps=cfg.learner.steps)
    cfg.run.out_dir = str(plan.out)  # normalised: the directory checked is the one written
    check_inputs(cfg, plan.delete)
    with claim_run_dir(plan, command_line("ziprl.train", argv or [])):  # the first write, once every input is good
        write_config(cfg.run.out_dir, cfg.to_dict())
        train(cfg)
    again = run_arguments(cfg.run.out_dir, {"--sft-checkpoint": args.sft_checkpoint})
    print(summary_for(cfg, "ziprl.train", False, config_arguments(args.config, args.set), again))
    return 0


if __name__ == "__main__":
    sys.exit(main())
