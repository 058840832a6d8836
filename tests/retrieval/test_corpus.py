"""The JSONL corpus format: round trips and every validation error."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from ziprl.retrieval.corpus import CorpusError, corpus_sha256, load_corpus, write_corpus
from ziprl.retrieval.types import Passage

PASSAGES = [
    Passage("a", "Alpha", "First passage text."),
    Passage("b", "Beta", "Second passage, with ünïcode.", url="https://example.org/b"),
]


def _write(path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("name", ["c.jsonl", "c.jsonl.gz"])
def test_round_trip(tmp_path, name):
    path = write_corpus(PASSAGES, tmp_path / name)
    assert load_corpus(path) == PASSAGES
    assert not list(tmp_path.glob(".*tmp"))  # atomic write leaves no temp file


def test_gz_is_reproducible_and_hash_ignores_compression(tmp_path):
    a = write_corpus(PASSAGES, tmp_path / "a.jsonl.gz").read_bytes()
    b = write_corpus(PASSAGES, tmp_path / "b.jsonl.gz").read_bytes()
    assert a == b
    plain = load_corpus(write_corpus(PASSAGES, tmp_path / "c.jsonl"))
    assert corpus_sha256(plain) == corpus_sha256(load_corpus(tmp_path / "a.jsonl.gz"))
    assert corpus_sha256(plain) != corpus_sha256(plain[:1])


def test_blank_lines_are_skipped(tmp_path):
    rec = json.dumps({"id": "a", "title": "T", "text": "x"})
    assert len(load_corpus(_write(tmp_path / "c.jsonl", ["", rec, "   "]))) == 1


def test_missing_file(tmp_path):
    with pytest.raises(CorpusError, match=r"nope\.jsonl does not exist"):
        load_corpus(tmp_path / "nope.jsonl")


def test_empty_corpus(tmp_path):
    with pytest.raises(CorpusError, match="is empty"):
        load_corpus(_write(tmp_path / "c.jsonl", ["", ""]))


def test_non_utf8_names_the_line(tmp_path):
    path = tmp_path / "c.jsonl"
    good = json.dumps({"id": "a", "title": "T", "text": "x"}).encode()
    path.write_bytes(good + b"\n" + b'{"id": "b", "title": "\xff", "text": "x"}\n')
    with pytest.raises(CorpusError, match="line 2: not valid UTF-8"):
        load_corpus(path)


def test_malformed_json_names_the_line(tmp_path):
    rec = json.dumps({"id": "a", "title": "T", "text": "x"})
    with pytest.raises(CorpusError, match="line 2: malformed JSON"):
        load_corpus(_write(tmp_path / "c.jsonl", [rec, '{"id": "b", "title": ']))


@pytest.mark.parametrize("lines", [["5"], [json.dumps({"id": "a", "title": "T", "text": "x"}), "[1, 2]"]])
def test_not_an_object(tmp_path, lines):
    with pytest.raises(CorpusError, match=f"line {len(lines)}: expected a JSON object"):
        load_corpus(_write(tmp_path / "c.jsonl", lines))


def test_a_json_array_is_named_with_its_conversion(tmp_path):
    with pytest.raises(CorpusError, match=r"c\.jsonl is a JSON array, not JSONL \(one JSON object per line\); convert "
                                          r"it with: python -c .+ > \S+/c\.lines\.jsonl$"):
        load_corpus(_write(tmp_path / "c.jsonl", ["", "[1, 2]"]))


@pytest.mark.parametrize(("record", "problem"), [
    ({"title": "T", "text": "x"}, "'id' is missing"),
    ({"id": "a", "title": "  ", "text": "x"}, "'title' is empty"),
    ({"id": "a", "title": "T", "text": 3}, "'text' is not a string"),
    ({"id": "a", "title": "T"}, "'text' is missing"),
])
def test_required_fields(tmp_path, record, problem):
    ok = json.dumps({"id": "z", "title": "T", "text": "x"})
    with pytest.raises(CorpusError, match=f"line 2: field {problem}"):
        load_corpus(_write(tmp_path / "c.jsonl", [ok, json.dumps(record)]))


def test_bad_url(tmp_path):
    with pytest.raises(CorpusError, match="'url' must be a string"):
        load_corpus(_write(tmp_path / "c.jsonl", [json.dumps({"id": "a", "title": "T", "text": "x", "url": 5})]))


def test_duplicate_ids_name_id_and_lines(tmp_path):
    lines = [json.dumps({"id": i, "title": "T", "text": "x"}) for i in ("a", "b", "a")]
    with pytest.raises(CorpusError, match="duplicate id 'a' on lines 1 and 3"):
        load_corpus(_write(tmp_path / "c.jsonl", lines))


def test_corrupt_gzip(tmp_path):
    path = tmp_path / "c.jsonl.gz"
    lines = "".join(json.dumps({"id": str(i), "title": "T", "text": "x"}) + "\n" for i in range(50))
    path.write_bytes(gzip.compress(lines.encode())[:-6])  # valid lines, cut short
    with pytest.raises(CorpusError, match="cannot be read"):
        load_corpus(path)


DEEP = "[" * 100_000 + "]" * 100_000  # deeper than the JSON parser's recursion limit


@pytest.mark.parametrize("name", ["c.jsonl", "c.jsonl.gz"])
def test_a_line_nested_too_deeply_names_the_line(tmp_path, name):
    path = tmp_path / name
    data = (json.dumps({"id": "a", "title": "T", "text": "x"}) + "\n" + DEEP + "\n").encode()
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    with pytest.raises(CorpusError, match="line 2: JSON nested too deeply; each line must be one JSON object"):
        load_corpus(path)


@pytest.mark.parametrize(("doc_id", "problem"), [
    ("  x  ", "whitespace other than single spaces between words"),
    ("x  y", "whitespace other than single spaces between words"),
    ("e\nf", "whitespace other than single spaces between words"),
    ("a\tb", "whitespace other than single spaces between words"),
    ("a\u00a0b", "whitespace other than single spaces between words"),
    ("a] b", "holds ']', which a search result uses to mark the id"),
    ("[x", "holds '[', which a search result uses to mark the id"),
    ("a\u2023b", "holds '\u2023', which a search result uses to mark the id"),
    ("x" * 201, "is 201 characters, more than 200; use shorter ids"),
    ("ab\ud800", "holds a lone surrogate (U+D800 at character 2), which is not a character; ids must be exact"),
])
def test_an_id_the_agent_cannot_address_is_refused_naming_the_line(tmp_path, doc_id, problem):
    ok = json.dumps({"id": "ab\ufffd", "title": "T", "text": "x"})  # what a lone surrogate used to become
    with pytest.raises(CorpusError, match=f"line 2: id .+ {re.escape(problem)}"):
        load_corpus(_write(tmp_path / "c.jsonl", [ok, json.dumps({"id": doc_id, "title": "T", "text": "y"})]))


def test_ids_with_single_spaces_and_200_characters_load(tmp_path):
    ids = ["a b c", "x" * 200, "(paren) & <angle>", "ünï-cödé 1"]
    lines = [json.dumps({"id": i, "title": "T", "text": "x"}) for i in ids]
    assert [p.doc_id for p in load_corpus(_write(tmp_path / "c.jsonl", lines))] == ids


@pytest.mark.parametrize("name", ["sample", "invented"])
def test_every_id_of_a_shipped_corpus_is_addressable(name):
    from ziprl.retrieval.corpus import id_problem
    from ziprl.retrieval.datasets import corpus_for

    passages = load_corpus(corpus_for(name))  # refuses any id the agent could not address
    assert len(passages) > 1000
    assert not [p.doc_id for p in passages if id_problem(p.doc_id)]


@pytest.mark.parametrize("name", ["c.jsonl", "c.jsonl.gz"])
def test_a_byte_order_mark_opening_the_file_is_skipped(tmp_path, name):
    path = tmp_path / name
    data = "\ufeff" + "".join(json.dumps({"id": p.doc_id, "title": p.title, "text": p.text, "url": p.url}) + "\n"
                              for p in PASSAGES)
    path.write_bytes(gzip.compress(data.encode()) if name.endswith(".gz") else data.encode())
    assert load_corpus(path) == PASSAGES


def test_a_corpus_is_scanned_once_a_process_until_it_changes(tmp_path, monkeypatch):
    """A command checks its corpus in full before writing, then builds its index from it: one read, not two."""
    from ziprl.retrieval import corpus as module

    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "a", "title": "A", "text": "x"}\n')
    reads = []
    real = module.iter_corpus
    monkeypatch.setattr(module, "iter_corpus", lambda p: reads.append(p) or real(p))
    first = module.scan_corpus(path)
    assert module.scan_corpus(str(path)) is first and len(reads) == 1
    path.write_text('{"id": "a", "title": "A", "text": "x"}\n{"id": "b", "title": "B", "text": "y"}\n')
    assert module.scan_corpus(path).count == 2 and len(reads) == 2
