"""Large-index machinery on tiny synthetic data: factory types, chunked/resumed builds, shards, the passage
store, precomputed embeddings and adopting a prebuilt FAISS index (real FAISS, real MiniLM for dims)."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import resource
import signal
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ziprl.cli.index import main as cli
from ziprl.config import RetrieverConfig
from ziprl.outputs import OutputError
from ziprl.retrieval import index_build as IB
from ziprl.retrieval.corpus import CorpusError, load_corpus, scan_corpus, write_corpus
from ziprl.retrieval.passage_store import PassageStore
from ziprl.retrieval.retriever import Encoder, Retriever, RetrieverError, adopt_index, build_index
from ziprl.retrieval.retriever import rerank_exact as IB_rerank
from ziprl.retrieval.types import Passage

N, DIM = 600, 384


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return Encoder()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A corpus of N passages (full Unicode in places) and N aligned clustered unit vectors."""
    tmp = tmp_path_factory.mktemp("data")
    passages = [Passage(f"doc-{i}", f"Title {i} ü", f"text {i} " + "🙂 Ωmega " * (i % 7) + "end", f"u{i}" if i % 3 else "")
                for i in range(N)]
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(12, DIM))
    x = (centers[rng.integers(0, 12, N)] + 0.4 * rng.normal(size=(N, DIM))).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    np.save(tmp / "emb.npy", x)
    return write_corpus(passages, tmp / "corpus.jsonl"), tmp / "emb.npy", passages, x


def _build(data, encoder, out, **kw):
    corpus, emb, _, _ = data
    return build_index(corpus, out, encoder, progress=False, embeddings=emb, **kw)


def _ids(hits):
    return [[h.doc_id for h in hs] for hs in hits]


@pytest.mark.parametrize(("index_type", "trained"), [("flat", False), ("hnsw", False), ("IVF8,Flat", True),
                                                    ("IVF8,PQ16x4,RFlat", True), ("HNSW16,SQ8", True)])
def test_factory_types_build_and_find_each_vector(data, encoder, tmp_path, index_type, trained):
    _, _, passages, x = data
    out = _build(data, encoder, tmp_path / "idx", index_type=index_type, train_size=400, chunk_size=256)
    m = json.loads((out / "manifest.json").read_text())
    assert m["factory"] == IB.factory_string(index_type)
    assert m["count"] == N
    assert m["train_size"] == (400 if trained else None)
    r = Retriever.load(out, encoder, nprobe=8, k_factor=10)
    hits = r.search_embeddings(x[:50], 5)
    top1 = sum(h[0].doc_id == passages[i].doc_id for i, h in enumerate(hits))
    assert top1 >= 48
    assert all(len(h) == 5 for h in hits)
    assert hits[3][0].snippet == passages[3].text[:200]
    assert hits[3][0].title == passages[3].title


def test_search_params_are_applied(data, encoder, tmp_path):
    out = _build(data, encoder, tmp_path / "idx", index_type="IVF8,PQ16x4,RFlat", train_size=400)
    r = Retriever.load(out, encoder, nprobe=3, k_factor=7)
    refine = faiss.downcast_index(r.index)
    assert refine.k_factor == 7
    assert faiss.extract_index_ivf(r.index).nprobe == 3
    assert IB.set_search_params(faiss.IndexFlatIP(4), nprobe=3, ef_search=5, k_factor=2) == {}


@pytest.mark.parametrize("index_type", ["flat", "IVF8,PQ16x4,RFlat"])
def test_chunked_build_equals_one_shot(data, encoder, tmp_path, index_type):
    one = Retriever.load(_build(data, encoder, tmp_path / "one", index_type=index_type, train_size=400,
                                chunk_size=N), encoder, nprobe=8)
    many = Retriever.load(_build(data, encoder, tmp_path / "many", index_type=index_type, train_size=400,
                                 chunk_size=37), encoder, nprobe=8)
    q = data[3][::17]
    assert one.search_embeddings(q, 10) == many.search_embeddings(q, 10)
    if index_type == "flat":
        assert np.array_equal(one.index.reconstruct_n(0, N), many.index.reconstruct_n(0, N))


def _crash_on_fourth_chunk(monkeypatch) -> dict:
    """Make the 4th chunk read of the build (the finite check's reads aside) raise KeyboardInterrupt (a machine going
    down after 3 chunks); returns the counters: ``n`` reads so far (set it negative to stop crashing), ``rows`` rows
    read, ``checks`` finite checks run."""
    calls = {"n": 0, "rows": 0, "checks": 0}
    real, real_check = IB.NpyVectors.rows, IB.check_finite

    def check(source, name, chunk_size):
        calls["checks"] += 1
        monkeypatch.setattr(IB.NpyVectors, "rows", real)
        real_check(source, name, chunk_size)
        monkeypatch.setattr(IB.NpyVectors, "rows", crashing)

    def crashing(self, start, stop):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        calls["rows"] += stop - start
        return real(self, start, stop)

    monkeypatch.setattr(IB.NpyVectors, "rows", crashing)
    monkeypatch.setattr(IB, "check_finite", check)
    return calls


