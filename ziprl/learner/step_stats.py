"""What an RL step measured, beside the step that does the update (:func:`~ziprl.learner.step.update_step`).

:class:`StepStats` is filled in as the step runs: the advantages' statistics, per-token sums over the real
micro-batches (:class:`StepSums`, one all-reduce over the ranks), the time of each part of the step on the device's
clock, the model FLOP utilisation, and the update probe (the micro-batch whose log-probs are read again after the
update). :meth:`StepStats.metrics` is what ``Trainer.train_step`` returns and ``metrics.jsonl`` logs as ``learner/*``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ziprl.learner.batch import MicroBatch
from ziprl.learner.distributed import world_size
from ziprl.learner.hardware import model_flop_utilisation

ADVANTAGE_STATS = ("adv_mean", "adv_std", "hrr_abs_mean", "zero_variance_frac")  # of compute_advantages' stats
PARTS = ("forward", "reference", "backward", "optimizer")  # the timed parts of a step's compute


@dataclass
class StepSums:
    """Sums over a step's real micro-batches (fillers excluded), summed again over the data-parallel ranks: the
    metrics are their ratios to ``tokens``."""

    loss: float = 0.0  # the micro-batch losses (each a weighted sum: their sum is the batch objective)
    tokens: float = 0.0  # response tokens
    clipped: float = 0.0  # response tokens whose ratio the clip bounds
    kl: float = 0.0  # k3 KL to the reference, per response token
    entropy: float = 0.0  # policy entropy, per response token
    mismatch: float = 0.0  # |log pi_learner - log pi_rollout|, per response token
    tis: float = 0.0  # rollout-correction weight, per response token (1 without the correction)
    trained_tokens: float = 0.0  # real tokens of the rows (prompts and responses)
    computed_tokens: float = 0.0  # tokens the forwards ran (a shared prefix once)

    def all_reduce(self, device: torch.device) -> StepSums:
        """These sums over every rank: packed into one float64 tensor on ``device``, one all-reduce, unpacked."""
        if world_size() == 1:
            return self
        packed = torch.tensor(dataclasses.astuple(self), dtype=torch.float64, device=device)
        torch.distributed.all_reduce(packed)
        return StepSums(*packed.tolist())


def sign_tokens(mb: MicroBatch, sign: str) -> Tensor:
    """The response tokens of ``mb`` whose advantage has ``sign`` ("pos" | "neg")."""
    return mb.loss_mask.bool() & ((mb.adv > 0) if sign == "pos" else (mb.adv < 0))


def takes_probe(held: tuple[bool, bool] | None, has: bool, both: bool) -> bool:
    """Whether a micro-batch replaces ``held`` (it has the sign's tokens, it has both signs'; None: none yet) as the
    update probe of one advantage sign, micro-batches seen in order: the first with the sign's tokens, and among
    those the first holding both signs (one forward then measures both), else the first micro-batch."""
    return held is None or (has and not held[0]) or (both and not held[1])


@dataclass
class Probe:
    """The micro-batch an advantage sign's update is measured on, with its log-probs before the update."""

    batch: MicroBatch
    before: Tensor
    has: bool  # it holds response tokens of the sign
    both: bool  # it holds response tokens of both signs


