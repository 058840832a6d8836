"""The learning gate's evidence: its margin over seeds and the mutations of the update path it catches.

    python benchmarks/learning_gate.py [--configs bandit,bandit_bf16,search] [--seeds 0,1,2,3,4]
                                       [--mutations all|none|NAME,...] [--mutation-seeds [CONFIG=]SEEDS ...]
                                       [--hrr-seeds 0,1,2,3,4] [--drift-seeds 0,1,2,3,4,5,6,7]
                                       [--set KEY=VALUE ...] [--hrr-set KEY=VALUE ...] [--name learning_gate]

Runs the configurations of ``tests/test_learning_gate.py`` (``ziprl/testing/learning_task.py``: the one-turn colour
bandit in float32 and with the bf16 learner, the three-turn search task as the default run trains it; cold-started
2-layer Llamas, ``ziprl.train``'s production update path) once per seed with the code as it is (``--set``: config
overrides after each configuration's own), then once per mutation and mutation seed (CI's seed, ``GATE_SEED``, unless
``--mutation-seeds`` names others, for every configuration or for one),
and writes the success rate per step, the start and end rates and the verdict of each run to
``benchmarks/results/<name>.{json,md}``. Then the HRR check (every reward 0; Q_com per step): w = 0 on the drift
seeds, whose leads over one another are what sampling alone moves; w = 0.2, w = -0.2 and shuffled per-turn scores on
the HRR seeds, each led against the same seed's w = 0 (``--hrr-set``: config overrides for all of them); to
``<name>_hrr.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from _common import at_least, listed, one_of, results_names, write_results  # noqa: E402

from ziprl.config.schema import SEED_MAX  # noqa: E402
from ziprl.testing.learning_task import (  # noqa: E402
    BF16,
    GATE_SEED,
    HRR_MIN_LEAD,
    HRR_RUNS,
    MUTATIONS,
    cold_start,
    hrr_cold_start,
    run_gate,
    run_hrr,
    run_search,
    search_cold_start,
    write_dataset,
    write_hrr_dataset,
    write_search_dataset,
)

CONFIGS = {"bandit": ("bandit", ()), "bandit_bf16": ("bandit", BF16), "search": ("search", ())}  # (task, overrides)


def seed(text: str) -> int:
    """An argparse ``type``: a seed, 0 to :data:`SEED_MAX`."""
    value = at_least(0)(text)
    if value > SEED_MAX:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: a seed is at most {SEED_MAX}")
    return value


def seeds(text: str) -> list[int]:
    """An argparse ``type``: comma-separated seeds; '' for none."""
    return [seed(s.strip()) for s in text.split(",") if s.strip()]


def mutations(text: str) -> list[str]:
    """An argparse ``type``: ``all``, ``none`` or comma-separated names of :data:`MUTATIONS`."""
    if text in ("all", "none"):
        return list(MUTATIONS) if text == "all" else []
    return listed(one_of(MUTATIONS))(text)


def mutation_seeds(text: str) -> tuple[str, list[int]]:
    """An argparse ``type``: ``[CONFIG=]SEEDS``: a configuration's name ('' for every one) and at least one seed."""
    name, _, values = text.rpartition("=")
    return (one_of(CONFIGS)(name) if name else ""), listed(seed)(values)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", type=listed(one_of(CONFIGS)), default=list(CONFIGS),
                    help="comma-separated configurations to run, of " + ", ".join(CONFIGS))
    ap.add_argument("--seeds", type=seeds, default=[0, 1, 2, 3, 4], help="seeds of the unmutated runs ('' for none)")
    ap.add_argument("--mutations", type=mutations, default=list(MUTATIONS),
                    help="all | none | comma-separated names of " + ", ".join(MUTATIONS))
    ap.add_argument("--mutation-seeds", type=mutation_seeds, action="append", default=[], metavar="[CONFIG=]SEEDS",
                    help=f"seeds of the mutation runs, of every configuration or of one (repeatable; default {GATE_SEED})")
    ap.add_argument("--hrr-seeds", type=seeds, default=[0, 1, 2, 3, 4], help="seeds of the HRR check ('' for none)")
    ap.add_argument("--drift-seeds", type=seeds, default=list(range(8)), help="w = 0 runs of the HRR check ('' for none)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for the gate's runs (repeatable; the HRR check keeps its own settings)")
    ap.add_argument("--hrr-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for the HRR check's runs, after its own settings (repeatable)")
    ap.add_argument("--name", type=results_names("", "_hrr"), default="learning_gate",
                    help="results name: <name> (the gate) and <name>_hrr (the HRR check)")
    args = ap.parse_args()
    from ziprl.config import ConfigError, ModelConfig, load_config
    from ziprl.policy.models import build_tiny_llama, resolve_model_path

    for flag, overrides in (("--set", args.set), ("--hrr-set", args.hrr_set)):
        try:
            load_config(None, overrides)
        except ConfigError as exc:
            ap.exit(2, f"error: {flag}: {exc}\n")

    configs, muts = list(dict.fromkeys(args.configs)), list(dict.fromkeys(args.mutations))
    if stray := sorted({name for name, _ in args.mutation_seeds if name and name not in configs}):
        ap.error(f"--mutation-seeds names {', '.join(stray)}, which --configs does not run; add it to --configs or "
                 "drop its --mutation-seeds")
    seeds_of = dict.fromkeys(configs, [GATE_SEED])
    for name, values in args.mutation_seeds:
        seeds_of.update(dict.fromkeys([name] if name else configs, values))
    runs = [(c, s, None) for c in configs for s in args.seeds]
    runs += [(c, s, m) for c in configs for m in muts for s in seeds_of[c]]
    if not runs and not (args.hrr_seeds or args.drift_seeds):
        ap.error("nothing to run: give --seeds, --mutations, --hrr-seeds or --drift-seeds")
    with tempfile.TemporaryDirectory(prefix="ziprl-gate-") as tmp:
        root = Path(tmp)
        base = build_tiny_llama(resolve_model_path(ModelConfig()), root / "base")
        if runs:
            rows = gate_rows(root, base, runs, args.set)
            write_results(args.name, rows, meta={"configs": configs, "seeds": args.seeds, "mutations": muts,
                                                 "mutation_seeds": seeds_of, "set": args.set})
        if args.hrr_seeds or args.drift_seeds:
            rows, meta = hrr_rows(root, base, args.hrr_seeds, args.drift_seeds, args.hrr_set)
            write_results(f"{args.name}_hrr", rows, meta=meta)


