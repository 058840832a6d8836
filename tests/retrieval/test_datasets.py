"""QA loaders, the pooled corpus and the shipped sample."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from ziprl.registry import DATASETS
from ziprl.retrieval.corpus import load_corpus
from ziprl.retrieval.datasets import (
    DEPRECATED_SHARED_ENV,
    SHARED_ENV,
    DatasetError,
    corpus_for,
    default_shared_dir,
    load_dataset,
    load_qa_jsonl,
    shared_file,
    write_qa_jsonl,
)
from ziprl.retrieval.sets import hotpotqa, hotpotqa_dev, musique, musique_dev, wiki18
from ziprl.retrieval.sets import squad as squad_set
from ziprl.retrieval.sets.hotpotqa import (
    hotpot_distractor_paragraphs,
    load_hotpot_distractor,
    load_hotpot_train,
    split_title,
)
from ziprl.retrieval.sets.hotpotqa_dev import load_hotpot_dev
from ziprl.retrieval.sets.musique import load_musique_train
from ziprl.retrieval.sets.musique_dev import load_musique_dev
from ziprl.retrieval.sets.pooled import context_paragraphs
from ziprl.retrieval.sets.squad import load_squad_dev
from ziprl.retrieval.sets.wiki18 import wiki18_passages
from ziprl.retrieval.types import QAExample


def _shared() -> Path:
    try:
        return default_shared_dir()
    except DatasetError as exc:
        pytest.skip(f"needs the data directory: {exc}")


@pytest.fixture(scope="module")
def pooled_corpus(tmp_path_factory):
    shared = _shared()
    return load_corpus(corpus_for("pooled", shared, cache_dir=tmp_path_factory.mktemp("corpora")))


# ---------------------------------------------------------------- shipped sample (no ../shared needed)


def test_sample_loads_without_shared(monkeypatch, tmp_path):
    monkeypatch.setenv(SHARED_ENV, str(tmp_path / "absent"))
    qa = load_dataset("sample")
    corpus = load_corpus(corpus_for("sample"))
    assert len(qa) == 60
    assert {e.source for e in qa} == {"hotpotqa-train", "musique-train"}
    assert 1500 <= len(corpus) <= 2500
    titles = {p.title for p in corpus}
    for e in qa:
        assert e.answers
        assert e.supporting_titles
        assert set(e.supporting_titles) <= titles, e.id
    files = list(corpus_for("sample").parent.iterdir())
    assert {f.name for f in files} >= {"qa.jsonl", "corpus.jsonl.gz", "ATTRIBUTION.md"}
    assert sum(f.stat().st_size for f in files) < 5_000_000


def test_sample_is_reproducible(tmp_path):
    _shared()
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_sample.py"), "--out", str(tmp_path)], check=True,
                   capture_output=True)
    shipped = REPO / "ziprl" / "data" / "sample"
    for name in ("qa.jsonl", "corpus.jsonl.gz", "ATTRIBUTION.md"):
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes(), name


# ---------------------------------------------------------------- names, limits, errors


def test_missing_shared_dir_names_path_and_env(monkeypatch, tmp_path):
    monkeypatch.setenv(SHARED_ENV, str(tmp_path / "absent"))
    with pytest.raises(DatasetError, match=rf"absent.*{SHARED_ENV}"):
        default_shared_dir()
    with pytest.raises(DatasetError, match=SHARED_ENV):
        load_dataset("hotpotqa")


def test_no_data_directory_given_says_where_to_get_the_data(monkeypatch):
    monkeypatch.delenv(SHARED_ENV, raising=False)
    monkeypatch.delenv(DEPRECATED_SHARED_ENV, raising=False)
    with pytest.raises(DatasetError, match=r"none is given: set ZIPRL_DATA=.*HotpotQA, MuSiQue and SQuAD.*docs/data.md"):
        load_dataset("pooled")
    assert len(load_dataset("sample")) == 60  # the shipped sets need none


def test_the_old_variable_is_still_read_with_a_warning(monkeypatch, tmp_path):
    monkeypatch.delenv(SHARED_ENV, raising=False)
    monkeypatch.setenv(DEPRECATED_SHARED_ENV, str(tmp_path))
    with pytest.warns(DeprecationWarning, match="ZIPRL_SHARED_DATA is deprecated.*set ZIPRL_DATA"):
        assert default_shared_dir() == tmp_path


def test_missing_file_in_shared_dir(tmp_path):
    with pytest.raises(DatasetError, match="hipporag_musique_train_subset100.json.gz does not exist"):
        load_dataset("musique", shared_dir=tmp_path)


def test_unknown_name():
    with pytest.raises(DatasetError, match="unknown dataset 'nope'"):
        load_dataset("nope")
    with pytest.raises(DatasetError, match="corpus only"):
        load_dataset("wiki18")
    with pytest.raises(DatasetError, match="unknown dataset"):
        corpus_for("nope")


def test_limit_is_a_seeded_ordered_subset():
    full = load_dataset("sample")
    a, b = load_dataset("sample", limit=10, seed=3), load_dataset("sample", limit=10, seed=3)
    assert [e.id for e in a] == [e.id for e in b]
    assert len(a) == 10
    pos = [[e.id for e in full].index(e.id) for e in a]
    assert pos == sorted(pos)
    assert [e.id for e in load_dataset("sample", limit=10, seed=4)] != [e.id for e in a]
    assert len(load_dataset("sample", limit=1000)) == len(full)
    with pytest.raises(DatasetError, match="limit must be >= 1"):
        load_dataset("sample", limit=0)


def test_unified_jsonl_round_trip_and_sibling_corpus(tmp_path):
    ex = [QAExample("q1", "Who?", ["Ann", "Anne"], ["T"], "mine"), QAExample("q2", "What?", ["x"])]
    path = write_qa_jsonl(ex, tmp_path / "qa.jsonl")
    assert load_dataset(str(path)) == ex
    with pytest.raises(DatasetError, match="no corpus.jsonl"):
        corpus_for(str(path))
    (tmp_path / "corpus.jsonl.gz").write_bytes(b"")
    assert corpus_for(str(path)) == tmp_path / "corpus.jsonl.gz"


@pytest.mark.parametrize(("line", "match"), [
    ('{"id": "a", "question": "Q", "answers": ["x"]}\n{"id": ', "line 2: malformed JSON"),
    ('{"id": "a", "answers": ["x"]}', "line 1: field 'question' is missing"),
    ('{"id": "a", "question": "Q", "answers": []}', "line 1: field 'answers' is an empty list; give at least one"),
    ('{"id": "a", "question": "  ", "answers": ["x"]}', "line 1: field 'question' is empty"),
    ('{"id": "a", "question": "Q", "answers": ["x", 3]}', r"line 1: answers\[1\] is int, expected a non-empty string"),
    ('{"id": "a", "question": "Q", "answers": [" "]}', r"line 1: answers\[0\] is empty, expected a non-empty string"),
    ('{"id": "a", "question": "Q", "answers": ["x"]}\n' + "[" * 100_000 + "]" * 100_000,
     "line 2: JSON nested too deeply; each line must be one JSON object"),
    ('{"id": "a", "question": "Q", "answers": ["x"], "supporting_titles": "T"}', "supporting_titles must be a list"),
    ('{"id": "a", "question": "Q", "answers": ["x"]}\n{"id": "a", "question": "R", "answers": ["y"]}',
     "duplicate id 'a' on lines 1 and 2"),
    ("", "holds no questions"),
])
def test_malformed_unified_jsonl(tmp_path, line, match):
    path = tmp_path / "qa.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=match):
        load_qa_jsonl(path)


def test_malformed_source_files(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps([{"question": "Q", "answer": "A", "supporting_facts": []}]))
    with pytest.raises(DatasetError, match="record 0: field '_id' is missing"):
        load_hotpot_train(path)
    path.write_text(json.dumps({"not": "a list"}))
    with pytest.raises(DatasetError, match="expected a JSON list, got dict"):
        load_musique_train(path)
    path.write_text("[{")
    with pytest.raises(DatasetError, match="malformed JSON at line 1"):
        load_squad_dev(path)


@pytest.mark.parametrize(("paragraph", "title"), [
    ("Ed Wood (film). Ed Wood is a 1994 film.  It stars Johnny Depp.", "Ed Wood (film)"),
    ("1995–96 Manchester United F.C. season. The 1995–96 season was their fourth.  More.", "1995–96 Manchester United F.C. season"),
    ("Edgar Kaiser Jr.. Edgar Fosburgh Kaiser Jr. (born 1942) was a financier.", "Edgar Kaiser Jr."),
    ("James P. Comer. James P. Comer (born 1934) is a professor.", "James P. Comer"),
    ("Hikky Burr. theme song for a show, released in 1969.  It was written by Quincy Jones.", "Hikky Burr"),
    ("Ken St. Andre. Kenneth Eugene St. Andre (born 1947) is an author.", "Ken St. Andre"),
    ("Farrukhzad Khosrow V. Farrukhzad Khosrau V was briefly king.  He was the son of Khosrau II.", "Farrukhzad Khosrow V"),
])
def test_split_title(paragraph, title):
    t, text = split_title(paragraph)
    assert t == title
    assert paragraph.endswith(text)
    assert text


# ---------------------------------------------------------------- shared-data loaders (skip without ../shared)


def test_hotpot_loaders():
    shared = _shared()
    train = load_hotpot_train(shared_file(hotpotqa.TRAIN, shared))
    assert len(train) == 100
    assert all(e.supporting_titles and e.answers[0] for e in train)
    assert train[0].supporting_titles == ["Alû", "Lilu (mythology)"]
    dev = load_hotpot_distractor(shared_file(hotpotqa.DISTRACTOR, shared))
    assert len(dev) == 300
    assert dev[0].answers == ["yes"]
    assert not dev[0].supporting_titles
    pars = hotpot_distractor_paragraphs(shared_file(hotpotqa.DISTRACTOR, shared))
    assert pars[0][1][0] == "Scott Derrickson"
    assert sum(map(len, pars.values())) > 2900
    qa = load_hotpot_dev(shared_file(hotpotqa_dev.DEV, shared))
    assert len(qa) == 7405
    assert qa[0].question.startswith("Were Scott Derrickson")


def test_musique_squad_wiki18_loaders():
    shared = _shared()
    train = load_musique_train(shared_file(musique.TRAIN, shared))
    assert len(train) == 100
    assert all(1 <= len(e.supporting_titles) <= 4 for e in train)
    assert train[0].answers == ["G. Stanley Hall", "Stanley Hall"]  # answer + aliases
    dev = load_musique_dev(shared_file(musique_dev.DEV, shared))
    assert len(dev) == 2417
    assert dev[0].answers == ["Miquette Giraudy"]
    squad = load_squad_dev(shared_file(squad_set.DEV, shared))
    assert len(squad) == 10570
    assert squad[0].answers == ["Denver Broncos"]
    wiki = wiki18_passages(shared_file(wiki18.PASSAGES, shared))
    assert len(wiki) == 1000
    assert wiki[0].title == "Evan Morris"
    assert not wiki[0].text.startswith('"')


@pytest.mark.parametrize(("name", "count"), [("hotpotqa", 400), ("musique", 100), ("pooled", 500),
                                             ("hotpotqa-dev", 7405), ("musique-dev", 2417), ("squad", 10570)])
def test_named_datasets(name, count):
    qa = load_dataset(name, _shared())
    assert len(qa) == count
    assert len({e.id for e in qa}) == count
    assert all(e.question and e.answers and e.source for e in qa)


def test_pooled_corpus(pooled_corpus):
    assert len(pooled_corpus) > 6000
    assert len({(p.title, p.text) for p in pooled_corpus}) == len(pooled_corpus)
    assert all(p.text == " ".join(p.text.split()) for p in pooled_corpus)
    titles = {p.title for p in pooled_corpus}
    for e in load_dataset("pooled", _shared()):
        assert set(e.supporting_titles) <= titles, e.id
    pairs = {(p.title, p.text) for p in pooled_corpus}
    contexts = context_paragraphs(_shared())
    assert len(contexts) == 500
    assert all(par in pairs for pars in contexts.values() for par in pars)


def test_pooled_corpus_is_materialised_once(tmp_path, caplog):
    shared = _shared()
    first = corpus_for("pooled", shared, cache_dir=tmp_path)
    mtime = first.stat().st_mtime_ns
    assert corpus_for("hotpotqa", shared, cache_dir=tmp_path) == first
    assert first.stat().st_mtime_ns == mtime
    assert first.parent == tmp_path
    assert first.name.startswith("pooled-")
    with caplog.at_level("WARNING"):
        assert corpus_for("squad", shared, cache_dir=tmp_path) == first
    assert "open-domain" in caplog.text
    wiki = load_corpus(corpus_for("wiki18", shared, cache_dir=tmp_path))
    assert len(wiki) == 1000


@pytest.mark.parametrize("damage", ["cut at a line", "cut mid-line", "no digest"])
def test_a_damaged_cached_corpus_is_built_again(tmp_path, damage):
    """A cached corpus cut short (a full disk, a user's ``head``) was trusted by its name: a run searched 300 of 6,850
    passages without a word, or stopped on a malformed line of a file the user never wrote."""
    shared = _shared()
    first = corpus_for("pooled", shared, cache_dir=tmp_path)
    whole = first.read_bytes()
    if damage == "no digest":
        first.with_name(first.name + ".sha256").unlink()
    else:
        cut = whole.index(b"\n", len(whole) // 2) + (1 if damage == "cut at a line" else -5)
        first.write_bytes(whole[:cut])
    assert corpus_for("pooled", shared, cache_dir=tmp_path) == first
    assert first.read_bytes() == whole


def test_all_shared_files_listed_exist():
    shared = _shared()
    assert all((shared / rel).is_file() for name in DATASETS for rel in DATASETS[name].files)


# ---------------------------------------------------------------- the registry of named datasets


def test_every_name_is_registered_in_order():
    assert DATASETS.names() == ("sample", "hotpotqa", "musique", "pooled", "hotpotqa-dev", "musique-dev", "squad",
                                "wiki18", "invented", "invented-heldout")
    assert [n for n in DATASETS if DATASETS[n].open_domain] == ["hotpotqa-dev", "musique-dev", "squad"]


def test_a_dataset_registered_in_a_test_is_all_it_takes(tmp_path, monkeypatch):
    """One spec: load_dataset, limit and corpus_for take its name; a spec may share another dataset's corpus."""
    from ziprl.retrieval.datasets import DatasetSpec

    qa = write_qa_jsonl([QAExample(f"t{i}", f"Question {i}?", [str(i)]) for i in range(4)], tmp_path / "qa.jsonl")
    DATASETS.names()
    spec = DatasetSpec(lambda shared_dir: load_qa_jsonl(qa), "sample", open_domain=True)
    monkeypatch.setitem(DATASETS._entries, "tiny-set", (50, spec))
    assert [e.id for e in load_dataset("tiny-set")] == ["t0", "t1", "t2", "t3"]
    assert len(load_dataset("tiny-set", limit=2)) == 2
    assert corpus_for("tiny-set") == corpus_for("sample")


def test_only_dataset_names_may_hold_hyphens():
    from ziprl.registry import Registry

    with pytest.raises(ValueError, match=r"lower-case identifier \(a-z, 0-9, _\)"):
        Registry("thing", "nowhere").register("a-b")
    Registry("set", "nowhere", hyphens=True).register("a-b")(object())


@pytest.mark.parametrize("gold", ["!!!", ".", "the", "A.", " an , the "])
def test_a_gold_answer_that_normalises_to_nothing_is_refused(tmp_path, gold):
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"id": "a", "question": "Q", "answers": ["x"]}) + "\n"
                    + json.dumps({"id": "b", "question": "Q", "answers": ["Paris", gold]}) + "\n")
    with pytest.raises(DatasetError, match=r"line 2: answers\[1\] .+ is only punctuation and articles \(a, an, the\), "
                                           "which EM and F1 remove, so no answer could ever match it; write the "
                                           "answer's words, or drop it"):
        load_qa_jsonl(path)


