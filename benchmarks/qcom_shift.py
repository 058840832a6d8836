"""Where an arm's Q_com differs from GRPO's in trained runs: malformed turns, which observations were compressed at
which level, and the quality within each such cell.

    python benchmarks/qcom_shift.py --runs DIR [--window 10] [--name qcom_shift]

For every seed with a GRPO run (``w0_seed<s>``) under ``--runs`` (a ``benchmarks/learning.py --out`` directory), each
other arm of that seed is compared with it over windows of ``--window`` steps that both trained, on every scored turn
of the trajectories they trained on. The difference in mean Q_com splits exactly into three terms (a symmetric
shift-share decomposition, :func:`shift_share`):

- malformed: more or fewer turns without a valid compression, and those turns' own score;
- mix: well-formed turns spread differently over cells (what the turn compressed, the level it chose);
- quality: a different Q_com within a cell.

It also splits the difference by Q_com's four parts (paper Eq. Q_com, each weighted by its alpha) and reports the
mean length of well-formed scored turns' responses.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import results_name, write_results  # noqa: E402
from hrr_credit import RUN, compressed_by  # noqa: E402

PARTS = ("ratio", "level", "info", "sem")  # Q_com's parts, in the order of their alphas


@dataclass(frozen=True)
class Scored:
    """One scored turn: its cell (None when malformed), Q_com, its four parts and its response's length."""

    cell: Hashable | None
    q: float
    parts: tuple[float, float, float, float]
    chars: int


def scored(turns: Sequence) -> list[Scored]:
    """One trajectory's scored turns; a cell is (what the turn compressed, the level it chose)."""
    out = []
    for j, t in enumerate(turns):
        if j == 0 or t.q_com is None:
            continue
        cell = None if t.format_error is not None else (compressed_by(turns, j), t.level)
        out.append(Scored(cell, t.q_com, tuple(getattr(t, f"q_{p}") or 0.0 for p in PARTS), len(t.response_text)))
    return out


def shift_share(a: Sequence[Scored], b: Sequence[Scored]) -> dict[str, float]:
    """Mean Q_com of ``b`` − ``a`` and its exact split into ``malformed`` + ``mix`` + ``quality``.

    With e the malformed share, m their mean Q_com, V the mean over well-formed turns, and bars the two sides'
    averages: Δ = Δe (m̄ − V̄) + ē Δm + (1 − ē) ΔV, and ΔV = Σ_c Δp_c q̄_c (mix) + Σ_c p̄_c Δq_c (quality) over cells c
    (a cell one side lacks takes the other side's mean, so it only counts in the mix).
    """
    def side(turns: Sequence[Scored]) -> tuple[float, float, float, dict[Hashable, tuple[float, float]]]:
        bad = [t.q for t in turns if t.cell is None]
        good = [t for t in turns if t.cell is not None]
        cells: dict[Hashable, list[float]] = {}
        for t in good:
            cells.setdefault(t.cell, []).append(t.q)
        share = {c: (len(qs) / len(good), float(np.mean(qs))) for c, qs in cells.items()}
        return (len(bad) / len(turns), float(np.mean(bad)) if bad else 0.0,
                float(np.mean([t.q for t in good])) if good else 0.0, share)

    e_a, m_a, v_a, cells_a = side(a)
    e_b, m_b, v_b, cells_b = side(b)
    if not e_a or not e_b:  # a side without malformed turns: their mean is the other side's
        m_a, m_b = (m_b, m_b) if not e_a else (m_a, m_a)
    e, m, v = (e_a + e_b) / 2, (m_a + m_b) / 2, (v_a + v_b) / 2
    mix = quality = 0.0
    for c in set(cells_a) | set(cells_b):
        p_a, q_a = cells_a.get(c, (0.0, cells_b.get(c, (0, 0.0))[1]))
        p_b, q_b = cells_b.get(c, (0.0, q_a))
        mix += (p_b - p_a) * (q_a + q_b) / 2
        quality += (p_a + p_b) / 2 * (q_b - q_a)
    return {"delta": float(np.mean([t.q for t in b]) - np.mean([t.q for t in a])),
            "malformed": (e_b - e_a) * (m - v) + e * (m_b - m_a), "mix": (1 - e) * mix, "quality": (1 - e) * quality}


