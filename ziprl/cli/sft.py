"""Cold-start SFT on scripted-teacher demonstrations (Algorithm 1, Stage 1; see :mod:`ziprl.learner.sft`).

    python -m ziprl.sft --demos FILE --out DIR [--resume | --overwrite] [--config FILE.yaml]
                        [--set section.field=value ...]

Trains ``sft.epochs`` epochs, logs TensorBoard scalars to ``DIR/tb`` and writes the model to ``DIR/model``. ``DIR``
is new, or an SFT run of an earlier ``ziprl.sft`` that ``--overwrite`` replaces (see :mod:`ziprl.rundir`). SIGINT
or SIGTERM stops it at the end of the optimiser step with a checkpoint in ``DIR/checkpoints`` (as it writes one every
``sft.checkpoint_every`` steps), which ``--resume`` continues from exactly, with the same demos and settings.
"""

from __future__ import annotations

import argparse
import logging

from ziprl.boundary import run_command
from ziprl.cli.common import command_line
from ziprl.config import load_config
from ziprl.learner.sft import check_sft_resume, fitting_rows, is_sft_entry, read_demos, run_sft, sft_order
from ziprl.loop.stop import StopSignals
from ziprl.outputs import refuse_inputs_inside
from ziprl.policy.models import check_model_paths, resolve_model_path
from ziprl.rundir import claim_run_dir, plan_run_dir


@run_command
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ziprl.sft", description="Cold-start SFT on demo transitions.")
    parser.add_argument("--demos", required=True, help="demo Parquet file (columns: messages, response)")
    parser.add_argument("--out", required=True, help="run directory: writes <out>/model and <out>/tb")
    parser.add_argument("--resume", action="store_true",
                        help="continue the SFT run in --out from its checkpoint (same demos and settings)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the SFT run in --out (only a directory an earlier ziprl.sft marked as its own)")
    parser.add_argument("--config", default=None, help="YAML config file")
    parser.add_argument("--set", action="append", default=[], metavar="section.field=value", help="config override")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    cfg = load_config(args.config, args.set)
    plan = plan_run_dir(args.out, args.resume, args.overwrite, "sft", is_sft_entry)
    refuse_inputs_inside(plan.delete, (args.demos, cfg.model.path))  # every input is checked before the first write
    examples = read_demos(args.demos)
    check_model_paths(cfg.model.path)
    # some transition fits sft.max_seq_len (tokenizing the demos takes seconds, no model loads)
    rows = fitting_rows(cfg, examples, resolve_model_path(cfg.model), args.demos)
    if args.resume:  # the checkpoint is of these demos and settings
        check_sft_resume(plan.out, sft_order(cfg, rows))
    with claim_run_dir(plan, command_line("ziprl.sft", argv or [])), StopSignals("sft") as stop:
        print(run_sft(cfg, args.demos, plan.out, resume=args.resume, stop=stop.check, rows=rows))


if __name__ == "__main__":
    raise SystemExit(main())