def test_a_json_file_nested_too_deeply_is_a_dataset_error(tmp_path):
    path = tmp_path / "qa.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DatasetError, match="qa.json: JSON nested too deeply; it must be a JSON list of objects"):
        load_qa_jsonl(path)


@pytest.mark.parametrize("name", ["qa.json", "qa.json.gz"])
def test_a_json_file_holding_jsonl_says_to_rename_it(tmp_path, name):
    import gzip

    text = "".join(json.dumps({"id": f"q{i}", "question": "Q", "answers": ["x"]}) + "\n" for i in range(2))
    path = tmp_path / name
    path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    renamed = name.replace(".json", ".jsonl")
    with pytest.raises(DatasetError, match=rf"malformed JSON at line 2 \(Extra data\); it holds one JSON object per "
                                           rf"line \(JSONL\): name it {re.escape(renamed)}$"):
        load_qa_jsonl(path)
    (tmp_path / renamed).write_bytes(path.read_bytes())
    assert [e.id for e in load_qa_jsonl(tmp_path / renamed)] == ["q0", "q1"]


def test_malformed_json_that_is_not_jsonl_gets_no_rename_hint(tmp_path):
    path = tmp_path / "qa.json"
    path.write_text('[{"id": "q0"}] x')
    with pytest.raises(DatasetError, match=r"\(Extra data\)$"):
        load_qa_jsonl(path)