def part_deltas(a: Sequence[Scored], b: Sequence[Scored], alpha: Sequence[float]) -> dict[str, float]:
    """alpha_k × (mean part k of ``b`` − of ``a``): with Q_com = Σ alpha_k Q_k they sum to the difference in Q_com."""
    pa, pb = np.mean([t.parts for t in a], axis=0), np.mean([t.parts for t in b], axis=0)
    return {f"part: {name}": float(w * d) for name, w, d in zip(PARTS, alpha, pb - pa, strict=True)}


def read_run(run: Path) -> tuple[dict[int, list[Scored]], tuple[float, ...]]:
    """A run's scored turns by step, and its alphas (from its config.json)."""
    from ziprl.env.trajectory import load_trajectories

    scoring = json.loads((run / "config.json").read_text())["env"]["scoring"]
    steps = {int(f.stem.removeprefix("step_")): [s for tr in load_trajectories(f) for s in scored(tr.turns)]
             for f in sorted((run / "trajectories").glob("step_*.parquet"))}
    return steps, tuple(scoring[f"w_{p}"] for p in PARTS)


def rows_for(runs: Path, window: int) -> list[dict]:
    """One row per (seed, arm other than w = 0, window both the arm and its seed's GRPO run trained)."""
    found = {m.groups(): p for p in sorted(runs.iterdir()) if p.is_dir() and (m := RUN.fullmatch(p.name))
             and (p / "trajectories").is_dir() and (p / "config.json").is_file()}
    grpo_runs = {seed: path for (w, seed), path in found.items() if float(w) == 0}
    read = {path: read_run(path) for (w, seed), path in found.items() if seed in grpo_runs}  # each run once
    rows = []
    for (w, seed), path in sorted(found.items(), key=lambda kv: (int(kv[0][1]), float(kv[0][0]))):
        if float(w) == 0 or seed not in grpo_runs:
            continue
        (arm, alpha), (grpo, _) = read[path], read[grpo_runs[seed]]
        last = min(max(arm, default=0), max(grpo, default=0))
        for lo in range(1, last + 1, window):
            hi = min(lo + window - 1, last)
            a = [t for s in range(lo, hi + 1) for t in grpo.get(s, [])]
            b = [t for s in range(lo, hi + 1) for t in arm.get(s, [])]
            if not a or not b:
                continue
            chars = [float(np.mean([t.chars for t in x if t.cell is not None] or [0])) for x in (a, b)]
            rows.append({"seed": int(seed), "w": float(w), "steps": f"{lo}-{hi}", "scored turns (GRPO, arm)":
                         f"{len(a)}, {len(b)}", "Q_com GRPO": float(np.mean([t.q for t in a])),
                         **shift_share(a, b), **part_deltas(a, b, alpha), "response chars GRPO": chars[0],
                         "response chars arm": chars[1]})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", required=True, help="a benchmarks/learning.py --out directory")
    ap.add_argument("--window", type=int, default=10, help="steps per compared window (> 0)")
    ap.add_argument("--name", type=results_name, default="qcom_shift", help="results file prefix")
    args = ap.parse_args(argv)
    if args.window < 1:
        ap.exit(2, f"error: --window must be > 0, got {args.window}\n")
    runs = Path(args.runs)
    rows = rows_for(runs, args.window) if runs.is_dir() else []
    if not rows:
        ap.exit(2, f"error: --runs {runs}: no w0_seed<s> run with another arm of the same seed there (each "
                   "w<w>_seed<s>/trajectories/step_*.parquet); give the --out directory of a benchmarks/learning.py "
                   "run with --weights 0,...\n")
    write_results(args.name, rows, {"runs": str(runs.name), "window": args.window})
    for r in rows:
        print(f"seed {r['seed']} w={r['w']:g} steps {r['steps']}: {r['delta']:+.3f} = malformed {r['malformed']:+.3f}"
              f" + mix {r['mix']:+.3f} + quality {r['quality']:+.3f}")


if __name__ == "__main__":
    main()
