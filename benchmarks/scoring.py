"""Scoring benchmark: compression-quality (Q_com) scorings per second, one process (= one core).

    .venv/bin/python benchmarks/scoring.py [--data CORPUS] [--questions QA] [--n 3000] [--repeats 5]

Observations are real HotpotQA passages: a question's context paragraphs, looked up in the pooled
corpus, shuffled and joined, cut to a random 1,000-3,000 characters; every observation is a distinct
text, so the K_x cache never hits in the main row. Compressions are query-ranked extractive sentences
cut to a length spread around the chosen level's range. Goal: >= 5,000 scorings/s per core.
Results go to benchmarks/results/scoring.{json,md}; one function per measurement, ``main`` runs them.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import at_least, write_results  # noqa: E402

from ziprl.retrieval.datasets import DatasetError, shared_file  # noqa: E402
from ziprl.retrieval.sets.hotpotqa import TRAIN, TRAIN_CORPUS  # noqa: E402
from ziprl.scoring import compression_quality, extract_keywords, level_spec  # noqa: E402
from ziprl.scoring.keywords import cached_keywords, sentences  # noqa: E402

GOAL_PER_CORE = 5000
GROUP = 8  # compressions per observation in the cached row (a GRPO group scoring one observation)

Case = tuple[str, str, str, int]  # (question q, observation x, compression y, level g)


GZIP_MAGIC = b"\x1f\x8b"


def gz_file(text: str) -> Path:
    """An argparse ``type``: the path of a readable gzip file."""
    path = Path(text).expanduser()
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text}: {exc.strerror or exc}; pass the gzipped JSON file") from None
    if head != GZIP_MAGIC:
        raise argparse.ArgumentTypeError(f"{text} is not a gzip file; pass the gzipped JSON file")
    return path


def _load_gz_json(path: Path, flag: str, kind: type):
    """The JSON in gzip file ``path`` (a ``kind``, not empty); exit 2 naming ``flag`` when it is not one."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        data = exc
    if not isinstance(data, kind) or not data:
        got = f"({data})" if isinstance(data, Exception) else f"(a {type(data).__name__}, not a non-empty JSON {kind.__name__})"
        print(f"error: {flag} {path} cannot be read as the HotpotQA file it names {got}; pass the release's file",
              file=sys.stderr)
        sys.exit(2)
    return data


def _compress(question: str, source: str, level: int, rng: random.Random) -> str:
    """An extractive compression: sentences ranked by query-keyword overlap, cut to a realistic length."""
    spec = level_spec(level)
    target = rng.uniform(0.6 * spec.char_low, 1.3 * spec.char_high)
    kq = extract_keywords(question)
    sents = sentences(source)
    ranked = sorted(range(len(sents)), key=lambda i: (-len(kq & extract_keywords(sents[i])), i))
    out: list[str] = []
    size = 0
    for i in ranked:
        if size >= target:
            break
        out.append(sents[i] + ".")
        size += len(sents[i]) + 2
    return " ".join(out)[: int(target) + 1]


def build_cases(corpus: dict, questions: list[dict], n: int, seed: int = 0) -> list[Case]:
    """``n`` (q, x, y, g) cases with distinct observations x of 1,000-3,000 characters."""
    rng = random.Random(seed)
    cases: list[Case] = []
    seen: set[str] = set()
    for tries in itertools.count():
        if len(cases) >= n:
            break
        if tries >= 100 * n:
            print(f"error: {len(cases)} distinct observations of 1,000+ characters found in {tries} draws, not {n}: "
                  "lower --n, or pass the release's files (--data's titles are the questions' context titles)",
                  file=sys.stderr)
            sys.exit(2)
        ex = rng.choice(questions)
        titles = [t for t, _ in ex["context"] if t in corpus]
        rng.shuffle(titles)
        limit = rng.randint(1000, 3000)
        parts, size = [], 0
        for t in titles:
            if size >= limit:
                break
            text = f"{t}. {''.join(corpus[t]).strip()}"
            parts.append(text)
            size += len(text) + 2
        source = "\n\n".join(parts)[:limit]
        if len(source) < 1000 or source in seen:
            continue
        seen.add(source)
        level = rng.choice([g for g in range(1, 6) if level_spec(g).char_low < len(source)])
        cases.append((ex["question"], source, _compress(ex["question"], source, level, rng), level))
    return cases


