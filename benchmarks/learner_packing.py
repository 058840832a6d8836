"""The learner's micro-batches padded, packed, or packed as a prefix tree (``learner.pack_rows``), timed in one run on
recorded training steps.

    python benchmarks/learner_packing.py --trajectories RUN/trajectories/step_000001.parquet [more.parquet ...]
                                         [--config configs/learn-invented.yaml] [--model DIR] [--groups N]
                                         [--reps 3] [--name learner_packing]

Each ``--trajectories`` file is one step's groups as ``ziprl.train`` recorded them (token ids, behaviour log-probs,
rewards, Q_com); ``--groups N`` keeps each file's first N groups (a CPU's float32 step over all of them takes
minutes). One :class:`~ziprl.learner.trainer.Trainer` (``--config``'s learner settings, from ``--model``:
default the embedded model) trains on them ``--reps`` times in each layout, the layouts rotating so that load drift
falls on all: ``padded`` (every row of a micro-batch padded to its longest), ``packed`` (micro-batches packed where
:func:`~ziprl.learner.packing.packing_pays`, each row's own tokens after the micro-batch's prefix) and ``tree`` (the
default on a CPU: packed, the prompt tokens a row shares with an earlier row run once). The first step of each layout
warms up. Per step file and layout the table gives the rows, micro-batches (packed ones), the tokens the linear
layers compute (padding included), the median learner step and its range, and the padded / layout speedup.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import at_least, model_dir, portable, results_name, write_results  # noqa: E402

from ziprl.boundary import UserError, one_line  # noqa: E402
from ziprl.config import load_config  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


LAYOUTS = {"padded": (False, False), "packed": (True, False), "tree": (True, True)}  # (pack, share rows)


def linear_tokens(batches) -> int:
    """Tokens a step's forward runs through the linear layers: per micro-batch its prefix once (a step prefix is
    counted per micro-batch, an upper bound), then its rows' other tokens: padded to the longest, or packed
    (:func:`~ziprl.learner.batch.computed_tokens`)."""
    from ziprl.learner.batch import computed_tokens

    total = 0
    for mb, _ in batches:
        own = [n - mb.prefix_len for n in mb.response_ends]
        total += computed_tokens(mb) if mb.packed else mb.prefix_len + len(own) * max(own)
    return total


def measure(path: Path, trainer, groups_kept: int, reps: int) -> list[dict]:
    from ziprl.env.group import Group
    from ziprl.env.trajectory import load_trajectories

    by_group = defaultdict(list)
    for traj in load_trajectories(path):
        by_group[traj.group_id].append(traj)
    groups = [Group(tuple(t)) for t in by_group.values()][: groups_kept or None]
    plan, planned = trainer.micro_batches, []

    def recorded(*args, **kwargs):  # the micro-batches each step runs, as it planned them
        out = plan(*args, **kwargs)
        planned.append(out[0])
        return out

    trainer.micro_batches = recorded
    pair, share, seconds, layout = trainer.pair_cost, trainer.share_rows, defaultdict(list), {}
    names = list(LAYOUTS)
    for rep in range(reps + 1):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            pack, trainer.share_rows = LAYOUTS[name]
            trainer.pair_cost = pair if pack else 0
            start = time.perf_counter()
            trainer.train_step(groups)
            if rep:
                seconds[name].append(time.perf_counter() - start)
            batches = planned[-1]
            layout[name] = (len(batches), sum(mb.packed for mb, _ in batches), linear_tokens(batches),
                            sum(len(mb.response_ends) for mb, real in batches if real))
            print(f"{path.name} rep {rep} {name}: {time.perf_counter() - start:.2f} s", flush=True)
    trainer.pair_cost, trainer.share_rows, trainer.micro_batches = pair, share, plan
    out = []
    for name in LAYOUTS:
        passes, packed, tokens, rows = layout[name]
        out.append({"step": portable(path), "layout": name, "groups": len(groups), "rows": rows, "micro_batches": passes,
                    "packed_micro_batches": packed, "linear_tokens": tokens,
                    "learner_s": statistics.median(seconds[name]), "learner_s_min": min(seconds[name]),
                    "learner_s_max": max(seconds[name])})
    for row in out[1:]:
        row["speedup"] = out[0]["learner_s"] / row["learner_s"]
    return out


def not_trajectories(path: Path) -> str | None:
    """Why ``path`` is not a trajectory file ``ziprl.train`` recorded; None when it is one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ziprl.env.trajectory import readable

    if not path.is_file():
        return "no such file"
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        return f"not a Parquet file ({one_line(exc)})"
    return None if readable(schema) else "a Parquet file, but not of trajectories"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trajectories", nargs="+", type=Path, required=True,
                    help="recorded steps: RUN/trajectories/step_NNNNNN.parquet")
    ap.add_argument("--config", default=str(REPO / "configs" / "learn-invented.yaml"), help="the learner's settings")
    ap.add_argument("--model", type=model_dir, help="model directory (default: the embedded model)")
    ap.add_argument("--groups", type=at_least(0), default=0, help="each file's first N groups (0: all)")
    ap.add_argument("--reps", type=at_least(1), default=3, help="timed steps per layout and file, after one warm-up each")
    ap.add_argument("--name", type=results_name, default="learner_packing")
    args = ap.parse_args()
    if bad := [f"{p} ({why})" for p in args.trajectories if (why := not_trajectories(p))]:
        ap.error(f"--trajectories: not a trajectory file: {', '.join(bad)}; pass the step files a run writes under "
                 "RUN/trajectories/")
    try:  # the config is checked before the learner starts (the model when the arguments are parsed)
        cfg = load_config(args.config)
    except UserError as exc:
        ap.exit(2, f"error: --config: {exc}\n")
    if cfg.learner.pack_rows is False:
        ap.error(f"{args.config} sets learner.pack_rows=false: give a config that lets the learner pack")
    cfg.model.device = "cpu"
    cfg.learner.probe_update = False

    from ziprl.learner.trainer import Trainer

    trainer = Trainer(cfg, args.model)
    if not trainer.pair_cost or not trainer.share_rows:
        ap.error("this learner cannot pack as a prefix tree (it needs the sdpa attention on a CPU and "
                 "learner.share_prefix on)")
    rows = [row for path in args.trajectories for row in measure(path, trainer, args.groups, args.reps)]
    write_results(args.name, rows, meta=vars(args) | {"config": portable(args.config), "model": portable(args.model),
                                                      "trajectories": [portable(p) for p in args.trajectories],
                                                      "bf16": trainer.bf16, "threads": os.environ.get("OMP_NUM_THREADS")},
                  config=args.config)


if __name__ == "__main__":
    main()
