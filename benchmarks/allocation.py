"""The paper's Theorem 1 on real data: relevance-aware (adaptive) vs uniform allocation at the same mean budget.

Questions: the pooled HotpotQA + MuSiQue questions with supporting titles ($ZIPRL_DATA). Each question's
retrieved pool is its context paragraphs (supporting + distractors, as in the pooled corpus). Both policies
write the scripted teacher's extractive notes (``ziprl.env.scripted.extractive_note``: its sentence ranking,
computed once per paragraph, then its selection at each budget) for every paragraph:

- adaptive: the teacher's level per paragraph (``relevance_level``: answer-bearing -> 4, question-keyword
  overlap -> 3/2, else 1) with the level ranges at scale s;
- uniform: one level-3-shaped range for every paragraph, scaled by t, where t is bisected so the uniform
  notes' mean kept characters per paragraph equal the adaptive notes' (the theorem's E[f(R)] = alpha_bar).

Budgets: one per scale s. Measured on the memory (all notes of a question): gold answer present (over the
questions whose pool contains it: not yes/no comparisons),
supporting-sentence recall (HotpotQA: the supporting_facts sentences; MuSiQue: the sentences of each hop's
supporting paragraph that contain that hop's answer) and Q_info of the memory against the whole pool; each
also per 1,000 characters kept. Two variants: ``oracle`` (the teacher as scripted: relevance and sentence
ranking see the gold answer) and ``question-only`` (answers hidden from the policy: keywords of the question).

    python benchmarks/allocation.py [--scales 0.03,0.05,0.08,0.12,0.2,0.3,0.5] [--limit 0] [--plot-only]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, at_least, listed, write_results  # noqa: E402
from tqdm import tqdm  # noqa: E402

from ziprl.env.scripted import rank_sentences, relevance_level, select_sentences  # noqa: E402
from ziprl.retrieval.datasets import DatasetError, load_dataset, shared_file  # noqa: E402
from ziprl.retrieval.sets import hotpotqa, musique  # noqa: E402
from ziprl.retrieval.sets.pooled import context_paragraphs  # noqa: E402
from ziprl.scoring import level_spec, normalize_answer  # noqa: E402
from ziprl.scoring.allocation import (  # noqa: E402
    answer_present,
    budget_gap,
    match_budget,
    mean_budget,
    memory_q_info,
    per_kchar,
    support_recall,
)
from ziprl.scoring.keywords import sentences  # noqa: E402

UNIFORM_LEVEL = 3  # the uniform baseline's level shape (env.uniform_level's default)
METRICS = ("answer_present", "support_recall", "q_info")


def _read(rel: str) -> list[dict]:
    path = shared_file(rel)
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"dataset file {path} cannot be read as gzipped JSON ({exc}); replace it with the "
                           f"release's {rel}") from None


def supporting_sentences() -> dict[str, list[str]]:
    """Question id -> its gold supporting sentences (see module doc)."""
    out: dict[str, list[str]] = {}
    for r in _read(hotpotqa.TRAIN):
        sents = {title: s for title, s in r["context"]}
        out[r["_id"]] = [sents[t][i] for t, i in r["supporting_facts"] if t in sents and i < len(sents[t])]
    for r in _read(musique.TRAIN):
        found = []
        for hop in r["question_decomposition"]:
            text = r["paragraphs"][hop["paragraph_support_idx"]]["paragraph_text"]
            sents = sentences(text)
            answer = f" {normalize_answer(hop['answer'])} "
            found += [s for s in sents if answer in f" {normalize_answer(s)} "] or sents
        out[r["id"]] = found
    return out


def load_items(limit: int = 0) -> list[dict]:
    """The questions with supporting titles, their pool (context paragraphs) and supporting sentences."""
    pools, support = context_paragraphs(), supporting_sentences()
    items = [{"question": ex.question, "answers": ex.answers, "source": ex.source,
              "pool": [text for _, text in pools[ex.id]], "support": support[ex.id]}
             for ex in load_dataset("pooled") if ex.supporting_titles]
    for it in items:
        it["answer_in_pool"] = bool(answer_present(" ".join(it["pool"]), it["answers"]))
    return items[:limit] if limit else items


def prepare(items: list[dict], oracle: bool) -> list[list[tuple]]:
    """Per paragraph: the teacher's sentence ranking and relevance level (answers seen only when ``oracle``)."""
    out = []
    for it in items:
        answers = it["answers"] if oracle else []
        out.append([(*rank_sentences(it["question"], answers, text), relevance_level(it["question"], answers, text), text)
                    for text in it["pool"]])
    return out


def notes_at(prepared: list[list[tuple]], level_of, scale: float) -> list[list[str]]:
    """The teacher's extractive note of every paragraph at level ``level_of(relevance level)``, ranges x ``scale``."""
    out = []
    for paragraphs in prepared:
        notes = []
        for sents, order, level, text in paragraphs:
            spec = level_spec(level_of(level), scale)
            notes.append(select_sentences(sents, order, spec.char_low, spec.char_high) if sents else text[:spec.char_high])
        out.append(notes)
    return out


def _chars(notes: list[list[str]]) -> float:
    return mean_budget([len(n) for ns in notes for n in ns])


