"""Cold-start SFT on scripted-teacher demonstrations (Algorithm 1, Stage 1; see :mod:`ziprl.learner.sft`).

    python -m ziprl.sft --demos FILE --out DIR [--overwrite] [--config FILE.yaml] [--set section.field=value ...]

Trains ``sft.epochs`` epochs, logs TensorBoard scalars to ``DIR/tb`` and writes the model to ``DIR/model``. ``DIR``
is new, or an SFT run of an earlier ``ziprl.sft`` that ``--overwrite`` replaces (see :mod:`ziprl.outputs`).
"""

from __future__ import annotations

import argparse
import logging

from ziprl.boundary import run_command
from ziprl.cli.common import command_line
from ziprl.config import load_config
from ziprl.learner.sft import is_sft_entry, read_demos, run_sft
from ziprl.outputs import claim_dir, plan_dir
from ziprl.policy.models import check_model_paths


@run_command
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ziprl.sft", description="Cold-start SFT on demo transitions.")
    parser.add_argument("--demos", required=True, help="demo Parquet file (columns: messages, response)")
    parser.add_argument("--out", required=True, help="run directory: writes <out>/model and <out>/tb")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the SFT run in --out (only a directory an earlier ziprl.sft marked as its own)")
    parser.add_argument("--config", default=None, help="YAML config file")
    parser.add_argument("--set", action="append", default=[], metavar="section.field=value", help="config override")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    cfg = load_config(args.config, args.set)
    plan = plan_dir(args.out, "sft", args.overwrite, is_sft_entry)
    read_demos(args.demos)  # every input is checked before the first write
    check_model_paths(cfg.model.path)
    with claim_dir(plan, command_line("ziprl.sft", argv or [])) as out:
        print(run_sft(cfg, args.demos, out))


if __name__ == "__main__":
    raise SystemExit(main())
