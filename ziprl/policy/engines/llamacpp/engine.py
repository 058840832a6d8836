"""Generation with llama.cpp on CPU (llama-cpp-python's C API): batched, unpadded, weights refreshed in place.

The checkpoint's weights are written once into a GGUF file in ``dtype`` (in a temporary directory of its own on the
RAM-backed ``/dev/shm`` where there is one, removed as soon as the file is mapped: the mappings keep its pages, and
nothing is left behind even by a killed process); llama.cpp computes from its mapping, so
:meth:`LlamaCppEngine.load_weights` writes the learner's new weights into the file's tensor bytes and the next
forward pass uses them: no conversion to another format, no reload (:mod:`ziprl.policy.engines.llamacpp.gguf`).

A batch runs as llama.cpp sequences: the prompts' shared leading tokens (the system prompt) once, copied to every
sequence, then every prompt's own tokens in one unpadded batch, then one token per running row per step. Sampling,
behaviour log-probs (raw, temperature 1) and stops are :mod:`ziprl.policy.decoding`'s, as in ``HFEngine``.
"""

from __future__ import annotations

import ctypes
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ziprl.config import SamplingConfig
from ziprl.policy.decoding import DecodeRows, eos_ids, generator, sample
from ziprl.policy.engine import Generation, GenerationEngine
from ziprl.policy.engines.llamacpp.gguf import (
    GGUF_DTYPES,
    MappedWeights,
    UnsupportedModel,
    check_config,
    write_gguf,
)
from ziprl.policy.kv import shared_prefix_len
from ziprl.policy.models import load_tokenizer

_GGML_TYPES = {"float32": 0, "float16": 1, "bfloat16": 30}  # enum ggml_type
_LOG: list[Any] = []  # the log callback, kept alive while llama.cpp holds it


def _llama() -> Any:
    """llama-cpp-python's ctypes bindings, imported on first use, llama.cpp logging warnings and errors only."""
    import llama_cpp  # the config checked it is installed (EngineSpec.requires)
    if not _LOG:
        @llama_cpp.llama_log_callback
        def warnings_only(level: int, text: bytes, user_data: Any) -> None:
            # GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR (its info lines are per tensor); "adding N dummy tokens" is
            # the tokenizer-free GGUF it is given on purpose
            if level in (3, 4) and b"dummy tokens" not in text:
                print(text.decode(errors="replace"), end="", file=sys.stderr, flush=True)

        _LOG.append(warnings_only)
        llama_cpp.llama_backend_init()
        llama_cpp.llama_log_set(warnings_only, ctypes.c_void_p())
    return llama_cpp