def measure(items: list[dict], notes: list[list[str]]) -> dict[str, float]:
    """Mean over questions of the retained-information measures, plus mean characters kept per paragraph."""
    memories = [" ".join(ns) for ns in notes]
    out = {"chars_per_doc": _chars(notes)}
    out["answer_present"] = mean_budget([answer_present(m, it["answers"]) for m, it in zip(memories, items, strict=True)
                                         if it["answer_in_pool"]])
    out["support_recall"] = mean_budget([support_recall(m, it["support"]) for m, it in zip(memories, items, strict=True)])
    out["q_info"] = mean_budget([memory_q_info(it["question"], " ".join(it["pool"]), m)
                                 for m, it in zip(memories, items, strict=True)])
    return out


def run(items: list[dict], scales: list[float]) -> list[dict]:
    rows = []
    points = [(v, s) for v in ("oracle", "question-only") for s in scales]
    prepared = {v: prepare(items, v == "oracle") for v in ("oracle", "question-only")}
    for variant, s in tqdm(points, desc="budgets", unit="budget"):
        prep = prepared[variant]
        ada_notes = notes_at(prep, lambda g: g, s)
        uniform = lambda x, p=prep: _chars(notes_at(p, lambda g: UNIFORM_LEVEL, x))  # noqa: E731
        t, _ = match_budget(uniform, _chars(ada_notes), 1e-3, 10.0)
        uni_notes = notes_at(prep, lambda g: UNIFORM_LEVEL, t)
        levels = [level for paragraphs in prep for _, _, level, _ in paragraphs]
        for policy, notes, scale in (("adaptive", ada_notes, s), ("uniform", uni_notes, t)):
            m = measure(items, notes)
            row = {"variant": variant, "budget_scale": s, "policy": policy, "level_scale": round(scale, 4), **m}
            row.update({f"{k}_per_kchar": per_kchar(m[k], m["chars_per_doc"]) for k in METRICS})
            if policy == "adaptive":
                row["level_fracs"] = "/".join(f"{levels.count(g) / len(levels):.2f}" for g in range(1, 5))
            rows.append(row)
        gap = budget_gap(rows[-1]["chars_per_doc"], rows[-2]["chars_per_doc"])
        rows[-1]["budget_gap"] = rows[-2]["budget_gap"] = gap
    return rows


def verdict(rows: list[dict]) -> dict[str, dict[str, list[int]]]:
    """Per variant and metric: budgets where adaptive is [better, equal, worse] than uniform."""
    out: dict[str, dict[str, list[int]]] = {}
    for ada, uni in zip(rows[::2], rows[1::2], strict=True):
        for k in METRICS:
            c = out.setdefault(ada["variant"], {}).setdefault(k, [0, 0, 0])
            d = ada[k] - uni[k]
            c[0 if d > 1e-9 else 2 if d < -1e-9 else 1] += 1
    return out


def plot(rows: list[dict], path: Path) -> Path:
    import matplotlib.ticker

    from ziprl.plots import _plt, save_figure

    plt = _plt()
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    fig, axes = plt.subplots(len(variants), len(METRICS), figsize=(12, 3.6 * len(variants)), squeeze=False)
    labels = {"answer_present": "gold answer in memory", "support_recall": "supporting-sentence recall",
              "q_info": "Q_info of memory"}
    for i, v in enumerate(variants):
        for j, k in enumerate(METRICS):
            ax = axes[i][j]
            for policy, style in (("adaptive", "o-"), ("uniform", "s--")):
                pts = [(r["chars_per_doc"], r[k]) for r in rows if r["variant"] == v and r["policy"] == policy]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=policy)
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_xlabel("mean characters kept per paragraph")
            ax.set_title(f"{labels[k]} ({v})")
            ax.grid(alpha=0.3)
        axes[i][0].legend()
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def scale(text: str) -> float:
    """An argparse ``type``: a level scale, a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:  # nan too
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: a level scale is a finite number > 0")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scales", type=listed(scale), default=[0.03, 0.05, 0.08, 0.12, 0.2, 0.3, 0.5],
                    help="comma-separated adaptive level scales (> 0), one budget each")
    ap.add_argument("--limit", type=at_least(0), default=0, help="questions (0 = all with supporting titles)")
    ap.add_argument("--plot-only", action="store_true", help="redraw the plot from results/allocation.json")
    args = ap.parse_args(argv)
    if args.plot_only:
        try:
            rows = json.loads((RESULTS / "allocation.json").read_text(encoding="utf-8"))["rows"]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
            ap.exit(2, f"error: --plot-only redraws {RESULTS / 'allocation.json'}, which is missing or not this "
                       "benchmark's results: run without --plot-only first\n")
        plot(rows, RESULTS / "allocation.png")
        return 0
    try:
        items = load_items(args.limit)
    except DatasetError as exc:  # input only: nothing is written before the items are read
        ap.exit(2, f"error: {exc}\n")
    rows = run(items, args.scales)
    result = verdict(rows)
    meta = {"questions": len(items), "paragraphs": sum(len(it["pool"]) for it in items),
            "sources": sorted({it["source"] for it in items}), "uniform_level_shape": UNIFORM_LEVEL,
            "adaptive_better_equal_worse": result}
    write_results("allocation", rows, meta)
    plot(rows, RESULTS / "allocation.png")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
