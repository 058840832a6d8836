"""Build the shipped invented-entity data set (ziprl/data/invented/) from a seed, reproducibly.

    python scripts/make_invented.py [--seed 0] --out DIR

Writes corpus.jsonl.gz, train.jsonl, heldout.jsonl (ziprl.retrieval.sets.invented_world.write_invented) and a
README.md recording the seed and the counts. Same seed, same bytes. --out is new, empty, or an earlier output of
this script (scripts/_script_out.py); the files are built beside it and moved in once complete. The shipped
directory predates the marker: to rebuild it, write to a new --out and copy the files over.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from _script_out import building, checked_out

from ziprl.boundary import run_command
from ziprl.retrieval.sets.invented_world import QTYPE_WEIGHTS, TWIN_RATE, Invented, World, write_invented

README = """\
# Invented entities: a search task no model can answer from memory

Questions about invented towns, people and organisations (made-up, pronounceable names from a seeded syllable
generator: 5-10 letters, unique, none a whole word of the default encoder's vocabulary or a word of the shipped
sample corpus), answerable only by searching this corpus. Built by `scripts/make_invented.py --seed {seed}`
(`ziprl/retrieval/sets/invented_world.py`: stdlib `random`, no network, no model; same seed, same bytes).
Registered as the datasets `invented` (training questions) and `invented-heldout` (held-out questions), which share
`corpus.jsonl.gz`.

| file | content |
|---|---|
| `corpus.jsonl.gz` | {passages} passages (id, title, text), 2-3 encyclopedia-style sentences each, one per entity of both worlds, in a seeded shuffle |
| `train.jsonl` | {n_train} training questions ({train_types}) |
| `heldout.jsonl` | {n_heldout} held-out questions ({heldout_types}) |

## Two worlds, one corpus

| world | towns | people | organisations | near-duplicate pairs | regions, rivers |
|---|---|---|---|---|---|
{world_rows}

Training questions are about the training world, held-out questions about the held-out world: no held-out entity,
region or river is named by a training question, its answers or its supporting titles (so by no demonstration made
from them), while their passages lie in the same corpus and appear among search results.

- Towns lie on a river, in a region, with a founding year; people have birth and death years, a birthplace, a
  workplace and a profession; organisations have a founding year, a founder (a person) and a seat (a town).
- Near-duplicates: each new entity is, with probability {twin_rate}, a twin of an earlier one of its kind: one
  vowel of its name changed (people keep the given name), other values, the same passage templates.
- Question types (drawn {weights}): `single` (one fact of one passage: "In what year was X founded?"), `bridge` (two
  hops: "What river flows through the birthplace of X?"), `comparison` ("Which town was founded first, X or Y?",
  Y being X's twin half the time when it has one). `source` is `invented-<type>`; `supporting_titles` lists the
  passages to read, in order (the scripted teacher reads them).
- Difficulty varies with the passage template (four per kind): a fact in a passage's first 150 characters shows in
  its search hit's snippet (retriever.snippet_chars); one template per kind opens with a long sentence, so its
  facts need `open`. Passages hold decoy years (death, founding of an organisation) and towns (a workplace).
  A comparison's answer is one of two names in the question, so guessing scores 0.5 on those.
"""


def type_counts(examples: list) -> str:
    counts = Counter(e.source.removeprefix("invented-") for e in examples)
    return ", ".join(f"{counts[t]} {t}" for t in QTYPE_WEIGHTS)


def world_row(name: str, w: World) -> str:
    towns = list(w.towns.values())
    regions, rivers = len({t.region for t in towns}), len({t.river for t in towns})
    return f"| {name} | {len(w.towns)} | {len(w.people)} | {len(w.orgs)} | {len(w.twins) // 2} | {regions}, {rivers} |"


def readme(data: Invented, seed: int) -> str:
    return README.format(
        seed=seed, passages=len(data.corpus), n_train=len(data.train), n_heldout=len(data.heldout),
        train_types=type_counts(data.train), heldout_types=type_counts(data.heldout), twin_rate=TWIN_RATE,
        weights=", ".join(f"{t} {p}" for t, p in QTYPE_WEIGHTS.items()),
        world_rows="\n".join(world_row(n, w) for n, w in data.worlds.items()))


@run_command
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="a new or empty directory, or an earlier output of this script "
                    "(the shipped ziprl/data/invented/ predates the marker: write elsewhere and copy the files over)")
    args = ap.parse_args(argv)
    out = checked_out(args.out, "data", Path(__file__).name)
    with building(out, "data", Path(__file__).name) as tmp:
        data = write_invented(tmp, args.seed)
        (tmp / "README.md").write_text(readme(data, args.seed), encoding="utf-8")
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote {out}: {len(data.corpus)} passages, {len(data.train)} training and {len(data.heldout)} held-out "
          f"questions, {size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
