"""Cold-start demonstrations: the scripted teacher plays episodes through the real retriever.

    python -m ziprl.demos [--datasets hotpotqa,musique] [--limit 100] [--out runs/demos.parquet]
                          [--resume | --overwrite] [--config FILE.yaml] [--set section.field=value ...]

Only correct, well-formed trajectories are kept; the Parquet file holds one row per transition for
transition-level SFT (``python -m ziprl.sft``). See :mod:`ziprl.env.demos`. An existing ``--out`` is replaced
only with ``--overwrite``, and only when it is a demos file ZipRL wrote (see :mod:`ziprl.outputs`). SIGINT or
SIGTERM stops it at the end of the episode under way with its progress in ``<out>.partial`` (as it saves every
``demos.checkpoint_every`` questions); ``--resume`` continues from there, with the same questions and settings.
A second command on the same ``--out`` is refused while one runs (it holds ``.<name>.ziprl-lock`` beside it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ziprl.boundary import run_command
from ziprl.cli.common import overrides
from ziprl.config import load_config
from ziprl.env.demos import (
    DemoResumeError,
    build_demos,
    demo_examples,
    is_demos_file,
    is_partial_file,
    partial_path,
    remove_temps,
)
from ziprl.loop.stop import StopSignals
from ziprl.outputs import OutputError, check_file, hold


@run_command
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config")
    ap.add_argument("--datasets", help="comma-separated dataset names (sample, hotpotqa, musique, pooled, a path)")
    ap.add_argument("--limit", type=int, help="questions per dataset (0 = all)")
    ap.add_argument("--out")
    ap.add_argument("--resume", action="store_true",
                    help="continue the run that was writing --out from its progress (same questions and settings)")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace --out, or a stopped run's progress, when ZipRL wrote it")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    args = ap.parse_args(argv)
    flags = {"demos.datasets": args.datasets, "demos.limit": args.limit, "demos.out": args.out}
    if args.resume and args.overwrite:
        raise OutputError("--resume and --overwrite contradict each other: pass one (continue, or start again)")
    cfg = load_config(args.config, overrides(flags, args.set))
    out = check_out(cfg.demos.out, args)  # normalised, checked before any episode is played
    cfg.demos.out = str(out)
    examples = demo_examples(cfg)
    with hold(out):  # a second command on --out is refused until this one ends
        check_out(out, args)  # again: another command may have written it meanwhile
        for temp in remove_temps(out):
            print(f"[demos] removed {temp}, a temporary file a killed run left", flush=True)
        with StopSignals("demos") as stop:
            path, counts = build_demos(cfg, examples=examples, resume=args.resume, stop=stop.check)  # checks it first
    print(f"[demos] kept {counts['kept']}/{counts['episodes']} episodes ({counts['wrong']} wrong, "
          f"{counts['malformed']} malformed, {counts['no_supporting_titles']} without supporting titles); "
          f"{counts['transitions']} transitions -> {path}")
    return 0


def check_out(out: str | Path, args: argparse.Namespace) -> Path:
    """``out`` normalised, once the command may write it and its progress file (:func:`check_file`; a stopped run's
    progress only with ``--resume`` or ``--overwrite``)."""
    path = check_file(out, args.overwrite, is_demos_file, "a demos file ziprl.demos wrote", "demos.parquet")
    partial = check_file(partial_path(path), True, is_partial_file, "the progress file of a stopped ziprl.demos",
                         "demos.parquet")
    if partial.exists() and not (args.resume or args.overwrite):
        raise DemoResumeError(f"{partial} holds the progress of a stopped run writing {path}; pass --resume to "
                              "continue it, or --overwrite to start again")
    return path


if __name__ == "__main__":
    sys.exit(main())
