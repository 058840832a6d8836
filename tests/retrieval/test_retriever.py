"""FAISS retriever with the real MiniLM encoder on small slices of the shipped sample corpus."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import faiss
import numpy as np
import pytest

from ziprl.cli.index import main as cli
from ziprl.config import RetrieverConfig
from ziprl.retrieval import index_build as IB
from ziprl.retrieval import retriever as R
from ziprl.retrieval.corpus import CorpusError, load_corpus, write_corpus
from ziprl.retrieval.datasets import corpus_for
from ziprl.retrieval.retriever import (
    Encoder,
    Retriever,
    RetrieverError,
    UnknownDocument,
    build_index,
    default_index_dir,
)
from ziprl.retrieval.types import Passage

N = 24


@pytest.fixture(scope="module")
def passages() -> list[Passage]:
    """N sample passages with distinct titles (so a title query has one right answer)."""
    seen, out = set(), []
    for p in load_corpus(corpus_for("sample")):
        if p.title not in seen and len(p.text) > 120:
            seen.add(p.title)
            out.append(p)
    return out[:N]


@pytest.fixture(scope="module")
def corpus(passages, tmp_path_factory):
    return write_corpus(passages, tmp_path_factory.mktemp("corpus") / "small.jsonl")


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return Encoder()


@pytest.fixture(scope="module")
def flat_dir(corpus, encoder, tmp_path_factory):
    return build_index(corpus, tmp_path_factory.mktemp("idx") / "flat", encoder, progress=False)


@pytest.fixture(scope="module")
def retriever(flat_dir, encoder) -> Retriever:
    return Retriever.load(flat_dir, encoder)


class CountingEncoder(Encoder):
    """The real encoder, counting passage encodes (to see whether a build re-encoded)."""

    def __init__(self, base: Encoder):
        super().__init__()
        self._model, self.passage_calls = base.model, 0

    def encode_passages(self, texts, batch_size=None, progress=False):
        self.passage_calls += 1
        return super().encode_passages(texts, batch_size, progress)


def test_env_layer_imports_without_torch():
    code = ("import sys, ziprl.retrieval.retriever, ziprl.retrieval.datasets, ziprl.cli.index; "
            "bad = [m for m in ('torch', 'sentence_transformers', 'transformers') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_index_files_and_manifest(flat_dir, passages):
    assert {p.name for p in flat_dir.iterdir()} == {"index.faiss", "passages.arrow", "id_hash.npy", "id_row.npy",
                                                     "manifest.json", ".ziprl-run", ".ziprl-lock"}
    m = json.loads((flat_dir / "manifest.json").read_text())
    assert m["count"] == N
    assert m["dim"] == 384
    assert m["index_type"] == "flat"
    assert m["factory"] == "Flat"
    assert m["shards"] == 1
    assert m["shard_counts"] == [N]
    assert m["format"] == 2
    assert m["encoder"] == R.DEFAULT_ENCODER_ID
    assert m["query_prefix"] == m["passage_prefix"] == ""
    assert len(m["corpus_sha256"]) == 64
    assert not [p for p in flat_dir.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_title_query_finds_its_passage(retriever, passages):
    hits = retriever.search([p.title for p in passages], 3)
    top1 = sum(h[0].doc_id == p.doc_id for h, p in zip(hits, passages, strict=True))
    assert top1 >= 0.9 * N
    assert all(p.doc_id in [x.doc_id for x in h] for h, p in zip(hits, passages, strict=True))


def test_hits(retriever, passages):
    (hits,) = retriever.search([passages[0].title], 5)
    assert len(hits) == 5
    assert len(retriever) == N
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert all(-1.0001 <= h.score <= 1.0001 for h in hits)
    text = {p.doc_id: p.text for p in passages}
    assert all(h.snippet == text[h.doc_id][:200] for h in hits)
    assert retriever.search([], 3) == []


def test_batched_equals_single(retriever, passages):
    queries = [f"who or what is {p.title}?" for p in passages[:6]]
    batched = retriever.search(queries, 4)
    for q, b in zip(queries, batched, strict=True):
        (single,) = retriever.search([q], 4)
        assert [h.doc_id for h in single] == [h.doc_id for h in b]
        assert np.allclose([h.score for h in single], [h.score for h in b], atol=1e-4)


def test_search_embeddings(retriever, encoder, passages):
    vec = encoder.encode_queries([passages[2].title])
    assert retriever.search_embeddings(vec, 2) == retriever.search([passages[2].title], 2)
    with pytest.raises(RetrieverError, match=r"shape \(n, 384\)"):
        retriever.search_embeddings(np.zeros((1, 8), np.float32), 2)


def test_open_returns_full_text(retriever, passages):
    p = passages[5]
    assert retriever.open(p.doc_id) == p
    assert retriever.open(f" {p.doc_id}\n") == p


def test_unknown_id_is_a_key_error_naming_it(retriever):
    with pytest.raises(KeyError, match="no-such-doc") as info:
        retriever.open("no-such-doc")
    assert isinstance(info.value, UnknownDocument)
    assert "unknown document id 'no-such-doc'" in str(info.value)


@pytest.mark.parametrize(("queries", "match"), [
    (["fine", "  "], "query 1 is empty"),
    ([""], "query 0 is empty"),
    (["ok", None], "query 1 is empty or not a string"),
    ("a string", "must be a list of strings"),
])
def test_bad_queries(retriever, queries, match):
    with pytest.raises(RetrieverError, match=match):
        retriever.search(queries, 2)


@pytest.mark.parametrize("k", [0, -1, N + 1, 2.5, True])
def test_bad_k(retriever, k):
    with pytest.raises(RetrieverError, match=rf"k must be an integer in 1\.\.{N}"):
        retriever.search(["query"], k)


def test_reuse_unchanged_corpus_does_not_reencode(corpus, flat_dir, encoder, caplog):
    counting = CountingEncoder(encoder)
    before = {p.name: p.stat().st_mtime_ns for p in flat_dir.iterdir()}
    with caplog.at_level("INFO", logger="ziprl.retrieval.index_build"):
        assert build_index(corpus, flat_dir, counting, progress=False) == flat_dir
    assert counting.passage_calls == 0
    assert "reusing" in caplog.text
    assert {p.name: p.stat().st_mtime_ns for p in flat_dir.iterdir()} == before


def test_rebuild_when_corpus_or_settings_change(passages, encoder, tmp_path):
    counting = CountingEncoder(encoder)
    corpus, out = tmp_path / "c.jsonl", tmp_path / "idx"
    write_corpus(passages[:4], corpus)
    build_index(corpus, out, counting, progress=False)
    write_corpus(passages[:5], corpus)
    with pytest.raises(RetrieverError, match="other inputs or settings; nothing was written: pass --overwrite"):
        build_index(corpus, out, counting, progress=False)  # a library call replaces an index only when told to
    build_index(corpus, out, counting, progress=False, overwrite=True)
    assert counting.passage_calls == 2
    r = Retriever.load(out, encoder)
    assert len(r) == 5
    assert r.search([passages[4].title], 1)[0][0].doc_id == passages[4].doc_id
    build_index(corpus, out, counting, index_type="hnsw", progress=False, overwrite=True)
    assert counting.passage_calls == 3
    assert json.loads((out / "manifest.json").read_text())["index_type"] == "hnsw"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_hnsw(passages, encoder, tmp_path):
    small = passages[:8]
    out = build_index(write_corpus(small, tmp_path / "c.jsonl"), tmp_path / "hnsw", encoder, "hnsw", progress=False)
    r = Retriever.load(out, encoder)
    assert isinstance(r.index, faiss.IndexHNSWFlat)
    assert len(r) == 8
    hits = r.search([p.title for p in small], 8)
    assert sum(h[0].doc_id == p.doc_id for h, p in zip(hits, small, strict=True)) >= 7
    assert all(len(h) == 8 for h in hits)


def test_failed_build_keeps_the_old_index(passages, encoder, tmp_path, monkeypatch):
    corpus, out = write_corpus(passages[:3], tmp_path / "c.jsonl"), tmp_path / "idx"
    build_index(corpus, out, encoder, progress=False)
    write_corpus(passages[:4], corpus)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    with monkeypatch.context() as m:
        m.setattr(IB, "atomic_write_json", crash)
        with pytest.raises(OSError, match="disk full"):
            build_index(corpus, out, encoder, progress=False, overwrite=True)
    assert len(Retriever.load(out, encoder)) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [".idx.partial", "c.jsonl", "idx"]  # kept to resume
    build_index(corpus, out, encoder, progress=False, overwrite=True)
    assert len(Retriever.load(out, encoder)) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "idx"]


def test_build_input_errors(corpus, encoder, tmp_path):
    with pytest.raises(CorpusError, match="does not exist"):
        build_index(tmp_path / "missing.jsonl", tmp_path / "out", encoder)
    with pytest.raises(RetrieverError, match="'ivf' is not a FAISS factory string"):
        build_index(corpus, tmp_path / "out", encoder, index_type="ivf")
    with pytest.raises(RetrieverError, match="usable at dim 384"):
        build_index(corpus, tmp_path / "out", encoder, index_type="IVF4,PQ7")  # 384 is not a multiple of 7
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(RetrieverError, match="not a ZipRL index"):
        build_index(corpus, tmp_path / "busy", encoder)
    with pytest.raises(RetrieverError, match="is not a directory"):
        Encoder(tmp_path / "no-model")


def test_load_errors(flat_dir, encoder, tmp_path):
    with pytest.raises(RetrieverError, match="does not exist"):
        Retriever.load(tmp_path / "nothing", encoder)
    broken = shutil.copytree(flat_dir, tmp_path / "broken")
    (broken / "passages.arrow").unlink()
    with pytest.raises(RetrieverError, match=r"incomplete \(missing passages.arrow\)"):
        Retriever.load(broken, encoder)
    bad = shutil.copytree(flat_dir, tmp_path / "bad")
    m = json.loads((bad / "manifest.json").read_text())
    (bad / "manifest.json").write_text(json.dumps({**m, "shard_counts": [N + 1]}))
    with pytest.raises(RetrieverError, match=rf"manifest.json is damaged \(shard_counts is \[{N + 1}\], not a list of "
                                             rf"1 integers >= 1 summing to count {N}\); rebuild it with: "):
        Retriever.load(bad, encoder)
    (bad / "manifest.json").write_text(json.dumps({**m, "count": N + 1, "shard_counts": [N + 1]}))
    with pytest.raises(RetrieverError, match="does not match its manifest"):
        Retriever.load(bad, encoder)
    (bad / "manifest.json").write_text(json.dumps({**m, "format": 1}))
    with pytest.raises(RetrieverError, match=r"older ZipRL \(format 1"):
        Retriever.load(bad, encoder)
    (bad / "manifest.json").write_text("{oops")
    with pytest.raises(RetrieverError, match="not a valid ZipRL index manifest"):
        Retriever.load(bad, encoder)


def test_encoder_mismatch(flat_dir, encoder):
    with pytest.raises(RetrieverError, match="was built with encoder"):
        Retriever.load(flat_dir, Encoder(query_prefix="query: "))

    class Small(CountingEncoder):
        dim = 8

    with pytest.raises(RetrieverError, match="gives 8-dim vectors but index .* holds 384-dim"):
        Retriever.load(flat_dir, Small(encoder))


def test_from_config(flat_dir, passages, tmp_path, monkeypatch):
    monkeypatch.setenv("ZIPRL_CACHE", str(tmp_path))
    loaded = Retriever.from_config(RetrieverConfig(index_dir=str(flat_dir)))  # encoder from the manifest
    assert len(loaded) == N
    assert loaded.encoder.encoder_id == R.DEFAULT_ENCODER_ID
    corpus = write_corpus(passages[:3], tmp_path / "tiny.jsonl")
    built = Retriever.from_config(RetrieverConfig(corpus=str(corpus), snippet_chars=50))
    assert built.manifest["count"] == 3
    assert (tmp_path / "index").is_dir()
    assert len(built.search([passages[0].title], 1)[0][0].snippet) == 50
    sample_dir = default_index_dir(corpus_for("sample"), built.encoder, "flat")
    assert sample_dir.parent == tmp_path / "index"
    assert sample_dir.name.startswith("sample-")


def test_cli_build_search_open(passages, tmp_path, capsys):
    corpus, out = write_corpus(passages[:4], tmp_path / "c.jsonl"), tmp_path / "cli-idx"
    assert cli(["build", "--corpus", str(corpus), "--out", str(out), "--no-progress"]) == 0
    assert (out / "manifest.json").is_file()
    capsys.readouterr()
    assert cli(["search", "--index", str(out), passages[3].title, "-k", "2"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"1. [{passages[3].doc_id}] {passages[3].title}")
    assert "\n2. [" in printed
    assert cli(["open", "--index", str(out), passages[3].doc_id]) == 0
    assert passages[3].text in capsys.readouterr().out


@pytest.mark.parametrize("args", [
    ["build", "--corpus", "/nonexistent/c.jsonl", "--out", "/tmp/x"],
    ["search", "--index", "/nonexistent/idx", "query"],
])
def test_cli_errors_exit_nonzero_without_traceback(args, capsys):
    assert cli(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert "Traceback" not in err


def test_cli_bad_k_and_unknown_id(flat_dir, capsys):
    assert cli(["search", "--index", str(flat_dir), "q", "-k", "0"]) == 2
    assert "k must be an integer" in capsys.readouterr().err
    assert cli(["open", "--index", str(flat_dir), "zzz"]) == 2
    assert "unknown document id 'zzz'" in capsys.readouterr().err


def test_cli_subprocess_error():
    proc = subprocess.run([sys.executable, "-m", "ziprl.index", "search", "--index", "/nonexistent", "q"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_shipped_sample_index_matches_the_shipped_corpus(tmp_path, monkeypatch):
    from ziprl.retrieval.corpus import corpus_sha256
    from ziprl.retrieval.datasets import SAMPLE_DIR

    monkeypatch.setenv("ZIPRL_CACHE", str(tmp_path))
    manifest = json.loads((SAMPLE_DIR / "index" / "manifest.json").read_text())
    passages = load_corpus(corpus_for("sample"))
    assert manifest["corpus_sha256"] == corpus_sha256(passages)
    assert manifest["count"] == len(passages)
    r = Retriever.from_config(RetrieverConfig())
    assert len(r) == len(passages)
    assert not any(tmp_path.iterdir())  # loaded as shipped, nothing built
    p = passages[123]
    assert r.search([p.title + " " + p.text[:200]], 3)[0][0].doc_id == p.doc_id
