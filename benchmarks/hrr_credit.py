"""What HRR's per-turn term rewards in trained runs: how much of its spread each property of a turn explains, and
where each choice's credit comes from.

    python benchmarks/hrr_credit.py --runs DIR [--max-step N] [--name hrr_credit]

HRR adds ``w (Q_ij - Q̄_i)`` to every scored turn (paper Eq. advantage_adjust). Over every scored turn of every
trajectory the runs under ``--runs`` trained on (a ``benchmarks/learning.py --out`` directory: ``<run>/trajectories``),
this reports, per arm (seeds pooled), the share of the variance of ``Q_ij - Q̄_i`` that each property explains (the
between-group share, η²): whether the turn itself was malformed, what it compressed (the previous action's result),
the level it chose, and the last two together. A property the policy does not choose (what it compressed) is credit
for the state, not the decision; the turn's own format error is also what the outcome reward teaches.

``<name>_cells`` splits the mean credit of each cell (what a well-formed turn compressed, the level it chose) as
``Q_ij - Q̄_i = (1 - 1/T) Q_ij + past + future``, where past and future are minus the trajectory's other scored turns
before and after j, over T. The future part depends on the choice made at j (a choice changes what comes after),
so it is credit for the choice's consequences on later compressions, not for the compression itself; the table also
gives how often the later well-formed turns chose the same level.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import at_least, results_names, write_results  # noqa: E402

from ziprl.boundary import UserError, one_line  # noqa: E402

RUN = re.compile(r"w(-?[0-9.]+)_seed(\d+)")  # a learning.py run directory


@dataclass(frozen=True)
class ScoredTurn:
    """One turn HRR scored: its centred score ``Q_ij - Q̄_i`` and the properties it may be explained by."""

    centred: float
    malformed: bool
    compressed: str  # what the pending observation came from: the previous turn's action, or "invalid"
    level: int | None
    q: float = 0.0  # Q_ij
    past: float = 0.0  # -sum of the scored turns' Q before j, over T
    future: float = 0.0  # -sum of the scored turns' Q after j, over T
    later_same_level: float | None = None  # share of later well-formed scored turns at this turn's level
    later_q: float | None = None  # mean Q of the later scored turns
    position: str = ""  # "k of T": the k-th of the trajectory's T scored turns


PROPERTIES: dict[str, Callable[[ScoredTurn], Hashable]] = {
    "own format error": lambda t: t.malformed,
    "what it compressed": lambda t: t.compressed,
    "level chosen": lambda t: t.level,
    "what it compressed + level chosen": lambda t: (t.compressed, t.level),
}


def compressed_by(turns: Sequence, j: int) -> str:
    """What turn ``j`` compressed: the previous turn's action, or ``invalid`` when that turn was malformed."""
    return "invalid" if turns[j - 1].format_error is not None else turns[j - 1].action


def scored_turns(turns: Sequence) -> list[ScoredTurn]:
    """One trajectory's scored turns (``q_com`` not None), centred as HRR centres them (its term with A_i = 0, w = 1)."""
    from ziprl.learner.advantages import hrr_turn_advantages

    centred = hrr_turn_advantages(0.0, [t.q_com for t in turns], 1.0)
    scored = [k for k, t in enumerate(turns) if t.q_com is not None]
    out = []
    for j, (t, c) in enumerate(zip(turns, centred, strict=True)):
        if j == 0 or t.q_com is None:
            continue
        later = [turns[k].level == t.level for k in scored if k > j and turns[k].format_error is None]
        out.append(ScoredTurn(c, t.format_error is not None, compressed_by(turns, j), t.level,
                              t.q_com, -sum(turns[k].q_com for k in scored if k < j) / len(scored),
                              -sum(turns[k].q_com for k in scored if k > j) / len(scored),
                              sum(later) / len(later) if later else None,
                              float(np.mean([turns[k].q_com for k in scored if k > j])) if scored[-1] > j else None,
                              f"{scored.index(j) + 1} of {len(scored)}"))
    return out