class LlamaCppEngine(GenerationEngine):
    """A :class:`GenerationEngine` over llama.cpp, from a local HF Llama checkpoint (safetensors).

    ``dtype`` is the GGUF tensor type of the weight matrices (float32 | bfloat16 | float16); ``threads`` llama.cpp's
    CPU threads (0 = torch's thread count). :meth:`close` (or dropping the engine) frees llama.cpp's memory.
    """

    def __init__(self, path: str | Path, *, dtype: str = "float32", threads: int = 0) -> None:
        from safetensors.torch import load_file
        from transformers import AutoConfig, GenerationConfig

        path = Path(path)
        if dtype not in GGUF_DTYPES:
            raise ValueError(f"llamacpp engine: dtype {dtype!r} is not one of {sorted(GGUF_DTYPES)}")
        self._ll = _llama()
        self.config = AutoConfig.from_pretrained(path, trust_remote_code=False)
        check_config(self.config)
        self._tokenizer = load_tokenizer(path)
        self.eos_ids = eos_ids(GenerationConfig.from_pretrained(path).eos_token_id
                               if (path / "generation_config.json").is_file() else None, self._tokenizer)
        self.vocab_size = int(self.config.vocab_size)
        self.threads = threads or torch.get_num_threads()
        self.weights_device, self.weights_dtype = "cpu", dtype
        self.max_context = self.config.max_position_embeddings
        self.version = 0
        self.tokens_generated = 0
        self.generation_seconds = 0.0
        self._model = self._ctx = None
        self._n_ctx = self._n_seq = 0
        shards = sorted(path.glob("*.safetensors"))
        if not shards:
            raise UnsupportedModel(f"{path} holds no .safetensors weights, which model.engine=llamacpp reads: "
                                   f"save the model with save_pretrained (safetensors), or use model.engine=hf")
        weights: dict[str, Any] = {}
        for shard in shards:
            weights.update(load_file(str(shard)))
        shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
        own = Path(tempfile.mkdtemp(prefix="ziprl-llamacpp-", dir=shm))
        try:
            file = own / "model.gguf"
            write_gguf(file, self.config, weights, dtype)
            del weights
            self.weights = MappedWeights(file, self.config, dtype)
            params = self._ll.llama_model_default_params()
            params.load_mode = self._ll.LLAMA_LOAD_MODE_MMAP  # compute from the mapping load_weights writes into
            self._model = self._ll.llama_model_load_from_file(str(file).encode(), params)
            if not self._model:
                raise RuntimeError(f"llama.cpp could not load {file}")
        finally:
            # both mappings keep the file's pages; without a name it cannot outlive the process, even a killed one
            shutil.rmtree(own, ignore_errors=True)

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def close(self) -> None:
        """Free llama.cpp's context and model (and with them the mapped weights)."""
        if getattr(self, "_ctx", None):
            self._ll.llama_batch_free(self._batch)
            self._ll.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            self._ll.llama_model_free(self._model)
            self._model = None
        self.__dict__.pop("weights", None)

    def __del__(self, finalizing: Any = sys.is_finalizing) -> None:
        # at exit the bindings may be gone before the engine, and so may this module's globals (``sys``)
        if not finalizing():
            self.close()

    def _context(self, n_ctx: int, n_seq: int) -> None:
        """A context with room for ``n_seq`` sequences of ``n_ctx`` tokens each (kept while it is big enough)."""
        if self._ctx and n_ctx <= self._n_ctx and n_seq <= self._n_seq:
            self._ll.llama_memory_clear(self._ll.llama_get_memory(self._ctx), True)
            return
        if self._ctx:
            self._ll.llama_batch_free(self._batch)
            self._ll.llama_free(self._ctx)
            self._ctx = None
        n_ctx, n_seq = max(-(-n_ctx // 256) * 256, self._n_ctx), max(n_seq, self._n_seq)  # llama.cpp pads to 256
        params = self._ll.llama_context_default_params()
        params.n_ctx = n_ctx * n_seq
        params.n_batch = params.n_ctx
        params.n_seq_max = n_seq
        params.n_threads = params.n_threads_batch = self.threads
        params.no_perf = True
        params.type_k = params.type_v = _GGML_TYPES[self.weights_dtype]  # keys and values kept as the weights are
        self._ctx = self._ll.llama_init_from_model(self._model, params)
        if not self._ctx:
            raise RuntimeError(f"llama.cpp could not make a context of {n_seq} x {n_ctx} tokens")
        self._batch = self._ll.llama_batch_init(params.n_batch, 0, 1)
        self._n_ctx, self._n_seq = n_ctx, n_seq

    def _decode(self, tokens: list[int], positions: list[int], seqs: list[int], last: list[bool]) -> torch.Tensor:
        """One llama_decode of the given tokens; float32 logits [rows with ``last``, V]."""
        b = self._batch
        for i, (t, p, s, want) in enumerate(zip(tokens, positions, seqs, last, strict=True)):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = t, p, 1, s, want
        b.n_tokens = len(tokens)
        rc = self._ll.llama_decode(self._ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} for a batch of {len(tokens)} tokens")
        rows = sum(last)
        logits = np.ctypeslib.as_array(self._ll.llama_get_logits(self._ctx), shape=(rows, self.vocab_size))
        return torch.from_numpy(logits.copy())

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, seed: int | None = None) -> list[Generation]:
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        bad = [t for p in prompts for t in p if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        start = time.perf_counter()
        greedy = sampling.greedy or sampling.temperature == 0
        gen = generator("cpu", seed)
        chunk = int(self._ll.llama_max_parallel_sequences())
        out: list[Generation] = []
        for i in range(0, len(prompts), chunk):
            rows = DecodeRows(self._tokenizer, self.eos_ids, prompts[i: i + chunk], sampling)
            self._run(rows, sampling, greedy, gen)
            self.tokens_generated += rows.count
            out += rows.generations()
        self.generation_seconds += time.perf_counter() - start
        return out

    def _run(self, rows: DecodeRows, sampling: SamplingConfig, greedy: bool, gen: torch.Generator) -> None:
        prompts = rows.prompts
        self._context(max(map(len, prompts)) + sampling.max_new_tokens, len(prompts))
        mem = self._ll.llama_get_memory(self._ctx)
        s = shared_prefix_len(prompts) if len(prompts) > 1 else 0
        if s:  # the shared leading tokens once, in sequence 0, then copied to the others
            self._decode(prompts[0][:s], list(range(s)), [0] * s, [False] * s)
            for j in range(1, len(prompts)):
                self._ll.llama_memory_seq_cp(mem, 0, j, -1, -1)
        tokens, positions, seqs, last = [], [], [], []
        for j, p in enumerate(prompts):
            tokens += p[s:]
            positions += range(s, len(p))
            seqs += [j] * (len(p) - s)
            last += [False] * (len(p) - s - 1) + [True]
        logits = self._decode(tokens, positions, seqs, last)
        for step in range(sampling.max_new_tokens):
            next_tok = sample(logits, sampling, greedy, gen)
            running = rows.active
            keep = rows.record(next_tok, logits)
            for r in set(running) - set(rows.active):  # finished: free its cells
                self._ll.llama_memory_seq_rm(mem, r, -1, -1)
            if not keep or step == sampling.max_new_tokens - 1:
                break
            active = rows.active  # each feeds back its last token, at the position after its others
            logits = self._decode([int(next_tok[j]) for j in keep],
                                  [len(prompts[r]) + len(rows.tokens[r]) - 1 for r in active], active,
                                  [True] * len(keep))

    def load_weights(self, named_arrays: dict[str, Any], version: int) -> None:
        """Write new weights (HF names -> numpy arrays or tensors) into the mapped GGUF file; all are checked before
        any is written. Unknown names, shape mismatches and tensors left without a new value raise."""
        self.weights.write(named_arrays)
        self.version = version
