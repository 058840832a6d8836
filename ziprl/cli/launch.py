"""Train ZipRL on Ray, following the paper's Algorithm 1.

    python -m ziprl.launch [--num-rollout-actors N] [--config FILE.yaml] [--address auto] [--steps N]
                           [--out runs/launch] [--resume | --overwrite] [--sft-checkpoint DIR] [--set section.field=value ...]

Stage 1 (skipped when an SFT checkpoint is given): synthesise scripted-teacher demonstrations and
fine-tune the policy on them; cached by configuration, so a second run reuses it.
Stage 2: GRPO + HRR with rollout actors, a Ray Serve retriever and a DeepSpeed learner actor.
With no arguments it runs on the embedded defaults (SmolLM2-135M, the shipped sample) in minutes.
Ctrl-C checkpoints and shuts down cleanly; ``--resume`` continues from the newest checkpoint.
The library is :mod:`ziprl.actors.launch`.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from ziprl.boundary import run_command
from ziprl.cli.common import add_run_arguments, check_inputs, command_line, overrides, run_flags
from ziprl.config import load_config
from ziprl.loop.summary import config_arguments, run_arguments, summary_for
from ziprl.rundir import claim_run_dir, plan_run_dir


@run_command
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-rollout-actors", type=int)
    ap.add_argument("--address", help="'auto' joins a running cluster; default starts a local one")
    add_run_arguments(ap)
    args = ap.parse_args(argv)
    flags = {"ray.num_rollout_actors": args.num_rollout_actors, "ray.address": args.address} | run_flags(args)
    cfg = load_config(args.config, overrides(flags, args.set))
    plan = plan_run_dir(cfg.run.out_dir, cfg.run.resume, args.overwrite, steps=cfg.learner.steps)
    cfg.run.out_dir = str(plan.out)  # normalised: the directory checked is the one written
    check_inputs(cfg, plan.delete)
    with contextlib.ExitStack() as joined:
        if cfg.ray.address is not None:  # the cluster to join is an input too: found before --overwrite deletes a run
            from ziprl.actors.ray_utils import init_ray, signal_handlers_kept, stop_ray

            joined.enter_context(signal_handlers_kept())  # ray.init's SIGTERM handler goes with the cluster
            joined.callback(stop_ray, local=False)  # disconnected on every way out (launch disconnects too)
            init_ray(cfg.ray)
        with claim_run_dir(plan, command_line("ziprl.launch", argv or [])):  # the first write, once inputs are good
            from ziprl.actors.launch import launch  # Ray loads only once the arguments are good

            launch(cfg)  # a ConfigError found once Ray is up (GPUs, ranks it cannot place) exits 2 via run_command
    again = run_arguments(cfg.run.out_dir, {"--sft-checkpoint": args.sft_checkpoint, "--address": args.address,
                                            "--num-rollout-actors": args.num_rollout_actors})
    print(summary_for(cfg, "ziprl.launch", not cfg.run.sft_checkpoint, config_arguments(args.config, args.set), again))
    return 0


if __name__ == "__main__":
    sys.exit(main())