@pytest.mark.parametrize("name", ["qa.jsonl", "qa.json"])
def test_a_byte_order_mark_opening_a_qa_file_is_skipped(tmp_path, name):
    ex = [QAExample("q1", "Who?", ["Ann"], ["T"], "mine")]
    path = write_qa_jsonl(ex, tmp_path / "plain.jsonl")
    text = path.read_text()
    if name.endswith(".json"):
        text = json.dumps([json.loads(line) for line in text.splitlines()])
    (tmp_path / name).write_text("\ufeff" + text, encoding="utf-8")
    assert load_qa_jsonl(tmp_path / name) == ex


def test_corpus_source_finds_a_corpus_without_building_one(tmp_path):
    from ziprl.retrieval.datasets import SAMPLE_DIR, corpus_source

    qa = write_qa_jsonl([QAExample("q1", "Who?", ["Ann"])], tmp_path / "qa.jsonl")
    (tmp_path / "corpus.jsonl").write_text("")
    assert corpus_source(str(qa)) == (tmp_path / "corpus.jsonl").resolve()
    assert corpus_source("sample") == corpus_source(str(SAMPLE_DIR / "qa.jsonl")) == SAMPLE_DIR / "corpus.jsonl.gz"
    assert corpus_source("invented-heldout") == corpus_source("invented") == corpus_for("invented").resolve()
    assert [corpus_source(n) for n in ("hotpotqa", "musique", "squad", "pooled", "wiki18")] == [
        "pooled", "pooled", "pooled", "pooled", "wiki18"]  # built from shared files: named, not built