@dataclass
class StepStats:
    """The accumulator of one step; created as the step starts (its clock's first reading).

    ``clock`` reads the learner device's clock (:func:`~ziprl.learner.hardware.device_clock`); ``gemm_peak`` (FLOP/s,
    measured as the step ends, in its conditions) and ``num_params`` give the MFU, which a step without ``gemm_peak``
    does not report.
    """

    clock: Callable[[], float]
    gemm_peak: Callable[[], float] | None = None
    num_params: int = 0
    advantages: dict[str, float] = field(default_factory=dict)  # ADVANTAGE_STATS
    outcome: str = "trained"  # "trained" | "skipped" (no rows) | "zero_gradient" (taken without forward or backward)
    turns: int = 0  # training rows
    passes: int = 0  # forward/backward passes this rank ran (fillers included)
    sums: StepSums = field(default_factory=StepSums)
    mismatch_max: float = 0.0  # on this rank
    lr: float = 0.0  # the step's learning rate
    grad_norm: float = float("nan")  # before clipping
    policy_version: int = 0  # after the step
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))  # per part
    elapsed: float = 0.0  # the step, start to its optimizer step and statistics (without the probe)
    peak_flops: float = 0.0
    probes: dict[str, Probe] = field(default_factory=dict)  # per advantage sign
    dlogp: dict[str, float] = field(default_factory=dict)  # per advantage sign: the probe's mean change of log pi
    start: float = field(init=False)
    _last: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.start = self._last = self.clock()

    def mark(self) -> None:
        """Start timing a part (:meth:`lap` ends it)."""
        self._last = self.clock()

    def lap(self, part: str) -> None:
        """Add the time since the last :meth:`mark` or :meth:`lap` to ``part``."""
        now = self.clock()
        self.seconds[part] = self.seconds.get(part, 0.0) + now - self._last
        self._last = now

    def add(self, loss: float, st: dict[str, float], entropy: float, trained: float, computed: float) -> None:
        """One real micro-batch: its loss, the policy loss's statistics ``st`` (token means and count), its summed
        entropy, real tokens and computed tokens."""
        n, s = st["tokens"], self.sums
        s.loss += loss
        s.tokens += n
        s.clipped += st["clip_frac"] * n
        s.kl += st.get("kl_mean", 0.0) * n
        s.entropy += entropy
        s.mismatch += st["mismatch_abs_mean"] * n
        s.tis += st.get("tis_mean", 1.0) * n
        s.trained_tokens += trained
        s.computed_tokens += computed
        self.mismatch_max = max(self.mismatch_max, st["mismatch_abs_max"])

    def offer_probe(self, mb: MicroBatch, logp: Tensor) -> None:
        """Consider ``mb`` (log-probs ``logp``) as the probe of each advantage sign (:func:`takes_probe`); every rank
        offers every micro-batch, so every rank probes as many (ZeRO-3 gathers collectively)."""
        has = {sign: bool(sign_tokens(mb, sign).any()) for sign in ("pos", "neg")}
        both = all(has.values())
        for sign, held in has.items():
            probe = self.probes.get(sign)
            if takes_probe((probe.has, probe.both) if probe else None, held, both):
                self.probes[sign] = Probe(mb, logp.detach(), held, both)

    def stop(self) -> None:
        """The step's compute is done: its elapsed time, then the GEMM peak in the same conditions."""
        self.elapsed = self.clock() - self.start
        if self.gemm_peak is not None and self.outcome == "trained":
            self.peak_flops = self.gemm_peak()

    def metrics(self) -> dict[str, float]:
        """The step's statistics (``learner/*`` in metrics.jsonl); a skipped or zero-gradient step reports fewer."""
        s = self.sums
        if self.outcome == "skipped":
            return {**self.advantages, "skipped": 1.0, "seconds": self.elapsed}
        if self.outcome == "zero_gradient":
            return {**self.advantages, "loss": 0.0, "clip_frac": 0.0, "kl": 0.0, "grad_norm": self.grad_norm,
                    "lr": self.lr, "tokens": s.tokens, "trained_tokens": 0.0, "computed_tokens": 0.0,
                    "turns": float(self.turns), "policy_version": float(self.policy_version),
                    "optimizer_seconds": self.seconds["optimizer"], "zero_gradient": 1.0, "seconds": self.elapsed}
        out = {
            **self.advantages,
            "loss": s.loss,
            "clip_frac": s.clipped / s.tokens,
            "kl": s.kl / s.tokens,
            "entropy": s.entropy / s.tokens,
            "grad_norm": self.grad_norm,
            "lr": self.lr,
            "tokens": s.tokens,
            "trained_tokens": s.trained_tokens,
            "computed_tokens": s.computed_tokens,
            "turns": float(self.turns),
            "passes": float(self.passes),
            "policy_version": float(self.policy_version),
            "mismatch_abs_mean": s.mismatch / s.tokens,
            "mismatch_abs_max": self.mismatch_max,
            "tis_mean": s.tis / s.tokens,
            **{f"{part}_seconds": self.seconds[part] for part in PARTS},
        }
        if self.gemm_peak is not None:  # per rank: each rank runs its share of the tokens (a shared prefix once)
            out["mfu"] = model_flop_utilisation(self.num_params, s.computed_tokens / world_size(), self.elapsed,
                                                self.peak_flops)
            out["gemm_peak_tflops"] = self.peak_flops / 1e12
        out["seconds"] = self.elapsed
        out.update({f"dlogp_{sign}_adv": value for sign, value in self.dlogp.items()})
        if "probe" in self.seconds:
            out["probe_seconds"] = self.seconds["probe"]  # after the step: not part of "seconds"
        return out