def test_interrupted_build_resumes_where_it_stopped(data, encoder, tmp_path, monkeypatch):
    real = IB.NpyVectors.rows
    calls = _crash_on_fourth_chunk(monkeypatch)
    kw = {"index_type": "IVF8,Flat", "train_size": 400, "chunk_size": 50, "shards": 2, "checkpoint_s": 0}
    with pytest.raises(KeyboardInterrupt):
        _build(data, encoder, tmp_path / "idx", **kw)
    partial = tmp_path / ".idx.partial"
    progress = json.loads((partial / "progress.json").read_text())
    assert progress["added"] == [150, 0]
    assert progress["files"] == ["index.partial-150.faiss", None]
    assert not (tmp_path / "idx" / "manifest.json").exists()  # idx holds only the build's lock
    calls["rows"] = 0
    calls["n"] = -100
    _build(data, encoder, tmp_path / "idx", **kw)
    assert calls["rows"] == N - 150
    assert calls["checks"] == 1  # only what was not checkpointed, vectors checked once
    assert not partial.exists()
    resumed = Retriever.load(tmp_path / "idx", encoder, nprobe=8)
    monkeypatch.setattr(IB.NpyVectors, "rows", real)
    fresh = Retriever.load(_build(data, encoder, tmp_path / "fresh", **kw), encoder, nprobe=8)
    q = data[3][::13]
    assert resumed.search_embeddings(q, 10) == fresh.search_embeddings(q, 10)


def test_a_changed_input_discards_the_partial_build(data, encoder, tmp_path, monkeypatch):
    def boom(self, start, stop):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(IB.NpyVectors, "rows", boom)
        with pytest.raises(KeyboardInterrupt):
            _build(data, encoder, tmp_path / "idx", chunk_size=50)
    r = Retriever.load(_build(data, encoder, tmp_path / "idx", chunk_size=50, shards=2), encoder)
    assert r.manifest["shards"] == 2
    assert len(r) == N


def test_sharded_search_equals_unsharded_flat(data, encoder, tmp_path):
    _, _, passages, x = data
    whole = Retriever.load(_build(data, encoder, tmp_path / "one"), encoder)
    out = _build(data, encoder, tmp_path / "three", shards=3)
    assert sorted(p.name for p in out.iterdir()) == [".ziprl-lock", ".ziprl-run", "manifest.json", "shard-000",
                                                     "shard-001", "shard-002"]
    sharded = Retriever.load(out, encoder)
    assert sharded.manifest["shard_counts"] == [200, 200, 200]
    rng = np.random.default_rng(1)
    q = x[rng.choice(N, 40, replace=False)] + 0.05 * rng.normal(size=(40, DIM)).astype(np.float32)
    a, b = whole.search_embeddings(q, 10), sharded.search_embeddings(q, 10)
    assert _ids(a) == _ids(b)
    assert np.allclose([[h.score for h in hs] for hs in a], [[h.score for h in hs] for hs in b], atol=1e-5)
    assert sharded.search_embeddings(q[:2], N)[0][-1].doc_id in {p.doc_id for p in passages}  # k > a shard
    for p in (passages[0], passages[250], passages[599]):
        assert sharded.open(p.doc_id) == p
    middle = Retriever.load(out, encoder, shards=[1])
    assert len(middle) == 200
    assert middle.open(passages[250].doc_id) == passages[250]
    with pytest.raises(KeyError):
        middle.open(passages[0].doc_id)
    with pytest.raises(RetrieverError, match=r"shards \[3\] do not exist"):
        Retriever.load(out, encoder, shards=[3])


def test_store_returns_the_corpus(data, encoder, tmp_path):
    corpus, _, passages, _ = data
    out = _build(data, encoder, tmp_path / "idx")
    store = PassageStore(out)
    assert len(store) == N
    assert [store.passage(i) for i in range(N)] == load_corpus(corpus)
    assert store.row_of("doc-123") == 123
    assert store.row_of("doc-600") is None
    assert store.row_of("") is None
    assert store.texts(3, 6) == [f"{p.title}\n{p.text}" for p in passages[3:6]]
    assert store.head(7, 5) == (passages[7].doc_id, passages[7].title, passages[7].text[:5], passages[7].url)


def test_parquet_embeddings_equal_npy(data, encoder, tmp_path):
    x = data[3]
    path = tmp_path / "emb.parquet"
    pq.write_table(pa.table({"id": [f"doc-{i}" for i in range(N)], "emb": list(x)}), path, row_group_size=128)
    a = Retriever.load(_build(data, encoder, tmp_path / "npy"), encoder)
    b = Retriever.load(build_index(data[0], tmp_path / "pq", encoder, embeddings=path, progress=False, chunk_size=100),
                       encoder)
    assert np.allclose(a.index.reconstruct_n(0, N), b.index.reconstruct_n(0, N), atol=1e-6)


def test_embedding_and_option_errors_come_before_any_work(data, encoder, tmp_path):
    corpus, emb, _, x = data
    np.save(tmp_path / "short.npy", x[:-1])
    with pytest.raises(RetrieverError, match=f"hold {N - 1} vectors but corpus .* has {N} passages"):
        build_index(corpus, tmp_path / "o", encoder, embeddings=tmp_path / "short.npy", progress=False)
    np.save(tmp_path / "narrow.npy", x[:, :16])
    with pytest.raises(RetrieverError, match="are 16-dim but query encoder .* gives 384-dim"):
        build_index(corpus, tmp_path / "o", encoder, embeddings=tmp_path / "narrow.npy", progress=False)
    with pytest.raises(RetrieverError, match="must end in .npy or .parquet"):
        build_index(corpus, tmp_path / "o", encoder, embeddings=corpus, progress=False)
    with pytest.raises(RetrieverError, match="chunk_size must be an integer >= 1"):
        build_index(corpus, tmp_path / "o", encoder, embeddings=emb, chunk_size=0)
    with pytest.raises(RetrieverError, match=f"shards={N + 1} is more than"):
        build_index(corpus, tmp_path / "o", encoder, embeddings=emb, shards=N + 1, progress=False)
    assert not (tmp_path / "o").exists()
    assert not (tmp_path / ".o.partial").exists()


