"""Build the shipped sample (ziprl/data/sample/) from the shared data sets, reproducibly.

    python scripts/make_sample.py [--shared DATA_DIR] --out DIR

Picks the first N HotpotQA-train and N MuSiQue-train questions (HippoRAG subsets) with short, non yes/no
answers, keeps every paragraph of their contexts, and fills the corpus up to --passages with a seeded
random draw of the other pooled-corpus passages (HotpotQA dev, MuSiQue, wiki18) as distractors.
Passage ids and texts are those of the pooled corpus (ziprl.retrieval.sets.pooled.pooled_passages). Every check
(--out, the data, every supporting title in the corpus) passes before anything is written; --out is new, empty, or
an earlier output of this script (scripts/_script_out.py). The shipped directory predates the marker and holds the
index: to rebuild it, write to a new --out and copy the files over.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

from _script_out import building, checked_out

from ziprl.boundary import UserError, run_command
from ziprl.cli.common import at_least
from ziprl.retrieval.corpus import write_corpus
from ziprl.retrieval.datasets import (
    DEPRECATED_SHARED_ENV,
    SHARED_ENV,
    WHERE_TO_GET_DATA,
    DatasetError,
    default_shared_dir,
    shared_file,
    write_qa_jsonl,
)
from ziprl.retrieval.sets.hotpotqa import TRAIN as HOTPOT_TRAIN
from ziprl.retrieval.sets.hotpotqa import load_hotpot_train
from ziprl.retrieval.sets.musique import TRAIN as MUSIQUE_TRAIN
from ziprl.retrieval.sets.musique import load_musique_train
from ziprl.retrieval.sets.pooled import context_paragraphs, pooled_passages
from ziprl.retrieval.types import Passage, QAExample

ATTRIBUTION = """\
# Shipped sample: attribution and licences

A small real sample so that ZipRL runs on a fresh machine. Built by `scripts/make_sample.py`
(`python scripts/make_sample.py --per-source {per_source} --passages {passages} --seed {seed}`)
from the files described in `shared/data/*/PROVENANCE.md`.

| file | content |
|---|---|
| `qa.jsonl` | {n_questions} questions in the unified schema (id, question, answers, supporting_titles, source): {n_hotpot} HotpotQA train + {n_musique} MuSiQue-Ans train |
| `corpus.jsonl.gz` | {n_passages} passages (id, title, text): every context paragraph of those questions ({n_own}) plus {n_distractors} distractors drawn at random (seed {seed}) from the rest of the pooled corpus |

## Sources

| data | from (repository, path, commit) | licence |
|---|---|---|
| HotpotQA (Yang et al., EMNLP 2018) train questions + paragraphs | OSU-NLP-Group/HippoRAG `data/hotpotqa_train.json`, `data/hotpotqa_train_corpus.json` @ 3d95d255a8db0c1699b853cfb4fbe5056708162d (repo MIT) | CC BY-SA 4.0 |
| HotpotQA dev distractor paragraphs (first 300 dev questions) | Codewithsayanjib/slm-rag-distraction-audit `data/hotpotqa_corpus.json` @ e03f9408cc8c7d6f6942afaea3ac7b70aba396b6 (repo licence not stated) | CC BY-SA 4.0 |
| MuSiQue-Ans (Trivedi et al., TACL 2022) train questions + paragraphs | OSU-NLP-Group/HippoRAG `data/musique_train.json`, `data/musique_train_corpus.json` @ 3d95d255a8db0c1699b853cfb4fbe5056708162d (repo MIT) | CC BY 4.0 |
| Wikipedia passages (Dec 2018 dump, 100-word DPR split) | RUC-NLPIR/FlashRAG `examples/quick_start/indexes/sample_data.jsonl` @ adb2a8bc285042abf7c0c56ff004283f62318c5a (repo MIT) | Wikipedia text: CC BY-SA |

Because it contains CC BY-SA material, this sample as a whole is distributed under CC BY-SA 4.0;
the MuSiQue parts are additionally under CC BY 4.0 (attribution above).

## Transformations

- Questions: chosen in file order, answers of at most {max_words} words and not yes/no; HotpotQA
  supporting titles = the titles in `supporting_facts`; MuSiQue answers = answer + answer_aliases,
  supporting titles = titles of the `is_supporting` paragraphs. Questions are whitespace-stripped.
- Passages: HotpotQA sentences joined; the dev distractor file's paragraphs ("<title>. <text>") split
  into title and text by a heuristic (`ziprl.retrieval.sets.hotpotqa.split_title`); wiki18 `contents` split into
  the quoted title line and the text; all whitespace runs collapsed to one space; passages with the
  same (title, text) de-duplicated; ids derived from the source (`hotpot-train-<n>`,
  `musique-train-<n>`, `hotpot-dev-<question>-<paragraph>`, `wiki18-<id>`).
- Nothing else was changed; no text was written or edited by hand.

## Prebuilt index

