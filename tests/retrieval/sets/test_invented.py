"""The invented-entity datasets: reproducible from their seed, names that are no real word or sample title, a
held-out split by entity, questions whose supporting passages hold the answer, and a scripted teacher that plays
them through the real retriever."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter

import pytest

from tests.conftest import REPO
from ziprl.config import RetrieverConfig, ZipRLConfig
from ziprl.env.demos import synthesize
from ziprl.registry import DATASETS
from ziprl.retrieval.corpus import load_corpus
from ziprl.retrieval.datasets import SAMPLE_DIR, corpus_for, load_dataset
from ziprl.retrieval.retriever import Retriever
from ziprl.retrieval.sets.invented import INVENTED_DIR
from ziprl.retrieval.sets.invented_world import KINDS, generate, real_words, write_invented
from ziprl.scoring.metrics import normalize_answer

FILES = ("corpus.jsonl.gz", "train.jsonl", "heldout.jsonl")


@pytest.fixture(scope="module")
def data():
    return generate(0)


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def name_words(world) -> set[str]:
    """The invented words of a world: its titles (less the organisation kinds), regions and rivers."""
    titles = [*world.towns, *world.people, *world.orgs]
    places = [t.region + " " + t.river for t in world.towns.values()]
    return set().union(*map(words, titles + places)) - {k.lower() for k in KINDS}


def question_words(examples) -> set[str]:
    return set().union(*(words(" ".join([e.question, *e.answers, *e.supporting_titles])) for e in examples))


def test_same_seed_same_bytes_and_the_shipped_files_are_seed_0(tmp_path):
    write_invented(tmp_path / "a", seed=0)
    write_invented(tmp_path / "b", seed=0)
    write_invented(tmp_path / "c", seed=1)
    for name in FILES:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "c" / name).read_bytes()
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_invented.py"), "--out", str(tmp_path / "s")],
                   check=True, capture_output=True)
    for name in (*FILES, "README.md"):
        assert (tmp_path / "s" / name).read_bytes() == (INVENTED_DIR / name).read_bytes(), name


def test_shipped_data_is_small():
    assert sum((INVENTED_DIR / name).stat().st_size for name in FILES) < 500_000  # the issue allows 2 MB gzipped


def test_names_are_unique_invented_words_and_no_sample_title(data):
    titles = [p.title for p in data.corpus]
    assert len(set(titles)) == len(titles) == 1980
    train, held = name_words(data.worlds["train"]), name_words(data.worlds["heldout"])
    assert not train & held  # no word names an entity of both worlds
    invented = train | held
    assert len(invented) > 2000
    sample_titles = {p.title for p in load_corpus(SAMPLE_DIR / "corpus.jsonl.gz")}
    assert not set(titles) & sample_titles
    assert not invented & set().union(*map(words, sample_titles))
    assert not invented & real_words()  # no word of the encoder's vocabulary or of the sample corpus


def test_no_training_question_names_a_held_out_entity(data):
    train, held = load_dataset("invented"), load_dataset("invented-heldout")
    assert (len(train), len(held)) == (1200, 400)
    assert not question_words(train) & name_words(data.worlds["heldout"])
    assert not question_words(held) & name_words(data.worlds["train"])
    assert {t for e in held for t in e.supporting_titles} <= {*data.worlds["heldout"].towns,
                                                             *data.worlds["heldout"].people,
                                                             *data.worlds["heldout"].orgs}


def test_supporting_passages_exist_and_hold_the_answer():
    by_title = {p.title: p.text for p in load_corpus(corpus_for("invented"))}
    for ex in load_dataset("invented") + load_dataset("invented-heldout"):
        texts = [normalize_answer(by_title[t]) for t in ex.supporting_titles]
        holds = [any(normalize_answer(a) in text for a in ex.answers) for text in texts]
        if ex.source == "invented-bridge":  # the first passage names the second, which holds the answer
            assert holds[1], ex
            assert normalize_answer(ex.supporting_titles[1]) in texts[0], ex
        else:
            assert any(holds), ex


def test_a_spread_of_question_types(data):
    for examples in (data.train, data.heldout):
        types = Counter(e.source for e in examples)
        assert set(types) == {"invented-single", "invented-bridge", "invented-comparison"}
        assert types["invented-single"] >= 0.4 * len(examples)
        assert min(types.values()) >= 0.15 * len(examples)
        assert len({e.question for e in examples}) == len(examples)


def test_the_registry_lists_both_splits_over_one_corpus():
    assert {"invented", "invented-heldout"} <= set(DATASETS.names())
    assert corpus_for("invented-heldout") == corpus_for("invented") == INVENTED_DIR / "corpus.jsonl.gz"
    assert not DATASETS["invented"].files  # needs no shared data


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    cfg = RetrieverConfig(corpus=str(corpus_for("invented")), index_dir=str(tmp_path_factory.mktemp("index")))
    return Retriever.from_config(cfg)


@pytest.mark.parametrize("name", ["invented", "invented-heldout"])
def test_the_scripted_teacher_keeps_its_episodes_and_sees_the_answer(retriever, name):
    cfg = ZipRLConfig()
    cfg.env.max_turns, cfg.env.top_k = 5, 3
    examples = load_dataset(name)[:60]
    rows, counts = synthesize(cfg, examples, retriever, progress=False)
    assert counts["kept"] >= 0.9 * counts["episodes"]
    assert counts["episodes"] == 60
    seen = {}
    for r in rows:  # what the teacher's episodes showed it (search hits and opened passages), per question
        seen[r["question_id"]] = seen.get(r["question_id"], "") + r["messages"]
    grounded = sum(any(normalize_answer(a) in normalize_answer(seen.get(ex.id, "")) for a in ex.answers)
                   for ex in examples)
    assert grounded >= 0.9 * counts["kept"]