def flat_file(x: np.ndarray, path: Path) -> Path:
    """A flat inner-product FAISS index of ``x`` written to ``path``."""
    flat = faiss.IndexFlatIP(DIM)
    flat.add(x)
    faiss.write_index(flat, str(path))
    return path


def test_adopt_checks_dimension_and_count(data, encoder, tmp_path):
    corpus, _, passages, x = data
    flat_file(x, tmp_path / "ok.faiss")
    out = adopt_index(tmp_path / "ok.faiss", corpus, tmp_path / "adopted", encoder, progress=False)
    r = Retriever.load(out, encoder)
    assert r.manifest["index_type"] == "flat"
    assert r.search_embeddings(x[5:6], 1)[0][0].doc_id == passages[5].doc_id
    flat_file(x[:10], tmp_path / "short.faiss")
    with pytest.raises(RetrieverError, match=f"holds 10 vectors but corpus .* has {N} passages"):
        adopt_index(tmp_path / "short.faiss", corpus, tmp_path / "a2", encoder, progress=False)
    narrow = faiss.IndexFlatIP(8)
    faiss.write_index(narrow, str(tmp_path / "narrow.faiss"))
    with pytest.raises(RetrieverError, match="holds 8-dim vectors but encoder .* gives 384-dim"):
        adopt_index(tmp_path / "narrow.faiss", corpus, tmp_path / "a3", encoder, progress=False)
    (tmp_path / "junk.faiss").write_bytes(b"not faiss")
    with pytest.raises(RetrieverError, match="is not a FAISS index file"):
        adopt_index(tmp_path / "junk.faiss", corpus, tmp_path / "a4", encoder, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["adopted"]


def test_use_gpu_without_a_gpu_searches_on_cpu(data, encoder, tmp_path, caplog):
    out = _build(data, encoder, tmp_path / "idx")
    with caplog.at_level(logging.WARNING, logger="ziprl.retrieval.index_build"):
        r = Retriever.load(out, encoder, use_gpu=True)
    if faiss.get_num_gpus() == 0:
        assert isinstance(r.index, faiss.IndexFlatIP)
        assert "searching on CPU" in caplog.text
    assert r.search_embeddings(data[3][:1], 1)[0][0].doc_id == "doc-0"


def test_from_config_builds_shards_with_embeddings(data, encoder, tmp_path, monkeypatch):
    monkeypatch.setenv("ZIPRL_CACHE", str(tmp_path))
    corpus, emb, _, _ = data
    cfg = RetrieverConfig(corpus=str(corpus), embeddings=str(emb), shards=2, index_type="IVF8,Flat", train_size=300,
                          nprobe=8)
    r = Retriever.from_config(cfg)
    assert len(r.shards) == 2
    assert r.manifest["factory"] == "IVF8,Flat"
    assert faiss.extract_index_ivf(r.shards[0].index).nprobe == 8


def _files(root):
    return {f.relative_to(root).as_posix(): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}


def test_a_run_never_replaces_an_index_its_config_names(data, tmp_path, monkeypatch):
    """``retriever.index_dir`` with ``retriever.corpus`` builds there once; a run with other index settings is refused
    by the input check (before anything is written) and by ``from_config`` itself, naming the rebuild command, and so
    is a user's directory that holds no index; every file stays. The cache's own index is still rebuilt."""
    from ziprl.cli.common import check_inputs
    from ziprl.config import ZipRLConfig

    monkeypatch.setenv("ZIPRL_CACHE", str(tmp_path / "cache"))
    corpus, emb, _, _ = data
    named = tmp_path / "named"
    cfg = RetrieverConfig(corpus=str(corpus), embeddings=str(emb), index_dir=str(named))
    assert len(Retriever.from_config(cfg)) == N
    kept = _files(named)
    other = dataclasses.replace(cfg, index_type="IVF8,Flat", train_size=300)
    with pytest.raises(RetrieverError, match=r"index of other settings \(factory 'Flat' there, 'IVF8,Flat' now\); "
                                             r"nothing was written: set retriever.index_dir .* --overwrite"):
        check_inputs(ZipRLConfig(retriever=other))
    with pytest.raises(RetrieverError, match="other inputs or settings; nothing was written: set retriever.index_dir"):
        Retriever.from_config(other)
    assert _files(named) == kept
    check_inputs(ZipRLConfig(retriever=cfg))  # the same settings: reused
    assert len(Retriever.from_config(cfg)) == N and _files(named) == kept

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    users = dataclasses.replace(cfg, index_dir=str(mine))
    with pytest.raises(RetrieverError, match="not a ZipRL index"):
        check_inputs(ZipRLConfig(retriever=users))
    with pytest.raises(RetrieverError, match="not a ZipRL index"):
        Retriever.from_config(users)
    assert _files(mine) == {"notes.txt": b"my notes"}

    mutable = tmp_path / "corpus.jsonl"  # the cache's own index: rebuilt when its corpus changes
    mutable.write_bytes(corpus.read_bytes())
    cached = dataclasses.replace(cfg, corpus=str(mutable), index_dir=None)
    first = Retriever.from_config(cached).manifest["corpus_sha256"]
    mutable.write_text(mutable.read_text(encoding="utf-8").replace("Title 5 ", "Title five "), encoding="utf-8")
    assert Retriever.from_config(cached).manifest["corpus_sha256"] != first


def test_cli_build_options_and_adopt(data, tmp_path, capsys):
    corpus, emb, passages, x = data
    out = tmp_path / "cli"
    args = ["build", "--corpus", str(corpus), "--out", str(out), "--index", "IVF8,PQ16x4,RFlat", "--shards", "2",
            "--chunk-size", "100", "--train-size", "400", "--embeddings", str(emb), "--no-progress"]
    assert cli(args) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert (m["shards"], m["factory"], m["train_size"]) == (2, "IVF8,PQ16x4,RFlat", 400)
    assert cli(["open", "--index", str(out), passages[450].doc_id]) == 0
    assert passages[450].text in capsys.readouterr().out
    assert cli(["build", "--corpus", str(corpus), "--out", str(tmp_path / "x"), "--index", "IVF8,Nope"]) == 2
    assert "is not a FAISS factory string" in capsys.readouterr().err
    flat_file(x[:3], tmp_path / "s.faiss")
    assert cli(["adopt", "--faiss", str(tmp_path / "s.faiss"), "--corpus", str(corpus), "--out", str(tmp_path / "a"),
                "--no-progress"]) == 2
    assert "holds 3 vectors" in capsys.readouterr().err


def test_scan_corpus_streams_and_finds_duplicates(tmp_path):
    lines = [json.dumps({"id": f"d{i}", "title": "T", "text": "x"}) for i in range(50)]
    lines.insert(30, json.dumps({"id": "d7", "title": "T", "text": "again"}))
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(CorpusError, match="duplicate id 'd7' on lines 8 and 31"):
        scan_corpus(tmp_path / "c.jsonl")
    ok = scan_corpus(write_corpus([Passage("a", "T", "x"), Passage("b", "T", "y")], tmp_path / "ok.jsonl"))
    assert ok.count == 2
    assert ok.id_hashes.dtype == np.uint64
    assert len(set(ok.id_hashes.tolist())) == 2


@pytest.mark.parametrize("shards", [1, 2])
def test_stored_vectors_rerank_a_compressed_index_exactly(data, encoder, tmp_path, shards):
    _, _, _, x = data
    out = _build(data, encoder, tmp_path / "pq", index_type="IVF8,PQ16x4", train_size=400, chunk_size=37,
                 shards=shards, store_vectors=True)
    stored = np.concatenate([np.load(p) for p in sorted(out.rglob("vectors.npy"))])
    np.testing.assert_allclose(stored, x, atol=1e-6)  # every row, in corpus order (as normalised for the index)
    exact = Retriever.load(_build(data, encoder, tmp_path / "flat", index_type="flat"), encoder)
    q = x[::11] + 0.05
    want = exact.search_embeddings(q, 10)
    got = Retriever.load(out, encoder, nprobe=8, k_factor=20).search_embeddings(q, 10)
    assert _ids(got) == _ids(want)
    assert [h.score for hs in got for h in hs] == pytest.approx([h.score for hs in want for h in hs], abs=1e-5)
    coarse = Retriever.load(out, encoder, nprobe=1, k_factor=1).search_embeddings(q, 10)  # fewer candidates
    assert all(len(h) == 10 for h in coarse)
    assert _ids(coarse) != _ids(want)
    (next(out.rglob("vectors.npy"))).unlink()
    with pytest.raises(RetrieverError, match="incomplete.*vectors.npy"):
        Retriever.load(out, encoder)


def test_rerank_exact_scores_only_the_candidates():
    rng = np.random.default_rng(3)
    vecs, q = rng.normal(size=(50, 8)).astype(np.float32), rng.normal(size=(3, 8)).astype(np.float32)
    cand = np.array([[4, 9, 1, -1], [-1, -1, -1, -1], [7, 7 + 1, 30, 2]])
    scores, rows = IB_rerank(vecs, q, cand, 3)
    for i in range(3):
        ok = [int(c) for c in cand[i] if c >= 0]
        best = sorted(ok, key=lambda c: -float(vecs[c] @ q[i]))[:3]
        assert rows[i][: len(best)].tolist() == best
        assert scores[i][: len(best)] == pytest.approx([float(vecs[c] @ q[i]) for c in best], rel=1e-5)
        assert (rows[i][len(best):] == -1).all()


def test_store_vectors_resumes_and_old_manifests_are_reused(data, encoder, tmp_path, monkeypatch):
    _, _, _, x = data
    calls = _crash_on_fourth_chunk(monkeypatch)
    kw = {"index_type": "IVF8,PQ16x4", "train_size": 400, "chunk_size": 50, "checkpoint_s": 0, "store_vectors": True}
    with pytest.raises(KeyboardInterrupt):
        _build(data, encoder, tmp_path / "idx", **kw)
    calls["n"] = -100
    out = _build(data, encoder, tmp_path / "idx", **kw)
    np.testing.assert_allclose(np.load(out / "vectors.npy"), x, atol=1e-6)
    plain = _build(data, encoder, tmp_path / "plain", index_type="flat")
    manifest = json.loads((plain / "manifest.json").read_text())
    del manifest["store_vectors"]  # as written before the key existed
    (plain / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(IB, "fill_index", lambda *a, **k: pytest.fail("an up-to-date index was rebuilt"))
    assert _build(data, encoder, tmp_path / "plain", index_type="flat") == plain


def test_a_partial_build_from_before_store_vectors_resumes(data, encoder, tmp_path, monkeypatch):
    calls = _crash_on_fourth_chunk(monkeypatch)
    kw = {"index_type": "IVF8,Flat", "train_size": 400, "chunk_size": 50, "checkpoint_s": 0}
    with pytest.raises(KeyboardInterrupt):
        _build(data, encoder, tmp_path / "idx", **kw)
    progress_file = tmp_path / ".idx.partial" / "progress.json"
    progress = json.loads(progress_file.read_text())
    del progress["build"]["store_vectors"]  # as written before the key existed
    progress_file.write_text(json.dumps(progress))
    calls["rows"], calls["n"] = 0, -100
    _build(data, encoder, tmp_path / "idx", **kw)
    assert calls["rows"] == N - 150  # resumed, not started over


@pytest.mark.parametrize(("index_type", "needle"), [
    ("IVF4096,Flat", r"IVF4096,Flat' trains on 600 vectors but needs >= 4096 \(its IVF lists\); use a smaller nlist "
                     r"\(e.g. IVF24,Flat\), or --index flat"),
    ("IVF8,PQ16x10", r"needs >= 1024 \(its PQ codebooks: 2\^10 centroids each\); use fewer bits per code "
                     r"\(e.g. PQ16x4\), or --index flat"),
])
def test_too_few_training_vectors_fail_before_anything_is_written(data, encoder, tmp_path, index_type, needle):
    with pytest.raises(RetrieverError, match=needle):
        _build(data, encoder, tmp_path / "idx", index_type=index_type)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_train_size_below_the_need_names_train_size(data, encoder, tmp_path):
    with pytest.raises(RetrieverError, match=r"trains on 100 vectors but needs >= 256 .*raise --train-size"):
        _build(data, encoder, tmp_path / "idx", index_type="IVF256,Flat", train_size=100)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
def test_non_finite_embeddings_fail_before_anything_is_written(data, encoder, tmp_path, bad, suffix):
    corpus, _, _, x = data
    x = x.copy()
    x[N - 3, 7] = bad
    path = tmp_path / f"bad{suffix}"
    if suffix == ".npy":
        np.save(path, x)
    else:
        pq.write_table(pa.table({"v": list(x)}), path, row_group_size=100)
    with pytest.raises(RetrieverError, match=rf"embeddings {path} row {N - 3} is not finite \(NaN or inf\); "
                                             "re-encode the passages"):
        build_index(corpus, tmp_path / "o", encoder, embeddings=path, progress=False, chunk_size=64)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_finite_check_reads_chunk_by_chunk(data, encoder, tmp_path, monkeypatch):
    corpus, emb, _, _ = data
    sizes = []
    rows = IB.NpyVectors.rows
    monkeypatch.setattr(IB.NpyVectors, "rows", lambda self, a, b: sizes.append(b - a) or rows(self, a, b))
    build_index(corpus, tmp_path / "o", encoder, embeddings=emb, progress=False, chunk_size=128)
    assert max(sizes) <= 128
    assert sum(sizes) == 2 * N  # the check's pass, then the adding pass


# ---------------------------------------------------------------- installing into --out


def _tree(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def test_an_existing_directory_is_kept_not_replaced(data, encoder, tmp_path):
    """The index moves into --out entry by entry: its inode and mode stay, on a first build and on a rebuild."""
    out = tmp_path / "idx"
    out.mkdir(mode=0o700)
    before = out.stat()
    _build(data, encoder, out)
    _build(data, encoder, out, shards=2, overwrite=True)
    after = out.stat()
    assert (after.st_ino, after.st_mode & 0o777) == (before.st_ino, 0o700)
    assert Retriever.load(out, encoder).manifest["shards"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]  # no work directory left


def test_out_dot_builds_into_the_working_directory(data, tmp_path, monkeypatch):
    corpus, emb, _, _ = data
    cwd = tmp_path / "here"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    inode = cwd.stat().st_ino
    assert cli(["build", "--corpus", str(corpus), "--out", ".", "--embeddings", str(emb), "--no-progress"]) == 0
    assert os.stat(".").st_ino == cwd.stat().st_ino == inode  # the shell's working directory is still --out
    assert "manifest.json" in os.listdir(".")
    assert json.loads((cwd / "manifest.json").read_text())["count"] == N


def test_a_mount_point_is_refused_before_anything_is_written(data, encoder, tmp_path, monkeypatch):
    out = tmp_path / "vol"
    out.mkdir()
    monkeypatch.setattr(IB, "mount_point", lambda p: p == out)
    with pytest.raises(RetrieverError, match=rf"--out {out} is a mount point: .* build into a directory inside it, "
                                             rf"e.g. --out {out / 'index'}"):
        _build(data, encoder, out)
    assert _tree(tmp_path) == ["vol"]
    _build(data, encoder, out / "index")
    assert (out / "index" / "manifest.json").is_file()


def test_mount_points_are_detected(monkeypatch):
    assert IB.mount_point(Path("/proc"))
    assert not IB.mount_point(Path(__file__).parent)
    monkeypatch.setattr(os.path, "ismount", lambda p: False)  # a bind mount of the same file system: mountinfo lists it
    assert IB.mount_point(Path("/proc"))
    assert not IB.mount_point(Path(__file__).parent)


def test_an_interrupted_install_is_finished_by_the_rerun(data, encoder, tmp_path, monkeypatch):
    """Killed after the old entries are deleted and one new entry moved in: the rerun moves the rest, rebuilding
    nothing."""
    out = _build(data, encoder, tmp_path / "idx")
    real = os.replace
    work = tmp_path / ".idx.partial"

    def crash_after_one_move(src, dst):
        real(src, dst)
        if Path(src).parent == work and Path(dst).parent == out:
            raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(os, "replace", crash_after_one_move)
        with pytest.raises(KeyboardInterrupt):
            _build(data, encoder, out, shards=2, overwrite=True)
    assert "swap" in json.loads((work / "progress.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == [".ziprl-lock", ".ziprl-run", "shard-000"]
    monkeypatch.setattr(IB, "fill_index", lambda *a, **k: pytest.fail("a finished build was built again"))
    (out / "NOTES.txt").write_text("mine")
    with pytest.raises(OutputError, match=r"was written while the index was installed \(NOTES\.txt\)"):
        _build(data, encoder, out, shards=2)
    assert (out / "NOTES.txt").read_text() == "mine"
    (out / "NOTES.txt").unlink()
    _build(data, encoder, out, shards=2)  # no --overwrite: the first run was allowed to replace
    assert not work.exists()
    r = Retriever.load(out, encoder)
    assert (r.manifest["shards"], len(r)) == (2, N)


def test_a_file_that_appears_during_a_rebuild_stops_the_install(data, encoder, tmp_path, monkeypatch):
    """Planned again before the install: a user's file written into --out meanwhile is kept, so is the old index,
    and the finished one waits for the rerun."""
    out = _build(data, encoder, tmp_path / "idx")
    real, fills = IB.fill_index, []

    def fill_and_write_notes(*args, **kwargs):
        fills.append(1)
        (out / "NOTES.txt").write_text("mine")
        return real(*args, **kwargs)

    monkeypatch.setattr(IB, "fill_index", fill_and_write_notes)
    with pytest.raises(OutputError, match=r"does not write \(NOTES\.txt\).* the finished index waits in "
                                          rf"{tmp_path / '.idx.partial'}: run the same command again"):
        _build(data, encoder, out, shards=2, overwrite=True)
    assert (out / "NOTES.txt").read_text() == "mine"
    assert Retriever.load(out, encoder).manifest["shards"] == 1  # the old index, whole
    (out / "NOTES.txt").unlink()
    _build(data, encoder, out, shards=2, overwrite=True)
    assert len(fills) == 2  # the rerun added nothing: it installed the finished build
    assert Retriever.load(out, encoder).manifest["shards"] == 2
    assert not (tmp_path / ".idx.partial").exists()


def test_a_directory_written_during_a_first_build_is_not_touched(data, encoder, tmp_path, monkeypatch):
    out = tmp_path / "idx"
    real = IB.fill_index
    monkeypatch.setattr(IB, "fill_index", lambda *a, **k: (out / "NOTES.txt").write_text("mine") and real(*a, **k))
    with pytest.raises(OutputError, match=r"was written while the index was built \(NOTES\.txt\); nothing in it was "
                                          "deleted and the finished index waits in"):
        _build(data, encoder, out)
    assert sorted(p.name for p in out.iterdir()) == [".ziprl-lock", "NOTES.txt"]


def test_overwrite_keeps_a_users_file_inside_a_shard(data, encoder, tmp_path):
    out = _build(data, encoder, tmp_path / "idx", shards=2)
    (out / "shard-001" / "NOTES.txt").write_text("mine")
    with pytest.raises(OutputError, match=r"does not write \(shard-001/NOTES\.txt\); nothing was deleted"):
        _build(data, encoder, out, overwrite=True)
    assert (out / "shard-001" / "NOTES.txt").read_text() == "mine"
    assert Retriever.load(out, encoder).manifest["shards"] == 2


def test_every_path_a_sharded_build_writes_is_an_index_entry(data, encoder, tmp_path):
    out = _build(data, encoder, tmp_path / "idx", shards=2, store_vectors=True, index_type="IVF8,Flat",
                 train_size=300)
    written = _tree(out)
    assert "shard-001/vectors.npy" in written and "shard-000/id_row.npy" in written
    assert [p for p in written if not IB.is_index_entry(p)] == []
    for foreign in ("shard-000/NOTES.txt", "shard-000/manifest.json", "shard-000/sub/index.faiss",
                    "shard-00/index.faiss", "shard-000/index.faiss/x", "NOTES.txt"):
        assert not IB.is_index_entry(foreign), foreign


def test_overwrite_refuses_to_delete_an_input_it_reads(data, tmp_path, capsys):
    corpus, emb, _, _ = data
    out = tmp_path / "idx3"
    base = ["build", "--corpus", str(corpus), "--out", str(out), "--no-progress"]
    assert cli([*base, "--embeddings", str(emb), "--store-vectors"]) == 0
    kept = _files(out)
    assert cli([*base, "--embeddings", str(out / "vectors.npy"), "--index", "hnsw", "--overwrite"]) == 2
    assert (f"--overwrite would delete {out / 'vectors.npy'}, which holds the input {out / 'vectors.npy'}; nothing "
            "was deleted") in capsys.readouterr().err
    assert _files(out) == kept
    assert not (tmp_path / ".idx3.partial").exists()


def test_adopt_overwrite_refuses_to_delete_the_faiss_file_it_reads(data, encoder, tmp_path):
    corpus, _, _, x = data
    flat_file(x, tmp_path / "x.faiss")
    out = adopt_index(tmp_path / "x.faiss", corpus, tmp_path / "idx", encoder, progress=False)
    kept = _files(out)
    with pytest.raises(OutputError, match="which holds the input .*index.faiss; nothing was deleted"):
        adopt_index(out / "index.faiss", corpus, out, encoder, progress=False, overwrite=True)
    assert _files(out) == kept


# ---------------------------------------------------------------- Parquet embeddings


def test_parquet_takes_the_first_column_of_numbers(data, encoder, tmp_path):
    x = data[3]
    path = tmp_path / "emb.parquet"
    pq.write_table(pa.table({"id": [f"doc-{i}" for i in range(N)], "kw": [["a", "b"]] * N, "emb": list(x)}), path,
                   row_group_size=128)
    r = Retriever.load(build_index(data[0], tmp_path / "pq", encoder, embeddings=path, progress=False), encoder)
    np.testing.assert_allclose(r.index.reconstruct_n(0, N), x, atol=1e-6)


@pytest.mark.parametrize(("row", "vector", "needle"), [
    (300, None, r"row group 2: row 300 has no vector \(null\)"),
    (5, [0.5] * (DIM - 1), rf"row group 0: row 5 has {DIM - 1} values, but row 0 has {DIM}"),
    (599, [0.5] * (DIM + 1), rf"row group 4: row 599 has {DIM + 1} values, but row 0 has {DIM}"),
])
def test_parquet_rows_without_a_whole_vector_are_named(data, encoder, tmp_path, row, vector, needle):
    rows = [list(map(float, v)) for v in data[3]]
    rows[row] = vector
    path = tmp_path / "emb.parquet"
    pq.write_table(pa.table({"emb": pa.array(rows, pa.list_(pa.float32()))}), path, row_group_size=128)
    with pytest.raises(RetrieverError, match=rf"embeddings {path} column 'emb', {needle}"):
        build_index(data[0], tmp_path / "o", encoder, embeddings=path, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb.parquet"]


# ---------------------------------------------------------------- kills, full disks, read-only caches


@contextlib.contextmanager
def _file_size_limit(size: int):
    """Writes past ``size`` bytes fail with EFBIG (as a full disk fails them with ENOSPC) while the block runs."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_a_faiss_file_cut_short_by_a_full_disk_is_never_renamed_into_place(data, tmp_path):
    """faiss.write_index only prints a failed final flush: the short file must raise, not be taken as whole."""
    index = faiss.IndexFlatIP(DIM)
    index.add(data[3][:200])
    size = len(faiss.serialize_index(index))
    with _file_size_limit(size - 45), pytest.raises(OSError) as err:  # only the last flush fails
        IB._write_index(index, tmp_path / "index.faiss")
    assert err.value.errno == errno.EFBIG and err.value.filename == str(tmp_path / "index.faiss")
    assert list(tmp_path.iterdir()) == []  # no short file, no temporary
    IB._write_index(index, tmp_path / "index.faiss")
    assert (tmp_path / "index.faiss").stat().st_size == size
    assert faiss.read_index(str(tmp_path / "index.faiss")).ntotal == 200


@pytest.mark.parametrize("name", ["trained.faiss", "index.faiss"])
def test_a_full_disk_during_a_build_is_one_error_line_and_the_rerun_finishes(data, tmp_path, capsys, monkeypatch,
                                                                             name):
    corpus, emb, _, _ = data
    out = tmp_path / "idx"
    real = IB._write_index

    def short(index, path):
        if path.name != name:
            return real(index, path)
        with _file_size_limit(len(faiss.serialize_index(index)) - 45):
            return real(index, path)

    args = ["build", "--corpus", str(corpus), "--out", str(out), "--embeddings", str(emb), "--index", "IVF8,Flat",
            "--train-size", "400", "--no-progress"]
    with monkeypatch.context() as m:
        m.setattr(IB, "_write_index", short)
        assert cli(args) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and f"{name}: File too large" in lines[0] and "Traceback" not in err, err
    assert not (out / "manifest.json").exists()
    assert cli(args) == 0
    assert len(Retriever.load(out, nprobe=8)) == N
    assert not (tmp_path / ".idx.partial").exists()


@pytest.mark.parametrize("how", ["killed", "full disk"])
@pytest.mark.parametrize("command", ["build", "adopt"])
def test_a_work_directory_stopped_before_it_was_marked_is_taken_back(data, encoder, tmp_path, monkeypatch, how,
                                                                    command):
    """Stopped between creating ``.<out>.partial`` (``.adopting``) and marking it: empty, or holding the marker's
    temporary; the rerun takes it back instead of refusing it forever."""
    corpus, _, _, x = data
    out = tmp_path / "idx"
    work = tmp_path / (".idx.partial" if command == "build" else ".idx.adopting")
    real = IB.write_marker

    def stopped(path, kind, *args):
        if Path(path) != work:
            return real(path, kind, *args)
        if how == "killed":
            (work / "..ziprl-run.10229f39.tmp").write_text('{"form')
            raise KeyboardInterrupt
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    flat_file(x, tmp_path / "x.faiss")
    run = (lambda: _build(data, encoder, out)) if command == "build" else (
        lambda: adopt_index(tmp_path / "x.faiss", corpus, out, encoder, progress=False))
    with monkeypatch.context() as m:
        m.setattr(IB, "write_marker", stopped)
        m.setattr(IB, "_clear_work", lambda w: None)  # adopt's own clean-up: not run by a killed process
        with pytest.raises((KeyboardInterrupt, OSError)):
            run()
    assert work.is_dir() and IB.read_marker(work) is None
    assert len(Retriever.load(run(), encoder)) == N
    assert not work.exists()


def test_a_kill_while_the_install_marks_out_leaves_nothing_in_the_way(data, encoder, tmp_path, monkeypatch):
    """Killed while writing the marker of ``out`` (the install planned, its plan recorded): the marker's temporary in
    ``out`` is no user's file; the rerun removes it and finishes the install."""
    out = _build(data, encoder, tmp_path / "idx")
    real = IB.write_marker

    def killed(path, kind, *args):
        if Path(path) != out:
            return real(path, kind, *args)
        (out / "..ziprl-run.10229f39.tmp").write_text('{"form')
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(IB, "write_marker", killed)
        with pytest.raises(KeyboardInterrupt):
            _build(data, encoder, out, shards=2, overwrite=True)
    assert "swap" in json.loads((tmp_path / ".idx.partial" / "progress.json").read_text())
    _build(data, encoder, out, shards=2)
    assert sorted(p.name for p in out.iterdir()) == [".ziprl-lock", ".ziprl-run", "manifest.json", "shard-000",
                                                     "shard-001"]
    assert Retriever.load(out, encoder).manifest["shards"] == 2


def test_a_kill_while_a_stale_partial_build_is_deleted_leaves_it_marked(data, encoder, tmp_path, monkeypatch):
    """A partial build of other inputs is deleted marker last: a kill midway leaves it marked (or empty) for the
    rerun, never an unmarked folder of files."""
    work = tmp_path / ".idx.partial"

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(IB, "fill_index", boom)
        with pytest.raises(KeyboardInterrupt):
            _build(data, encoder, tmp_path / "idx", chunk_size=50)
    assert len(os.listdir(work)) > 2  # the marker, the progress, the passage store
    real, killed = os.unlink, []

    def unlink(path, *args, **kwargs):  # killed right after the marker went while other entries are left
        real(path, *args, **kwargs)
        if Path(path).name == ".ziprl-run" and os.listdir(work):
            killed.append(path)
            raise KeyboardInterrupt

    real_scandir = os.scandir

    class MarkerFirst:  # a directory order that lists the marker first (the order is the file system's)
        def __init__(self, *args):
            with real_scandir(*args) as it:
                self.entries = sorted(it, key=lambda e: e.name != ".ziprl-run")

        def __enter__(self):
            return iter(self.entries)

        def __exit__(self, *exc):
            return False

        def __iter__(self):
            return iter(self.entries)

        def close(self):
            pass

    with monkeypatch.context() as m:
        m.setattr(os, "unlink", unlink)
        m.setattr(os, "scandir", MarkerFirst)
        with contextlib.suppress(KeyboardInterrupt):
            _build(data, encoder, tmp_path / "idx", chunk_size=50, shards=2)
    assert killed == []
    r = Retriever.load(_build(data, encoder, tmp_path / "idx", chunk_size=50, shards=2), encoder)
    assert (r.manifest["shards"], len(r)) == (2, N)


def _stats(root):
    return {p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_an_up_to_date_index_in_a_read_only_cache_is_used(data, tmp_path, monkeypatch):
    """Reusing an up-to-date index writes nothing, so a read-only cache serves it; a stale one is still refused."""
    import tempfile

    corpus, emb, _, _ = data
    cache = tmp_path / "cache"
    monkeypatch.setenv("ZIPRL_CACHE", str(cache))
    named = tmp_path / "ro" / "named"
    cfg = RetrieverConfig(corpus=str(corpus), embeddings=str(emb))
    assert len(Retriever.from_config(cfg)) == N
    assert len(Retriever.from_config(dataclasses.replace(cfg, index_dir=str(named)))) == N
    kept = _stats(tmp_path)
    real = tempfile.TemporaryFile

    def read_only(*args, dir=None, **kwargs):  # noqa: A002 (tempfile's own name)
        if dir is not None and (cache in Path(dir).parents or tmp_path / "ro" in [Path(dir), *Path(dir).parents]):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    assert len(Retriever.from_config(cfg)) == N
    assert IB.index_differences(named, "flat", 1, False) == []  # the input check of retriever.index_dir
    assert len(Retriever.from_config(dataclasses.replace(cfg, index_dir=str(named)))) == N
    assert _stats(tmp_path) == kept
    with pytest.raises(OutputError, match="cannot write in .*Read-only file system"):
        Retriever.from_config(dataclasses.replace(cfg, shards=2, index_dir=str(named)))
    assert _stats(tmp_path) == kept
