"""Evaluate a policy in SearchCompressEnv the way the paper reports it.

    python -m ziprl.eval [--dataset sample|pooled|hotpotqa|musique|squad|PATH] [--strategy adaptive,react,...]
                         [--model PATH] [--max-turns 20] [--top-k 5] [--limit 20] [--samples 1] [--seed 0]
                         [--out runs/eval] [--resume | --overwrite] [--noise 0,0.25,0.5,0.75,1.0]
                         [--config FILE.yaml] [--set section.field=value ...]

Writes ``report.json``, ``report.md``, ``tokens_per_turn.png``, ``levels.png`` and one trajectory Parquet file
per strategy under ``--out``: a new directory, or one an earlier eval wrote, which ``--overwrite`` replaces (see
:mod:`ziprl.outputs`). With ``--noise`` it runs the noisy-retrieval sweep instead (see
:mod:`ziprl.evaluation.noise`); the library is :mod:`ziprl.evaluation`. Results are written after every strategy
(every sweep cell): ``--resume`` continues a stopped evaluation with the same settings, rolling out only what it
lacks.
"""

from __future__ import annotations

import argparse
import sys

from ziprl.boundary import run_command
from ziprl.cli.common import check_inputs, command_line, overrides
from ziprl.config import ConfigError, load_config
from ziprl.evaluation.harness import evaluate, is_eval_entry, saved_results
from ziprl.evaluation.noise import noise_sweep, parse_noise_levels
from ziprl.outputs import claim_dir, plan_dir
from ziprl.registry import STRATEGIES


@run_command
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config")
    ap.add_argument("--dataset")
    ap.add_argument("--strategy", default="adaptive", help="comma-separated: " + ",".join(STRATEGIES) + " or 'all'")
    ap.add_argument("--model")
    ap.add_argument("--max-turns", type=int)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--limit", type=int)
    ap.add_argument("--samples", type=int, help="trajectories per question")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--out", default="runs/eval")
    ap.add_argument("--resume", action="store_true",
                    help="continue the stopped evaluation in --out (same settings): only what it lacks is rolled out")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace the reports in --out (only a directory an earlier eval marked as its own)")
    ap.add_argument("--noise", help="comma-separated retrieval-noise levels, e.g. 0,0.25,0.5,0.75,1.0: run the sweep")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    args = ap.parse_args(argv)
    flags = {"data.dataset": args.dataset, "model.path": args.model, "env.max_turns": args.max_turns,
             "env.top_k": args.top_k, "data.limit": args.limit, "rollout.group_size": args.samples,
             "data.seed": args.seed, "sampling.greedy": True if args.greedy else None}
    strategies = list(STRATEGIES) if args.strategy == "all" else [s.strip() for s in args.strategy.split(",")]
    bad = [s for s in strategies if s not in STRATEGIES]
    if bad:
        raise ConfigError(f"unknown strategy {bad}; choose from {STRATEGIES} or 'all'")
    cfg = load_config(args.config, overrides(flags, args.set))
    plan = plan_dir(args.out, "eval", args.overwrite, is_eval_entry, resume=args.resume)
    levels = parse_noise_levels(args.noise) if args.noise is not None else None
    if args.resume:  # the settings it ran with, before any model loads
        saved_results(plan.out / ("report.json" if levels is None else "noise.json"), cfg)
    check_inputs(cfg, plan.delete)  # model, dataset, corpus, index: every input before the first write
    with claim_dir(plan, command_line("ziprl.eval", argv or [])) as out:
        if levels is not None:
            noise_sweep(cfg, strategies, levels, out, resume=args.resume)
            print(f"[eval] noise sweep: {out / 'noise.md'}")
        else:
            evaluate(cfg, strategies, out, resume=args.resume)
            print(f"[eval] report: {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