def _rates(cases: list[Case], repeats: int) -> tuple[float, float]:
    """Best scorings/s over ``repeats`` passes (keyword cache cleared before each): by CPU time, by wall time.

    CPU time of this single-threaded process is time on one core, and it is what other jobs on a shared
    machine disturb least; wall time is reported beside it.
    """
    cpu, wall = [], []
    for _ in range(repeats):
        cached_keywords.cache_clear()
        c0, w0 = time.process_time(), time.perf_counter()
        for q, x, y, g in cases:
            compression_quality(q, x, y, g)
        cpu.append(len(cases) / (time.process_time() - c0))
        wall.append(len(cases) / (time.perf_counter() - w0))
    return max(cpu), max(wall)


def measure_scoring(args: argparse.Namespace) -> list[dict]:
    """Q_com scorings/s on distinct observations, and on groups of compressions of one observation."""
    corpus = _load_gz_json(args.data, "--data", dict)
    questions = _load_gz_json(args.questions, "--questions", list)
    if not all(isinstance(q, dict) and isinstance(q.get("question"), str) and isinstance(q.get("context"), list)
               for q in questions):
        print(f"error: --questions {args.questions}: every record needs 'question' and 'context' (HotpotQA's "
              "format); pass the release's file", file=sys.stderr)
        sys.exit(2)
    cases = build_cases(corpus, questions, args.n)
    rng = random.Random(1)
    grouped = [(q, x, _compress(q, x, g, rng), g) for q, x, _, g in cases[: args.n // GROUP] for _ in range(GROUP)]
    compression_quality(*cases[0])  # load the stop words (first nltk import) outside the timing
    rows = []
    for name, batch in (("distinct observations", cases), (f"{GROUP} compressions per observation", grouped)):
        cpu_rate, wall_rate = _rates(batch, args.repeats)
        rows.append({"measurement": "Q_com scoring", "case": name, "scorings": len(batch),
                     "mean_x_chars": statistics.mean(len(c[1]) for c in batch),
                     "mean_y_chars": statistics.mean(len(c[2]) for c in batch),
                     "per_s_per_core": cpu_rate, "us_per_scoring": 1e6 / cpu_rate, "wall_per_s": wall_rate,
                     "goal_per_s": GOAL_PER_CORE, "meets_goal": cpu_rate >= GOAL_PER_CORE})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=gz_file, help=f"HotpotQA pooled corpus; default: $ZIPRL_DATA/{TRAIN_CORPUS}")
    p.add_argument("--questions", type=gz_file, help=f"HotpotQA questions; default: $ZIPRL_DATA/{TRAIN}")
    p.add_argument("--n", type=at_least(GROUP), default=3000, help=f"distinct observations to score (at least {GROUP})")
    p.add_argument("--repeats", type=at_least(1), default=5, help="timed passes; the best is reported")
    args = p.parse_args()
    try:
        args.data = args.data or gz_file(str(shared_file(TRAIN_CORPUS)))
        args.questions = args.questions or gz_file(str(shared_file(TRAIN)))
    except (DatasetError, argparse.ArgumentTypeError) as exc:
        p.exit(2, f"error: {exc}\n")
    load_before = os.getloadavg()[0]
    rows = measure_scoring(args)
    write_results("scoring", rows, meta={"data": args.data.name, "questions": args.questions.name,
                                         "n": args.n, "repeats": args.repeats, "processes": 1,
                                         "load_avg_1min": [load_before, os.getloadavg()[0]]})


if __name__ == "__main__":
    main()
