"""The JSONL corpus format: round trips and every validation error."""

from __future__ import annotations

import gzip
import json

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