`index/` is the FAISS index of `corpus.jsonl.gz` built with the default encoder (all-MiniLM-L6-v2, flat
inner product; index directory format 2: `index.faiss`, the passages as a memory-mapped Arrow file and an
id index), shipped so a fresh machine skips a CPU build of several minutes. Rebuild it with
`python -m ziprl.index build --corpus ziprl/data/sample/corpus.jsonl.gz --out ziprl/data/sample/index`;
the retriever uses it only while its manifest matches the shipped corpus.
"""


def short(ex: QAExample, max_words: int) -> bool:
    """Whether the first gold answer of ``ex`` is non-empty, at most ``max_words`` words, and not yes/no."""
    a = ex.answers[0].strip() if ex.answers else ""
    return 0 < len(a.split()) <= max_words and a.lower() not in ("yes", "no")


def shared_dir(flag: str | None) -> Path:
    """The data directory: ``--shared``, else ``$ZIPRL_DATA``; DatasetError naming both when neither is given."""
    if flag:
        return Path(flag)
    if not (os.environ.get(SHARED_ENV) or os.environ.get(DEPRECATED_SHARED_ENV)):
        raise DatasetError(f"make_sample.py reads HotpotQA and MuSiQue from a data directory and none is given: pass "
                           f"--shared DATA_DIR or set {SHARED_ENV}=DATA_DIR; {WHERE_TO_GET_DATA}")
    return default_shared_dir()


def choose(shared: Path, args: argparse.Namespace) -> tuple[list[QAExample], list[QAExample], list[Passage], int]:
    """The HotpotQA and MuSiQue questions, the corpus (pooled order) and how many of its passages are their
    context paragraphs; UserError when --passages is more than the pooled corpus holds."""
    pooled = pooled_passages(shared)
    by_key = {(p.title, p.text): i for i, p in enumerate(pooled)}
    hotpot = [e for e in load_hotpot_train(shared_file(HOTPOT_TRAIN, shared)) if short(e, args.max_words)]
    musique = [e for e in load_musique_train(shared_file(MUSIQUE_TRAIN, shared)) if short(e, args.max_words)]
    hotpot, musique = hotpot[:args.per_source], musique[:args.per_source]
    for name, chosen in (("HotpotQA", hotpot), ("MuSiQue", musique)):
        if not chosen:
            raise DatasetError(f"no {name} training question has a non-empty, non yes/no answer of at most "
                               f"{args.max_words} words; nothing was written: raise --max-words, or check the data "
                               "directory's files (docs/data.md)")

    # every context paragraph of the chosen questions, located in the pooled corpus by (title, text)
    contexts = context_paragraphs(shared)
    lost = [(e.id, title) for e in hotpot + musique for title, text in contexts.get(e.id, []) if (title, text) not in by_key]
    if lost:
        raise DatasetError(f"{len(lost)} context paragraphs of the chosen questions are not in the pooled corpus (e.g. "
                           f"question {lost[0][0]!r}, paragraph {lost[0][1]!r}); nothing was written: check the data "
                           "directory's HotpotQA and MuSiQue files (docs/data.md)")
    own = {by_key[par] for e in hotpot + musique for par in contexts.get(e.id, [])}
    rest = [i for i in range(len(pooled)) if i not in own]
    n_distractors = max(0, args.passages - len(own))
    if n_distractors > len(rest):
        raise UserError(f"--passages {args.passages} is more than the pooled corpus holds ({len(pooled)} passages); "
                        f"pass at most {len(pooled)}")
    keep = sorted(own | set(random.Random(args.seed).sample(rest, n_distractors)))
    return hotpot, musique, [pooled[i] for i in keep], len(own)


def check_supported(examples: list[QAExample], passages: list[Passage]) -> None:
    """DatasetError when a supporting title of a question is no passage's title."""
    titles = {p.title for p in passages}
    lost = [(e.id, t) for e in examples for t in e.supporting_titles if t not in titles]
    if lost:
        raise DatasetError(f"{len(lost)} supporting titles are missing from the sample corpus (e.g. {lost[:3]}); "
                           "nothing was written: check the data directory's HotpotQA and MuSiQue files (docs/data.md)")


@run_command
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=None, help="the data directory (default: $ZIPRL_DATA; docs/data.md)")
    ap.add_argument("--out", required=True, help="a new or empty directory, or an earlier output of this script "
                    "(the shipped ziprl/data/sample/ predates the marker: write elsewhere and copy the files over)")
    ap.add_argument("--per-source", type=at_least(1), default=30, help="questions from each of HotpotQA and MuSiQue")
    ap.add_argument("--passages", type=at_least(0), default=2000,
                    help="total corpus size (at least the chosen questions' context paragraphs)")
    ap.add_argument("--max-words", type=at_least(1), default=3, help="longest gold answer kept, in words")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out = checked_out(args.out, "data", Path(__file__).name)
    hotpot, musique, passages, n_own = choose(shared_dir(args.shared), args)
    check_supported(hotpot + musique, passages)
    with building(out, "data", Path(__file__).name) as tmp:
        write_qa_jsonl(hotpot + musique, tmp / "qa.jsonl")
        write_corpus(passages, tmp / "corpus.jsonl.gz")
        (tmp / "ATTRIBUTION.md").write_text(ATTRIBUTION.format(
            per_source=args.per_source, passages=args.passages, seed=args.seed, max_words=args.max_words,
            n_questions=len(hotpot) + len(musique), n_hotpot=len(hotpot), n_musique=len(musique),
            n_passages=len(passages), n_own=n_own, n_distractors=len(passages) - n_own), encoding="utf-8")
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote {out}: {len(hotpot) + len(musique)} questions, {len(passages)} passages, {size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
