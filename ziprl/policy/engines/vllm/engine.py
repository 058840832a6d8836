"""Generation with vLLM (CUDA GPUs only; the optional ``gpu`` extra). vLLM is imported lazily.

Same contract as :class:`~ziprl.policy.engines.hf.engine.HFEngine`:

- log-probs are of the RAW model distribution (temperature 1, before top-p): vLLM V1's sampler defaults
  to ``logprobs_mode="raw_logprobs"``, "the original logits (before any penalties or temperature scaling)"
  (https://docs.vllm.ai/en/v0.10.0/api/vllm/v1/sample/sampler.html); ``logprobs=0`` returns just the
  sampled token's.
- stop strings end the response right after the string (``include_stop_str_in_output=True``); the token
  that completes it is the last token; EOS is kept in ``token_ids`` and left out of ``text``.

Weight updates, through the engine's :class:`~ziprl.weights.WeightReceiver` methods (``weights.transport``):

- ``load_weights`` (in process, object store): host tensors are handed to every worker through
  ``LLM.collective_rpc`` and a worker extension class (``worker_extension_cls``) that calls the model's
  ``load_weights``.
- collective (``join_weights`` / ``receive_weights``; the learner's end: :class:`NCCLSender`): vLLM's
  weight-transfer API (https://docs.vllm.ai/en/latest/training/weight_transfer/; checked
  against vLLM 0.33's source, ``vllm/entrypoints/rl/offline.py`` and
  ``vllm/distributed/weight_transfer/nccl_engine.py``): the LLM is built with
  ``weight_transfer_config={"backend": "nccl"}``; ``LLM.init_weight_transfer_engine({"init_info": ...})``
  joins the learner's NCCL group (TCPStore rendezvous, this engine's worker at ``rank_offset``), and a push is
  ``start_weight_update()``, ``update_weights({"update_info": {names, dtype_names, shapes}})`` (the workers
  receive one broadcast per tensor, unpacked, and call ``model.load_weights``) and
  ``finish_weight_update(weight_version)``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ziprl.config import SamplingConfig
from ziprl.policy.engine import Generation, GenerationEngine, stop_strings
from ziprl.weights.buckets import unpack

INSTALL_HINT = (
    "VLLMEngine needs vLLM, which runs only on CUDA GPUs: pip install 'ziprl[gpu]' (or pip install vllm) "
    "on a GPU machine; on CPU set model.engine=hf"
)


class LoadWeightsExtension:
    """Mixed into every vLLM worker (``worker_extension_cls``); called through ``LLM.collective_rpc``."""

    def ziprl_load_weights(self, named: list[tuple[str, Any]]) -> int:
        import torch

        model = self.model_runner.model  # type: ignore[attr-defined]  (set by the vLLM worker)
        model.load_weights(weights=((name, torch.as_tensor(value)) for name, value in named))
        return len(named)


def checkpoint_shapes(path: str | Path) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """Tensor name -> shape of a safetensors checkpoint (from the file headers; no weights loaded), and
    its tied pairs: with ``tie_word_embeddings`` the unstored ``lm_head.weight`` aliases the input embedding.
    """
    from safetensors import safe_open

    path = Path(path)
    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="numpy") as f:
            for name in f.keys():  # noqa: SIM118  (safe_open has keys(), not __iter__)
                shapes[name] = tuple(f.get_slice(name).get_shape())
    tied: dict[str, str] = {}
    config = json.loads((path / "config.json").read_text())
    embed = next((n for n in shapes if n.endswith("embed_tokens.weight")), None)
    if config.get("tie_word_embeddings") and embed and "lm_head.weight" not in shapes:
        shapes["lm_head.weight"] = shapes[embed]
        tied = {"lm_head.weight": embed, embed: "lm_head.weight"}
    return shapes, tied


def check_named_shapes(named_shapes: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]],
                       tied: dict[str, str]) -> None:
    """Raise on unknown names, shape mismatches, or tensors left without a new value (a tied pair needs one)."""
    unknown = sorted(set(named_shapes) - set(expected))
    if unknown:
        raise KeyError(f"load_weights: {len(unknown)} unknown parameter name(s), e.g. {unknown[:3]}")
    for name, shape in named_shapes.items():
        if tuple(shape) != expected[name]:
            raise ValueError(f"load_weights: {name} has shape {tuple(shape)}, the model expects {expected[name]}")
    missing = [n for n in expected if n not in named_shapes and tied.get(n) not in named_shapes]
    if missing:
        raise KeyError(f"load_weights: no new value for {len(missing)} parameter(s), e.g. {missing[:3]}")


class VLLMEngine(GenerationEngine):
    """A :class:`GenerationEngine` over ``vllm.LLM`` for a local HF checkpoint directory."""

    def __init__(self, path: str | Path, *, dtype: str = "bfloat16", gpu_memory_utilization: float = 0.5,
                 trust_remote_code: bool = False, **llm_kwargs: Any) -> None:
        try:
            import vllm
        except ImportError as exc:
            raise ImportError(INSTALL_HINT) from exc
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("VLLMEngine needs a CUDA GPU and none is visible; on CPU set model.engine=hf")
        self.path = Path(path)
        self._expected, self._tied = checkpoint_shapes(self.path)
        self.llm = vllm.LLM(model=str(self.path), dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                            trust_remote_code=trust_remote_code,
                            worker_extension_cls=f"{__name__}.LoadWeightsExtension",
                            weight_transfer_config={"backend": "nccl"}, **llm_kwargs)
        self._tokenizer = self.llm.get_tokenizer()
        self.max_context = json.loads((self.path / "config.json").read_text()).get("max_position_embeddings")
        self.version = 0
        self.tokens_generated = 0
        self.generation_seconds = 0.0

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, seed: int | None = None) -> list[Generation]:
        from vllm import SamplingParams

        if not prompts:
            return []
        start = time.perf_counter()
        greedy = sampling.greedy or sampling.temperature == 0
        params = [  # one seed per prompt: identical prompts in a GRPO group must still differ
            SamplingParams(temperature=0.0 if greedy else sampling.temperature, top_p=1.0 if greedy else sampling.top_p,
                           max_tokens=sampling.max_new_tokens, stop=stop_strings(sampling) or None,
                           include_stop_str_in_output=True, logprobs=0,
                           seed=None if seed is None else seed + i)
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        results = []
        for p, out in zip(prompts, outputs, strict=True):
            c = out.outputs[0]
            ids = list(c.token_ids)
            lps = [step[t].logprob for t, step in zip(ids, c.logprobs, strict=True)]
            results.append(Generation(list(p), ids, lps, c.text, "length" if c.finish_reason == "length" else "stop"))
        self.tokens_generated += sum(len(g.token_ids) for g in results)
        self.generation_seconds += time.perf_counter() - start
        return results

    def load_weights(self, named_arrays: dict[str, Any], version: int) -> None:
        """Validate against the checkpoint's names/shapes, load on every worker, drop stale prefix-cache KV."""
        check_named_shapes({n: tuple(a.shape) for n, a in named_arrays.items()}, self._expected, self._tied)
        named = [(n, a.detach().cpu() if hasattr(a, "detach") else a) for n, a in named_arrays.items()]
        self.llm.collective_rpc("ziprl_load_weights", args=(named,))
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self.version = version

    def join_weights(self, addr: str, port: int, rank: int, world: int, timeout_s: float, bind: str) -> None:
        """Join the learner's NCCL weight group as ``rank`` (this engine has one worker: tensor parallel 1); vLLM
        sets its own timeout and binding."""
        self.llm.init_weight_transfer_engine({"init_info": {
            "master_address": addr, "master_port": port, "rank_offset": rank, "world_size": world, "packed": False}})

    def receive_weights(self, metas: list[tuple[str, str, list[int]]], version: int) -> int:
        """Receive one push (the learner broadcasts the tensors of ``metas`` in order) into the workers' weights, in
        place, so only between batches: it waits for a generating batch to end (vLLM's engine is driven by one
        thread). Every member must take part in every broadcast, so a version this engine already holds (a re-send
        after another actor rejoined) is received and loaded again: the same weights."""
        with self._inbox().batch:
            check_named_shapes({n: tuple(s) for n, _, s in metas}, self._expected, self._tied)
            self.llm.start_weight_update()
            self.llm.update_weights({"update_info": {"names": [n for n, _, _ in metas],
                                                     "dtype_names": [d for _, d, _ in metas],
                                                     "shapes": [list(s) for _, _, s in metas]}})
            self.llm.finish_weight_update(weight_version=str(version))
            self.llm.reset_prefix_cache()
            self.version = max(self.version, version)
            return self.version

    @classmethod
    def sender_end(cls, addr: str, port: int, world: int, timeout_s: float, bind: str, device: Any) -> NCCLSender:
        return NCCLSender(addr, port, world)


class NCCLSender:
    """Learner rank 0's end of vLLM's NCCL weight transfer: ``vllm.distributed.weight_transfer.nccl_common.
    trainer_init`` hosts the rendezvous, and a push broadcasts tensor by tensor, unpacked, in the announced order
    (as vLLM's ``NCCLTrainerWeightTransferEngine`` does)."""

    def __init__(self, addr: str, port: int, world: int):
        from vllm.distributed.weight_transfer.nccl_common import trainer_init

        self.comm = trainer_init({"master_address": addr, "master_port": port, "world_size": world})

    def send(self, version: int, count: int, buckets: Any) -> int:
        """Broadcast every tensor of the packed ``buckets``; returns the bytes sent."""
        import torch

        sent = 0
        for metas, buf in buckets:
            for t in unpack(metas, buf).values():
                self.comm.broadcast(t, src=0, stream=torch.cuda.current_stream())
            sent += buf.numel()
        return sent
