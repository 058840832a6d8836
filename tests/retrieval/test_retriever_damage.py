"""A damaged or edited index directory, and an encoder directory that holds no model: one clear error (exit 2)
naming the file and how to rebuild, never a traceback."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from ziprl.cli.index import main as cli
from ziprl.retrieval.corpus import write_corpus
from ziprl.retrieval.retriever import Encoder, Retriever, RetrieverError, build_index
from ziprl.retrieval.types import Passage

N, DIM = 30, 384


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A two-shard index (15 passages each) with stored vectors, built from random unit vectors."""
    tmp = tmp_path_factory.mktemp("built")
    corpus = write_corpus([Passage(f"d{i}", f"Title {i}", f"text {i}") for i in range(N)], tmp / "c.jsonl")
    x = np.random.default_rng(0).normal(size=(N, DIM)).astype(np.float32)
    np.save(tmp / "emb.npy", x / np.linalg.norm(x, axis=1, keepdims=True))
    return build_index(corpus, tmp / "idx", Encoder(), progress=False, shards=2, embeddings=tmp / "emb.npy",
                       store_vectors=True), corpus, tmp / "emb.npy"


@pytest.fixture
def index(built, tmp_path):
    return shutil.copytree(built[0], tmp_path / "d30")


def _edit(index, **fields):
    m = json.loads((index / "manifest.json").read_text())
    for key, value in fields.items():
        if value is ...:
            del m[key]
        else:
            m[key] = value
    (index / "manifest.json").write_text(json.dumps(m))


def _fails(args, capsys) -> str:
    assert cli(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err and "internal error" not in err
    return err


@pytest.mark.parametrize(("fields", "problem"), [
    ({"shards": "abc"}, 'shards is "abc", not an integer >= 1'),
    ({"shards": 2.5}, "shards is 2.5, not an integer >= 1"),
    ({"shards": 0}, "shards is 0, not an integer >= 1"),
    ({"shards": -1}, "shards is -1, not an integer >= 1"),
    ({"shards": True}, "shards is true, not an integer >= 1"),
    ({"count": "many"}, 'count is "many", not an integer >= 1'),
    ({"count": 0}, "count is 0, not an integer >= 1"),
    ({"dim": ...}, "dim is missing"),
    ({"format": "2"}, 'format is "2", not an integer >= 1'),
    ({"shard_counts": [25]}, "shard_counts is [25], not a list of 2 integers >= 1 summing to count 30"),
    ({"shard_counts": [15, "15"]}, 'shard_counts is [15, "15"], not a list of 2 integers'),
    ({"shard_counts": [10, 10]}, "shard_counts is [10, 10], not a list of 2 integers >= 1 summing to count 30"),
    ({"encoder_path": 5}, "encoder_path is 5, not text or null"),
    ({"query_prefix": 5}, "query_prefix is 5, not text"),
    ({"passage_prefix": None}, "passage_prefix is null, not text"),
    ({"store_vectors": "yes"}, 'store_vectors is "yes", not true or false'),
])
@pytest.mark.parametrize("command", [["search", "query"], ["open", "d3"]])
def test_a_damaged_manifest_is_named_with_the_rebuild(index, capsys, fields, problem, command):
    _edit(index, **fields)
    err = _fails([command[0], "--index", str(index), command[1]], capsys)
    assert f"error: {index / 'manifest.json'} is damaged ({problem}" in err
    assert f"rebuild it with: python -m ziprl.index build --corpus CORPUS.jsonl --out {index} --overwrite" in err


@pytest.mark.parametrize(("damage", "needle"), [
    (lambda p: p.write_bytes(p.read_bytes()[:300]), r"shard-001 cannot be read \(.*\)"),
    (lambda p: np.save(p, np.zeros((14, DIM), np.float32)), rf"shape \(14, {DIM}\) of float32"),
    (lambda p: np.save(p, np.zeros((15, 8), np.float32)), r"shape \(15, 8\) of float32"),
    (lambda p: np.save(p, np.zeros((15, DIM), np.int32)), rf"shape \(15, {DIM}\) of int32"),
])
def test_damaged_stored_vectors_are_named(index, damage, needle):
    damage(index / "shard-001" / "vectors.npy")
    with pytest.raises(RetrieverError, match=rf"{needle}.*; rebuild it with: .* --out {index} --overwrite"):
        Retriever.load(index, Encoder())


def test_stored_vectors_of_the_wrong_shape_are_refused_by_search(index, capsys):
    np.save(index / "shard-000" / "vectors.npy", np.zeros((15, 8), np.float32))
    err = _fails(["search", "--index", str(index), "query"], capsys)
    assert (f"{index / 'shard-000' / 'vectors.npy'} does not match its manifest (manifest: 15 vectors of dim {DIM}; "
            "vectors.npy: shape (15, 8) of float32)") in err


def test_id_rows_out_of_range_are_named(index, capsys):
    rows = np.load(index / "shard-000" / "id_row.npy")
    np.save(index / "shard-000" / "id_row.npy", rows + 1000)
    err = _fails(["open", "--index", str(index), "d3"], capsys)
    assert f"{index / 'shard-000' / 'id_row.npy'} is damaged (row 100" in err
    assert "is outside 0..14); rebuild it with: " in err
    assert cli(["open", "--index", str(index), "d20"]) == 0  # the other shard is whole


def test_a_damaged_manifest_is_rebuilt_with_overwrite(built, index):
    _, corpus, emb = built
    _edit(index, shards="abc")
    with pytest.raises(RetrieverError, match="other inputs or settings; nothing was written: pass --overwrite"):
        build_index(corpus, index, Encoder(), progress=False, embeddings=emb)
    build_index(corpus, index, Encoder(), progress=False, embeddings=emb, overwrite=True)
    assert len(Retriever.load(index, Encoder())) == N


ENCODERS = {"empty": None, "config without weights": '{"model_type": "bert"}', "invalid config": "{oops"}


@pytest.mark.parametrize("config", ENCODERS.values(), ids=ENCODERS.keys())
def test_an_encoder_directory_without_a_model_is_named(built, tmp_path, capsys, config):
    enc = tmp_path / "enc"
    enc.mkdir()
    if config is not None:
        (enc / "config.json").write_text(config)
    err = _fails(["build", "--corpus", str(built[1]), "--out", str(tmp_path / "new"), "--encoder", str(enc),
                  "--no-progress"], capsys)
    assert f"error: encoder {enc} cannot be loaded as a sentence-transformers model (" in err
    assert "pass a sentence-transformers model directory" in err and "leave --encoder" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["enc"]


def test_search_names_the_manifests_encoder_when_it_holds_no_model(index, tmp_path, capsys):
    enc = tmp_path / "enc"
    enc.mkdir()
    _edit(index, encoder=f"local:{enc}", encoder_path=str(enc))
    err = _fails(["search", "--index", str(index), "query"], capsys)
    assert f"error: encoder {enc} cannot be loaded as a sentence-transformers model (" in err
