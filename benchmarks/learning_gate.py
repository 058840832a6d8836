"""The learning gate's evidence: its margin over seeds and the mutations of the update path it catches.

    python benchmarks/learning_gate.py [--seeds 0,1,2,3,4,5,6,7] [--mutations all|none|NAME,...] [--hrr-seeds 0,1,2]
                                       [--set KEY=VALUE ...] [--name learning_gate]

Runs the task of ``tests/test_learning_gate.py`` (``tests/learning_task.py``: a one-turn colour bandit through the
real env, a 2-layer random Llama cold-started on the four answers, ``ziprl.train``'s production update path) once
per seed with the code as it is (``--set``: config overrides after the gate's own, e.g. ``learner.bf16=true``), then once per mutation (CI's seed, ``GATE_SEED``), and writes the rewards per step, the start and
end rates and the verdict of each run to ``benchmarks/results/<name>.{json,md}``. Then the HRR check (every
reward 0, w = 0.2 against w = 0 on the same seeds, Q_com per step) to ``<name>_hrr.{json,md}``.
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

from _common import write_results  # noqa: E402

from tests.learning_task import (  # noqa: E402
    GATE_SEED,
    MUTATIONS,
    cold_start,
    hrr_cold_start,
    run_gate,
    run_hrr,
    write_dataset,
    write_hrr_dataset,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2,3,4,5,6,7")
    ap.add_argument("--mutations", default="all", help="all | none | comma-separated names of " + ", ".join(MUTATIONS))
    ap.add_argument("--hrr-seeds", default="0,1,2")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for the gate's runs (repeatable; the HRR check keeps its own settings)")
    ap.add_argument("--name", default="learning_gate")
    args = ap.parse_args()
    from ziprl.config import ModelConfig
    from ziprl.policy.models import build_tiny_llama, resolve_model_path

    seeds = [int(s) for s in args.seeds.split(",") if s]
    muts = list(MUTATIONS) if args.mutations == "all" else [] if args.mutations == "none" else args.mutations.split(",")
    runs = [(s, None) for s in seeds] + [(GATE_SEED, m) for m in muts]
    rows = []
    with tempfile.TemporaryDirectory(prefix="ziprl-gate-") as tmp:
        root = Path(tmp)
        (root / "hrr").mkdir()
        dataset = write_dataset(root / "questions.jsonl")
        stage1 = cold_start(build_tiny_llama(resolve_model_path(ModelConfig()), root / "base"), dataset, root / "stage1")
        for k, (seed, mutation) in enumerate(runs):
            t0 = time.perf_counter()
            try:
                r = run_gate(stage1, dataset, root / f"run{k}", seed, mutation, extra=args.set)
            except Exception as exc:  # a mutation the system itself refuses fails the gate too
                r = {"seed": seed, "mutation": mutation, "rewards": [], "start": float("nan"), "end": float("nan"),
                     "max_onpolicy_gap": float("nan"), "passed": False, "error": f"{type(exc).__name__}: {exc}"}
            r["seconds"] = time.perf_counter() - t0
            r["rewards"] = " ".join(f"{x:.2f}" for x in r["rewards"])
            print(f"[gate] {k + 1}/{len(runs)} seed {seed} mutation {r['mutation']}: start {r['start']:.3f} "
                  f"end {r['end']:.3f} gap {r['max_onpolicy_gap']:.2g} passed {r['passed']} ({r['seconds']:.0f} s)",
                  flush=True)
            rows.append(r)
        if rows:
            write_results(args.name, rows, meta={"seeds": seeds, "mutations": muts, "set": args.set})
        hrr_seeds = [int(s) for s in args.hrr_seeds.split(",") if s]
        if hrr_seeds:
            write_results(f"{args.name}_hrr", hrr_rows(root, hrr_seeds), meta={"seeds": hrr_seeds})


def hrr_rows(root: Path, seeds: list[int]) -> list[dict]:
    """The HRR check per seed: w = 0.2 and w = 0 from one Stage 1, every reward 0."""
    dataset = write_hrr_dataset(root / "hrr" / "questions.jsonl")
    stage1 = hrr_cold_start(root / "base", dataset, root / "hrr" / "stage1")
    rows = []
    for seed in seeds:
        for w in (0.2, 0.0):
            r = run_hrr(stage1, dataset, root / "hrr" / f"w{w}_seed{seed}", seed, w)
            r["q_com"] = " ".join(f"{x:.2f}" for x in r["q_com"])
            r["rewards"] = sum(r["rewards"])
            print(f"[hrr] seed {seed} w {w}: Q_com {r['start']:.3f} -> {r['end']:.3f}", flush=True)
            rows.append(r)
    return rows


if __name__ == "__main__":
    main()