def gate_rows(root: Path, base: Path, runs: list[tuple[str, int, str | None]], overrides: list[str]) -> list[dict]:
    """One row per (configuration, seed, mutation) run; each task's Stage 1 built once."""
    tasks = {task for task, _ in (CONFIGS[c] for c, _, _ in runs)}
    stage1 = {}
    for task, (write, start) in {"bandit": (write_dataset, cold_start),
                                 "search": (write_search_dataset, search_cold_start)}.items():
        if task in tasks:
            (root / task).mkdir()
            dataset = write(root / task / "questions.jsonl")
            stage1[task] = (start(base, dataset, root / task / "stage1"), dataset)
    rows = []
    for k, (config, seed, mutation) in enumerate(runs):
        task, extra = CONFIGS[config]
        run = run_gate if task == "bandit" else run_search
        t0 = time.perf_counter()
        try:
            r = run(*stage1[task], root / f"run{k}", seed, mutation, extra=[*extra, *overrides])
        except Exception as exc:  # a mutation the system itself refuses fails the gate too
            r = {"seed": seed, "mutation": mutation or "none", "rates": [], "start": float("nan"),
                 "end": float("nan"), "onpolicy_gap": float("nan"), "passed": False,
                 "error": f"{type(exc).__name__}: {exc}"}
        r = {"config": config, **r, "seconds": time.perf_counter() - t0}
        r["rates"] = " ".join(f"{x:.2f}" for x in r["rates"])
        print(f"[gate] {k + 1}/{len(runs)} {config} seed {seed} mutation {r['mutation']}: start {r['start']:.3f} "
              f"end {r['end']:.3f} gap {r['onpolicy_gap']:.2g} passed {r['passed']} ({r['seconds']:.0f} s)", flush=True)
        rows.append(r)
    return rows


def hrr_rows(root: Path, base: Path, seeds: list[int], drift_seeds: list[int],
             overrides: list[str] | None = None) -> tuple[list[dict], dict]:
    """The HRR check's runs from one Stage 1, every reward 0, each with its lead over the same seed's w = 0 run; a
    w = 0 run's ``drift``: the largest |its last 8 steps' mean - another w = 0 run's mean|, the lead sampling alone
    gives a policy that never moves."""
    (root / "hrr").mkdir()
    dataset = write_hrr_dataset(root / "hrr" / "questions.jsonl")
    stage1 = hrr_cold_start(base, dataset, root / "hrr" / "stage1")
    todo = [(s, "w=0", 0.0, None) for s in sorted(set(seeds) | set(drift_seeds))]
    todo += [(s, name, w, m) for s in seeds for name, w, m in HRR_RUNS if name != "w=0"]
    runs = {}
    for seed, name, w, mutation in todo:
        runs[seed, name] = run_hrr(stage1, dataset, root / "hrr" / f"{name}_seed{seed}", seed, w, mutation,
                                   extra=overrides or [])
        print(f"[hrr] seed {seed} {name}: Q_com {runs[seed, name]['start']:.3f} -> {runs[seed, name]['end']:.3f}",
              flush=True)
    base_mean = {s: runs[s, "w=0"]["mean"] for s in sorted(set(seeds) | set(drift_seeds))}
    rows = []
    for (seed, name), r in runs.items():
        row = {"seed": seed, "run": name, "q_com": " ".join(f"{x:.2f}" for x in r["q_com"]), "start": r["start"],
               "end": r["end"], "mean": r["mean"], "lead": r["end"] - base_mean[seed], "rewards": sum(r["rewards"]),
               "max_grad_norm": r["max_grad_norm"], "hrr_abs_mean": r["hrr_abs_mean"]}
        if name == "w=0":
            row["drift"] = max(abs(r["end"] - m) for m in base_mean.values())
        rows.append(row)
    drift = max((row["drift"] for row in rows if "drift" in row), default=float("nan"))
    meta = {"seeds": seeds, "drift_seeds": drift_seeds, "set": overrides or [], "max_drift": drift,
            "min_lead": HRR_MIN_LEAD,
            "margin": HRR_MIN_LEAD / drift if drift else float("nan")}
    print(f"[hrr] largest w = 0 drift {drift:.3f}; the check's bar {HRR_MIN_LEAD} is {meta['margin']:.2f}x it")
    return rows, meta


if __name__ == "__main__":
    main()
