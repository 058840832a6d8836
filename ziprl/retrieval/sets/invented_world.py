"""The invented world behind the ``invented`` datasets: towns, people and organisations with made-up, pronounceable
names, their encyclopedia-style passages, and questions about them (single-hop, bridge, comparison).

Everything follows from one seed (stdlib ``random``; no network, no model), so no answer can come from
pre-training. :func:`generate` makes two disjoint worlds, one for training questions and one for held-out questions;
their passages share one corpus. Names are unique over both worlds, and most entities come in near-duplicate pairs
(one vowel of the name changed, other values, the same templates), so a search for one also finds its twin. ``scripts/make_invented.py`` writes the shipped files with :func:`write_invented`.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from ziprl.retrieval.corpus import load_corpus, write_corpus
from ziprl.retrieval.datasets import SAMPLE_DIR, write_qa_jsonl
from ziprl.retrieval.types import Passage, QAExample

ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
          "br", "dr", "gr", "kr", "tr", "st", "th", "sk", "vr", "kl")
VOWELS = "aeiou"
MEDIALS = ("l", "r", "n", "s")
CODAS = ("n", "r", "l", "s", "th", "k", "m", "nd", "rn", "sk", "v", "x", "rd", "lt")
_AWKWARD = re.compile(r"[^aeiou]{3}|([^aeiou])\1")  # three consonants in a row, or a doubled one

INDUSTRIES = ("the wool trade", "salt mines", "glassworks", "fisheries", "timber mills", "paper mills", "potteries",
              "vineyards", "stone quarries", "dye works", "shipyards", "copper mines", "horse fairs", "breweries")
PROFESSIONS = {  # profession -> what a person of it is known for ({region}: the birthplace's region, {n}: a number)
    "cartographer": "an atlas of the {region} region", "astronomer": "a catalogue of {n} stars",
    "botanist": "a study of {n} mountain ferns", "shipwright": "a fast river barge design",
    "composer": "a cycle of {n} songs", "architect": "a bridge over the {region} gorge",
    "physician": "a treatise on marsh fever", "engraver": "{n} engravings of the {region} coast",
    "clockmaker": "a tower clock with {n} bells", "poet": "a book of {n} ballads", "geologist": "a survey of "
    "the {region} hills", "painter": "{n} portraits of the {region} nobility", "sculptor": "a fountain with {n} "
    "figures", "chemist": "a new blue dye", "linguist": "a grammar of the {region} dialect",
    "surveyor": "the first road map of the {region} region",
}
KINDS = {"Institute": "a research institute", "Society": "a learned society", "Guild": "a craft guild",
         "Academy": "a music academy", "Company": "a trading company", "Observatory": "an astronomical observatory",
         "Press": "a publishing house", "Library": "a public library", "Museum": "a museum of local history"}

TOWN_TEXTS = (
    "{name} is a town in the {region} region, founded in {founded}. The {river} River flows through {name}. "
    "Its economy rests on {industry}.",
    "{name} is a market town on the {river} River in the {region} region. It was founded in {founded} and grew "
    "rich from {industry}. About {population:,} people live there today.",
    "Founded in {founded}, {name} is a town in the {region} region known for its {industry}. It lies on the banks "
    "of the {river} River and has about {population:,} inhabitants.",
    "{name} is an old town in the {region} region, with a covered market, a stone bridge over its mill race and "
    "narrow lanes that wind around its church. It was founded in {founded} on the banks of the {river} River. Its "
    "economy rests on {industry}.",
)
PERSON_TEXTS = (
    "{name} ({born}–{died}) was {a} {profession} born in {birthplace}. {Pron} is best known for {known_for}.",
    "{name} was {a} {profession}, born in {born} in the town of {birthplace}. {Pron} later worked in {workplace} and "
    "died in {died}. {Pron} is remembered for {known_for}.",
    "Born in {birthplace} in {born}, {name} became a noted {profession}. {Pron} spent most of {pos} life in "
    "{workplace}, where {pron} died in {died}. {Pron} is known for {known_for}.",
    "{name} was {a} {profession} whose work was admired across the {region} region and far beyond it, both during "
    "{pos} lifetime and long after. {Pron} was born in {birthplace} in {born} and died in {died} in {workplace}. "
    "{Pron} is remembered for {known_for}.",
)
ORG_TEXTS = (
    "The {name} is {desc} founded in {founded} by {founder}. It is based in {seat}.",
    "The {name} is {desc} based in {seat}. It was established in {founded} by the {profession} {founder}.",
    "Founded by {founder} in {founded}, the {name} is {desc} with its seat in {seat}. It has about {members} "
    "members.",
    "The {name} is {desc} that has kept its archives, its reading room and its yearly lecture series going through "
    "wars, floods and lean years. It was founded in {founded} by {founder} and is based in {seat}.",
)

QTYPE_WEIGHTS = {"single": 0.5, "bridge": 0.3, "comparison": 0.2}


@dataclass(frozen=True)
class Sizes:
    """Entities of one world and the questions asked about them."""

    towns: int
    people: int
    orgs: int
    questions: int


TRAIN_SIZES = Sizes(towns=500, people=700, orgs=300, questions=1200)
HELDOUT_SIZES = Sizes(towns=160, people=220, orgs=100, questions=400)
TWIN_RATE = 0.35  # chance that a new entity is the near-duplicate of an earlier one of its kind without one


def real_words() -> frozenset[str]:
    """Words no invented name may be: the whole words of the default encoder's WordPiece vocabulary
    (bert-base-uncased: ~25k common English words and names) and every word of the shipped sample corpus (~20k,
    from 2,000 Wikipedia passages)."""
    from ziprl.retrieval.encoder import default_model_dir

    vocab = (default_model_dir() / "vocab.txt").read_text(encoding="utf-8").splitlines()
    sample = " ".join(f"{p.title} {p.text}" for p in load_corpus(SAMPLE_DIR / "corpus.jsonl.gz"))
    return frozenset(w for w in vocab if w.isalpha() and w.islower()) | frozenset(re.findall(r"[a-z]+", sample.lower()))


class Names:
    """Unique invented words from a seeded syllable generator, none of them in ``reserved``; :meth:`similar` makes a
    near-duplicate of one."""

    def __init__(self, rng: random.Random, reserved: frozenset[str]):
        self.rng, self.used = rng, set(reserved)

    def _word(self, syllables: int) -> str:
        r = self.rng
        parts = [r.choice(ONSETS) + r.choice(VOWELS) + (r.choice(MEDIALS) if r.random() < 0.3 else "")
                 for _ in range(syllables - 1)]
        parts.append(r.choice(ONSETS) + r.choice(VOWELS) + (r.choice(CODAS) if r.random() < 0.7 else ""))
        return "".join(parts)

    def _take(self, word: str) -> str | None:
        if word in self.used or _AWKWARD.search(word) or not 5 <= len(word) <= 10:
            return None
        self.used.add(word)
        return word.capitalize()

    def fresh(self, syllables: tuple[int, ...] = (2, 3)) -> str:
        while True:
            if name := self._take(self._word(self.rng.choice(syllables))):
                return name

    def similar(self, name: str) -> str:
        """A new word with one vowel of ``name`` changed (a fresh one if none is free)."""
        word = name.lower()
        for _ in range(20):
            i = self.rng.choice([i for i, c in enumerate(word) if c in VOWELS])
            vowel = self.rng.choice([v for v in VOWELS if v != word[i]])
            if found := self._take(word[:i] + vowel + word[i + 1:]):
                return found
        return self.fresh()


@dataclass(frozen=True)
class Town:
    name: str
    region: str
    river: str
    founded: int
    industry: str
    population: int
    text: int  # which of TOWN_TEXTS


@dataclass(frozen=True)
class Person:
    name: str
    born: int
    died: int
    birthplace: str
    workplace: str
    profession: str
    known_for: str
    pron: str  # he | she
    text: int


@dataclass(frozen=True)
class Org:
    name: str
    desc: str
    founded: int
    founder: str
    seat: str
    members: int
    text: int


@dataclass
class World:
    """One world's entities by name (insertion order is generation order) and each entity's near-duplicate twin."""

    towns: dict[str, Town] = field(default_factory=dict)
    people: dict[str, Person] = field(default_factory=dict)
    orgs: dict[str, Org] = field(default_factory=dict)
    twins: dict[str, str] = field(default_factory=dict)


def _name(rng: random.Random, names: Names, words: dict[str, str], w: World) -> tuple[str, str | None]:
    """A fresh word and None, or (at TWIN_RATE) a near-duplicate of the word of an earlier entity that has no twin
    yet, and that entity; ``words`` maps each earlier entity to its word."""
    free = [e for e in words if e not in w.twins]
    if not free or rng.random() >= TWIN_RATE:
        return names.fresh(), None
    twin = rng.choice(free)
    return names.similar(words[twin]), twin


def make_world(rng: random.Random, names: Names, sizes: Sizes) -> World:
    """Towns (each on a river, in a region), people (born in a town) and organisations (founded by a person,
    based in a town); regions and rivers are this world's own."""
    w = World()
    regions = [names.fresh() for _ in range(max(4, sizes.towns // 25))]
    rivers = [names.fresh() for _ in range(max(8, sizes.towns // 6))]
    words: dict[str, str] = {}  # entity -> the invented word a twin varies (a town's name, a surname, an org's)
    for _ in range(sizes.towns):
        name, twin = _name(rng, names, words, w)
        words[name] = name
        w.towns[name] = Town(name, rng.choice(regions), rng.choice(rivers), rng.randint(1050, 1850),
                             rng.choice(INDUSTRIES), rng.randrange(800, 60000, 100), rng.randrange(len(TOWN_TEXTS)))
        _pair(w, name, twin)
    towns, given = list(w.towns), [names.fresh((2,)) for _ in range(max(20, sizes.people // 6))]
    for _ in range(sizes.people):
        surname, twin = _name(rng, names, {p: words[p] for p in w.people}, w)
        first = twin.split()[0] if twin else rng.choice(given)  # a twin keeps the given name
        name, born = f"{first} {surname}", rng.randint(1600, 1920)
        words[name] = surname
        birthplace, profession = rng.choice(towns), rng.choice(list(PROFESSIONS))
        known = PROFESSIONS[profession].format(region=w.towns[birthplace].region, n=rng.randint(3, 40))
        w.people[name] = Person(name, born, born + rng.randint(35, 90), birthplace,
                                rng.choice([t for t in towns if t != birthplace]), profession, known,
                                rng.choice(("he", "she")), rng.randrange(len(PERSON_TEXTS)))
        _pair(w, name, twin)
    for founder in rng.sample(list(w.people), sizes.orgs):
        word, twin = _name(rng, names, {o: words[o] for o in w.orgs}, w)
        name, p = f"{word} {rng.choice(list(KINDS))}", w.people[founder]
        words[name] = word
        w.orgs[name] = Org(name, KINDS[name.split()[-1]], p.born + rng.randint(25, min(60, p.died - p.born)),
                           founder, rng.choice(towns), rng.randrange(20, 900, 10), rng.randrange(len(ORG_TEXTS)))
        _pair(w, name, twin)
    return w


def _pair(w: World, name: str, twin: str | None) -> None:
    if twin is not None:
        w.twins[name], w.twins[twin] = twin, name


# ---------------------------------------------------------------- passages


def passages(w: World) -> list[tuple[str, str]]:
    """(title, text) of every entity of ``w``: towns, then people, then organisations."""
    out = [(t.name, TOWN_TEXTS[t.text].format(**vars(t))) for t in w.towns.values()]
    for p in w.people.values():
        out.append((p.name, PERSON_TEXTS[p.text].format(**vars(p), Pron=p.pron.capitalize(),
                                                        pos="his" if p.pron == "he" else "her",
                                                        a="an" if p.profession[0] in VOWELS else "a",
                                                        region=w.towns[p.birthplace].region)))
    for o in w.orgs.values():
        out.append((o.name, ORG_TEXTS[o.text].format(**vars(o), profession=w.people[o.founder].profession)))
    return out


# ---------------------------------------------------------------- questions


def _river(t: Town) -> list[str]:
    return [f"{t.river} River", t.river]


def single_hop(rng: random.Random, w: World) -> tuple[str, list[str], list[str]]:
    """One fact of one passage: (question, answers, supporting titles)."""
    kind = rng.choice(("town", "person", "org"))
    if kind == "town":
        t = w.towns[rng.choice(list(w.towns))]
        q, a = rng.choice(((f"In what year was {t.name} founded?", [str(t.founded)]),
                           (f"Which river flows through {t.name}?", _river(t)),
                           (f"In which region is {t.name}?", [t.region, f"{t.region} region"])))
        return q, a, [t.name]
    if kind == "person":
        p = w.people[rng.choice(list(w.people))]
        q, a = rng.choice(((f"Where was {p.name} born?", [p.birthplace]),
                           (f"In what year was {p.name} born?", [str(p.born)]),
                           (f"What was the profession of {p.name}?", [p.profession])))
        return q, a, [p.name]
    o = w.orgs[rng.choice(list(w.orgs))]
    q, a = rng.choice(((f"In what year was the {o.name} founded?", [str(o.founded)]),
                       (f"Who founded the {o.name}?", [o.founder]),
                       (f"In which town is the {o.name} based?", [o.seat])))
    return q, a, [o.name]


def bridge(rng: random.Random, w: World) -> tuple[str, list[str], list[str]]:
    """Two hops: the first passage names the entity whose passage holds the answer."""
    if rng.random() < 0.5:
        p = w.people[rng.choice(list(w.people))]
        t = w.towns[p.birthplace]
        q, a = rng.choice(((f"What river flows through the birthplace of {p.name}?", _river(t)),
                           (f"In what year was the birthplace of {p.name} founded?", [str(t.founded)])))
        return q, a, [p.name, t.name]
    o = w.orgs[rng.choice(list(w.orgs))]
    f, t = w.people[o.founder], w.towns[o.seat]
    q, a, hop = rng.choice(((f"Where was the founder of the {o.name} born?", [f.birthplace], f.name),
                            (f"In what year was the founder of the {o.name} born?", [str(f.born)], f.name),
                            (f"Which river flows through the town where the {o.name} is based?", _river(t), t.name)))
    return q, a, [o.name, hop]


def comparison(rng: random.Random, w: World) -> tuple[str, list[str], list[str]]:
    """Which of two entities came first; the other is the first's near-duplicate twin when it has one, half the
    time."""
    kind = rng.choice(("town", "person", "org"))
    pool, year = {"town": (w.towns, "founded"), "person": (w.people, "born"), "org": (w.orgs, "founded")}[kind]
    while True:
        a = rng.choice(list(pool))
        b = w.twins[a] if a in w.twins and rng.random() < 0.5 else rng.choice(list(pool))
        ya, yb = getattr(pool[a], year), getattr(pool[b], year)
        if ya != yb:
            break
    first = a if ya < yb else b
    q = {"town": f"Which town was founded first, {a} or {b}?", "person": f"Who was born first, {a} or {b}?",
         "org": f"Which was founded first, the {a} or the {b}?"}[kind]
    return q, [first], [a, b]


QUESTION_MAKERS = {"single": single_hop, "bridge": bridge, "comparison": comparison}


def make_questions(rng: random.Random, w: World, n: int, split: str) -> list[QAExample]:
    """``n`` distinct questions about ``w``, their types drawn by QTYPE_WEIGHTS; ids ``invented-<split>-<i>``,
    source ``invented-<type>``."""
    types, weights = list(QTYPE_WEIGHTS), list(QTYPE_WEIGHTS.values())
    out: list[QAExample] = []
    seen: set[str] = set()
    while len(out) < n:
        qtype = rng.choices(types, weights)[0]
        q, answers, titles = QUESTION_MAKERS[qtype](rng, w)
        if q not in seen:
            seen.add(q)
            out.append(QAExample(f"invented-{split}-{len(out)}", q, answers, titles, f"invented-{qtype}"))
    return out


# ---------------------------------------------------------------- the whole data set


@dataclass
class Invented:
    """What :func:`generate` makes: the shared corpus, the questions of each split, and the two worlds."""

    corpus: list[Passage]
    train: list[QAExample]
    heldout: list[QAExample]
    worlds: dict[str, World]


def generate(seed: int = 0, train: Sizes = TRAIN_SIZES, heldout: Sizes = HELDOUT_SIZES) -> Invented:
    """Both worlds, their questions, and one corpus of all their passages in a seeded shuffle (ids ``inv-<n>``)."""
    rng = random.Random(seed)
    names = Names(rng, real_words())
    worlds = {"train": make_world(rng, names, train), "heldout": make_world(rng, names, heldout)}
    rows = passages(worlds["train"]) + passages(worlds["heldout"])
    rng.shuffle(rows)
    corpus = [Passage(f"inv-{i}", title, text) for i, (title, text) in enumerate(rows)]
    return Invented(corpus, make_questions(rng, worlds["train"], train.questions, "train"),
                    make_questions(rng, worlds["heldout"], heldout.questions, "heldout"), worlds)


def write_invented(out: str | Path, seed: int = 0) -> Invented:
    """Write ``corpus.jsonl.gz``, ``train.jsonl`` and ``heldout.jsonl`` of :func:`generate` (seed) under ``out``."""
    out = Path(out)
    data = generate(seed)
    write_corpus(data.corpus, out / "corpus.jsonl.gz")
    write_qa_jsonl(data.train, out / "train.jsonl")
    write_qa_jsonl(data.heldout, out / "heldout.jsonl")
    return data
