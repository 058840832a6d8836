"""Cold-start SFT on scripted-teacher demonstrations (Algorithm 1, Stage 1; see :mod:`ziprl.learner.sft`).

    python -m ziprl.sft --demos FILE --out DIR [--config FILE.yaml] [--set section.field=value ...]

Trains ``sft.epochs`` epochs, logs TensorBoard scalars to ``DIR/tb`` and writes the model to ``DIR/model``.
"""

from __future__ import annotations

import argparse
import logging

from ziprl.boundary import run_command
from ziprl.config import load_config
from ziprl.learner.sft import run_sft


@run_command
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ziprl.sft", description="Cold-start SFT on demo transitions.")
    parser.add_argument("--demos", required=True, help="demo Parquet file (columns: messages, response)")
    parser.add_argument("--out", required=True, help="run directory: writes <out>/model and <out>/tb")
    parser.add_argument("--config", default=None, help="YAML config file")
    parser.add_argument("--set", action="append", default=[], metavar="section.field=value", help="config override")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    cfg = load_config(args.config, args.set)
    print(run_sft(cfg, args.demos, args.out))


if __name__ == "__main__":
    raise SystemExit(main())
