"""The one cache root (``ZIPRL_CACHE``, the deprecated ``ZIPRL_CACHE_DIR``, the configured default) and the
atomic writers: a failed write keeps the old content and leaves no temp file behind."""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from ziprl.config import ModelConfig
from ziprl.paths import (
    atomic_dir,
    atomic_path,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    cache_root,
    file_sha256,
)
from ziprl.retrieval.retriever import default_index_dir


@pytest.fixture
def no_cache_env(monkeypatch):
    monkeypatch.delenv("ZIPRL_CACHE", raising=False)
    monkeypatch.delenv("ZIPRL_CACHE_DIR", raising=False)
    return monkeypatch


def test_cache_root_precedence(no_cache_env, tmp_path):
    assert cache_root() == Path.home() / ".cache" / "ziprl"
    assert cache_root(ModelConfig(cache_dir="~/elsewhere").cache_dir) == Path.home() / "elsewhere"
    no_cache_env.setenv("ZIPRL_CACHE_DIR", str(tmp_path / "old"))
    with pytest.warns(DeprecationWarning, match="set ZIPRL_CACHE instead"):
        assert cache_root("~/elsewhere") == tmp_path / "old"
    no_cache_env.setenv("ZIPRL_CACHE", str(tmp_path / "new"))
    with pytest.warns(DeprecationWarning, match="ignored because ZIPRL_CACHE is set"):
        assert cache_root("~/elsewhere") == tmp_path / "new"
    no_cache_env.delenv("ZIPRL_CACHE_DIR")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache_root("~/elsewhere") == tmp_path / "new"


def test_env_caches_follow_the_same_root(no_cache_env, tmp_path):
    """The retriever's index cache (env layer) reads the same variables as the policy's model cache."""
    encoder = SimpleNamespace(encoder_id="e", query_prefix="", passage_prefix="")
    no_cache_env.setenv("ZIPRL_CACHE", str(tmp_path / "new"))
    assert default_index_dir(tmp_path / "c.jsonl", encoder, "flat").parent == tmp_path / "new" / "index"
    no_cache_env.delenv("ZIPRL_CACHE")
    no_cache_env.setenv("ZIPRL_CACHE_DIR", str(tmp_path / "old"))
    with pytest.warns(DeprecationWarning):
        assert default_index_dir(tmp_path / "c.jsonl", encoder, "flat").parent == tmp_path / "old" / "index"


@pytest.mark.parametrize("kind", ["bytes", "text", "json"])
def test_atomic_write_replaces_and_leaves_no_temp_file(kind, tmp_path):
    path = tmp_path / "sub" / "f.json"  # the parent is created
    write = {"bytes": lambda v: atomic_write_bytes(path, v.encode()), "text": lambda v: atomic_write_text(path, v),
             "json": lambda v: atomic_write_json(path, {"v": v})}[kind]
    for value in ("first", "second ü🙂"):
        assert write(value) == path
    text = path.read_text(encoding="utf-8")
    assert (json.loads(text)["v"] if kind == "json" else text) == "second ü🙂"
    assert [p.name for p in path.parent.iterdir()] == ["f.json"]


def test_a_writer_that_fails_midway_keeps_the_old_file(tmp_path):
    path = atomic_write_text(tmp_path / "f.txt", "old")
    with pytest.raises(RuntimeError, match="disk full"), atomic_path(path) as tmp:
        tmp.write_text("half of the new")
        raise RuntimeError("disk full")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "never.txt"):
        raise RuntimeError("before writing anything")
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_atomic_dir_replaces_a_whole_directory_or_nothing(tmp_path):
    dest = tmp_path / "model"
    with atomic_dir(dest) as tmp:
        (tmp / "a.txt").write_text("v1")
        (tmp / "nested").mkdir()
        (tmp / "nested" / "b.txt").write_text("v1")
    with pytest.raises(RuntimeError), atomic_dir(dest) as tmp:
        (tmp / "a.txt").write_text("v2")
        raise RuntimeError("killed")
    assert (dest / "a.txt").read_text() == "v1"
    assert (dest / "nested" / "b.txt").read_text() == "v1"
    with atomic_dir(dest) as tmp:
        (tmp / "c.txt").write_text("v3")
    assert sorted(p.name for p in dest.iterdir()) == ["c.txt"]  # replaced whole, nothing of v1 kept
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no temp or moved-aside directory left


def test_file_sha256_is_the_bytes_hash_and_follows_a_rewrite(tmp_path):
    f = tmp_path / "data.bin"
    f.write_bytes(b"x" * (3 << 20) + b"tail")  # more than one chunk
    assert file_sha256(f) == hashlib.sha256(f.read_bytes()).hexdigest() == file_sha256(str(f))
    st = f.stat()
    f.write_bytes(b"y" * (3 << 20) + b"tail")  # same size
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert file_sha256(f) == hashlib.sha256(f.read_bytes()).hexdigest()