def explained_share(values: np.ndarray, keys: Sequence[Hashable]) -> float:
    """η²: the share of ``values``' variance that the means of its groups (equal ``keys``) account for."""
    total = float(((values - values.mean()) ** 2).sum())
    if total == 0:
        return 0.0
    groups: dict[Hashable, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    within = sum(float(((values[ix] - values[ix].mean()) ** 2).sum()) for ix in map(np.array, groups.values()))
    return 1.0 - within / total


def arm_row(w: float, seeds: list[int], turns: list[ScoredTurn]) -> dict:
    """One arm's row: turns, mean absolute Q_ij - Q̄_i, the malformed turns' mean, and each property's share."""
    centred = np.array([t.centred for t in turns])
    bad = [t.centred for t in turns if t.malformed]
    return {"w": w, "seeds": ",".join(map(str, seeds)), "scored turns": len(turns),
            "mean abs(Q - Q_bar)": float(np.abs(centred).mean()),
            "malformed turns": len(bad), "their mean Q - Q_bar": float(np.mean(bad)) if bad else 0.0,
            **{f"share: {name}": explained_share(centred, [key(t) for t in turns]) for name, key in PROPERTIES.items()}}


def cell_rows(w: float, turns: list[ScoredTurn], min_turns: int = 20) -> list[dict]:
    """Per cell (what a well-formed turn compressed from a well-formed turn, the level it chose) with at least
    ``min_turns`` turns, over every position and then over first turns of two (where position and T are fixed, so
    the past part is 0): mean Q, mean credit and its self, past and future parts, and the later turns' mean Q and
    same-level share."""
    rows = []
    for position in ("any", "1 of 2"):
        cells: dict[tuple[str, int | None], list[ScoredTurn]] = {}
        for t in turns:
            if not t.malformed and t.compressed != "invalid" and position in ("any", t.position):
                cells.setdefault((t.compressed, t.level), []).append(t)
        for (compressed, level), ts in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            if len(ts) < min_turns:
                continue
            same = [t.later_same_level for t in ts if t.later_same_level is not None]
            later = [t.later_q for t in ts if t.later_q is not None]
            q, centred, past, future = np.array([(t.q, t.centred, t.past, t.future) for t in ts]).mean(axis=0)
            rows.append({"w": w, "position": position, "compressed": compressed, "level": level, "turns": len(ts),
                         "mean Q": float(q), "mean Q - Q_bar": float(centred),
                         "self (1 - 1/T) Q": float(centred - past - future), "past": float(past),
                         "future": float(future), "later turns' mean Q": float(np.mean(later)) if later else float("nan"),
                         "later turns at this level": float(np.mean(same)) if same else float("nan")})
    return rows


class TrajectoryFileError(UserError):
    """A ``step_*.parquet`` under ``--runs`` that is not a trajectory file; the message names it and the fix."""


STEP = re.compile(r"step_(\d+)\.parquet")  # a recorded step's trajectories


def trajectories(path: Path) -> list:
    """The trajectories of step file ``path``; TrajectoryFileError, naming it, when it is not one."""
    import pyarrow as pa

    from ziprl.env.trajectory import load_trajectories

    try:
        return load_trajectories(path)
    except (OSError, pa.ArrowException, ValueError, TypeError) as exc:  # not Parquet, or not of trajectories
        raise TrajectoryFileError(f"--runs: {path} is not a trajectory file ({one_line(exc)}); "
                                  "move it out of the run's trajectories/ directory, or give another --runs") from None


def read_runs(runs: Path, max_step: int | None = None) -> dict[float, dict[int, list[ScoredTurn]]]:
    """Every run under ``runs`` (``w<w>_seed<s>``): its trained trajectories' scored turns (steps up to ``max_step``,
    None: all), by w and seed; TrajectoryFileError for a step file that is not one."""
    found: dict[float, dict[int, list[ScoredTurn]]] = {}
    for run, match in sorted((p, m) for p in runs.iterdir() if p.is_dir() and (m := RUN.fullmatch(p.name))):
        w, seed = match.groups()
        steps = [(f, int(m[1])) for f in sorted((run / "trajectories").glob("step_*.parquet"))
                 if (m := STEP.fullmatch(f.name))]
        turns = [s for f, step in steps if max_step is None or step <= max_step
                 for tr in trajectories(f) for s in scored_turns(tr.turns)]
        if turns:
            found.setdefault(float(w), {})[int(seed)] = turns
    return found


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", required=True, help="a benchmarks/learning.py --out directory")
    ap.add_argument("--max-step", type=at_least(1), default=None, help="read steps up to this one (default: every "
                                                                        "step), so runs of different lengths compare alike")
    ap.add_argument("--name", type=results_names("", "_cells"), default="hrr_credit",
                    help="results file prefix: <name> and <name>_cells")
    args = ap.parse_args(argv)
    runs = Path(args.runs)
    try:  # reads every input before anything is written
        found = read_runs(runs, args.max_step) if runs.is_dir() else {}
    except TrajectoryFileError as exc:
        ap.exit(2, f"error: {exc}\n")
    if not found:
        ap.exit(2, f"error: --runs {runs}: no w<w>_seed<s>/trajectories/step_*.parquet there; give the --out "
                   "directory of a benchmarks/learning.py run\n")
    pooled = {w: [t for s in sorted(by_seed) for t in by_seed[s]] for w, by_seed in sorted(found.items())}
    rows = [arm_row(w, sorted(found[w]), turns) for w, turns in pooled.items()]
    meta = {"runs": sorted(f"w{w:g}_seed{s}" for w, b in found.items() for s in b), "max_step": args.max_step}
    write_results(args.name, rows, meta)
    write_results(f"{args.name}_cells", [r for w, turns in pooled.items() for r in cell_rows(w, turns)], meta)
    for r in rows:
        print(f"w={r['w']:g}: " + ", ".join(f"{k.removeprefix('share: ')} {v:.2f}" for k, v in r.items()
                                              if k.startswith("share: ")))


if __name__ == "__main__":
    main()
