"""The step's accumulator: named sums, their one all-reduce, the device-clock split, the update probe's choice, and
the metrics of a trained, a zero-gradient and a skipped step."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ziprl.learner import step_stats
from ziprl.learner.batch import TurnRow, collate
from ziprl.learner.step_stats import PARTS, StepStats, StepSums, takes_probe


def ticking_clock():
    """A clock that reads 0, 1, 2, ... (one second per reading)."""
    readings = iter(range(1000))
    return lambda: float(next(readings))


def loss_stats(tokens: float, clip: float = 0.0, kl: float | None = None, gap: float = 0.0, gap_max: float = 0.0,
               tis: float | None = None) -> dict[str, float]:
    """What a policy loss reports for one micro-batch (token means and its token count)."""
    st = {"tokens": tokens, "clip_frac": clip, "mismatch_abs_mean": gap, "mismatch_abs_max": gap_max}
    if kl is not None:
        st["kl_mean"] = kl
    if tis is not None:
        st["tis_mean"] = tis
    return st


def test_micro_batches_add_into_named_sums_and_the_metrics_are_their_ratios():
    stats = StepStats(ticking_clock())
    stats.add(-0.5, loss_stats(4, clip=0.25, kl=0.1, gap=0.2, gap_max=0.4, tis=1.5), entropy=8.0, trained=10,
              computed=7)
    stats.add(0.25, loss_stats(6, clip=0.5, kl=0.2, gap=0.1, gap_max=0.3, tis=1.0), entropy=3.0, trained=12,
              computed=12)
    s = stats.sums
    assert s.loss == pytest.approx(-0.25)
    assert s.tokens == 10
    assert s.clipped == pytest.approx(4 * 0.25 + 6 * 0.5)
    assert s.kl == pytest.approx(4 * 0.1 + 6 * 0.2)
    assert s.entropy == pytest.approx(11.0)
    assert s.mismatch == pytest.approx(4 * 0.2 + 6 * 0.1)
    assert s.tis == pytest.approx(4 * 1.5 + 6 * 1.0)
    assert (s.trained_tokens, s.computed_tokens) == (22, 19)
    assert stats.mismatch_max == pytest.approx(0.4)
    stats.stop()
    out = stats.metrics()
    assert out["clip_frac"] == pytest.approx(0.4)
    assert out["kl"] == pytest.approx(0.16)
    assert out["entropy"] == pytest.approx(1.1)
    assert out["mismatch_abs_mean"] == pytest.approx(0.14)
    assert out["tis_mean"] == pytest.approx(1.2)
    assert out["mismatch_abs_max"] == pytest.approx(0.4)


def test_a_loss_without_kl_or_correction_counts_kl_0_and_weight_1():
    stats = StepStats(ticking_clock())
    stats.add(0.0, loss_stats(5), entropy=0.0, trained=5, computed=5)
    assert stats.sums.kl == 0.0
    assert stats.sums.tis == 5.0


def test_the_sums_travel_as_one_tensor_and_come_back_by_name(monkeypatch):
    """Several ranks: one all-reduce of all the sums, unpacked into the same fields (here a fake 2-rank sum)."""
    calls = []

    def fake_all_reduce(t):
        calls.append(t.dtype)
        t.mul_(2)

    sums = StepSums(*[float(k + 1) for k in range(len(dataclasses.fields(StepSums)))])
    assert sums.all_reduce(torch.device("cpu")) is sums  # one rank: nothing to reduce
    monkeypatch.setattr(step_stats, "world_size", lambda: 2)
    monkeypatch.setattr(torch.distributed, "all_reduce", fake_all_reduce)
    reduced = sums.all_reduce(torch.device("cpu"))
    assert calls == [torch.float64]
    for f in dataclasses.fields(StepSums):
        assert getattr(reduced, f.name) == 2 * getattr(sums, f.name), f.name


def test_parts_are_timed_by_marks_and_laps_on_the_clock():
    """One reading to start, one per mark and per lap; a lap adds the time since the last reading to its part."""
    stats = StepStats(ticking_clock())  # reading 0
    stats.mark()  # 1
    stats.lap("forward")  # 2: +1
    stats.lap("reference")  # 3: +1
    stats.mark()  # 4
    stats.lap("forward")  # 5: +1
    stats.add(1.0, loss_stats(2), entropy=1.0, trained=4, computed=4)
    stats.stop()  # 6: the step's seconds
    assert stats.seconds == {"forward": 2.0, "reference": 1.0, "backward": 0.0, "optimizer": 0.0}
    assert stats.elapsed == 6.0
    out = stats.metrics()
    assert [out[f"{part}_seconds"] for part in PARTS] == [2.0, 1.0, 0.0, 0.0]
    assert "probe_seconds" not in out
    assert "mfu" not in out  # no probe timed, no GEMM peak given


def test_the_mfu_uses_the_gemm_peak_measured_as_the_step_stops():
    peaks = []
    stats = StepStats(ticking_clock(), gemm_peak=lambda: peaks.append(1) or 1e12, num_params=1000)
    stats.add(1.0, loss_stats(2), entropy=1.0, trained=500, computed=500)
    stats.stop()  # elapsed 1 s
    out = stats.metrics()
    assert peaks == [1]
    assert out["gemm_peak_tflops"] == 1.0
    assert out["mfu"] == pytest.approx(6 * 1000 * 500 / 1e12)


def test_a_skipped_and_a_zero_gradient_step_report_their_own_keys():
    adv = {"adv_mean": 0.0, "adv_std": 0.0, "hrr_abs_mean": 0.0, "zero_variance_frac": 1.0}
    skipped = StepStats(ticking_clock(), gemm_peak=lambda: 1e12, advantages=adv, outcome="skipped")
    skipped.stop()
    assert skipped.metrics() == {**adv, "skipped": 1.0, "seconds": 1.0}
    zero = StepStats(ticking_clock(), gemm_peak=lambda: pytest.fail("no GEMM peak for a step without compute"),
                     advantages=adv, outcome="zero_gradient", turns=3, lr=1e-3, grad_norm=0.0, policy_version=2)
    zero.sums.tokens = 12.0
    zero.stop()
    assert zero.metrics() == {**adv, "loss": 0.0, "clip_frac": 0.0, "kl": 0.0, "grad_norm": 0.0, "lr": 1e-3,
                              "tokens": 12.0, "trained_tokens": 0.0, "computed_tokens": 0.0, "turns": 3.0,
                              "policy_version": 2.0, "optimizer_seconds": 0.0, "zero_gradient": 1.0, "seconds": 1.0}


def test_a_trained_step_reports_every_key_the_logs_read():
    stats = StepStats(ticking_clock(), gemm_peak=lambda: 1e12, num_params=10,
                      advantages=dict.fromkeys(step_stats.ADVANTAGE_STATS, 0.0))
    stats.add(1.0, loss_stats(2), entropy=1.0, trained=4, computed=4)
    stats.stop()
    stats.dlogp = {"pos": 0.1, "neg": -0.1}
    stats.mark()
    stats.lap("probe")
    assert list(stats.metrics()) == [
        "adv_mean", "adv_std", "hrr_abs_mean", "zero_variance_frac", "loss", "clip_frac", "kl", "entropy",
        "grad_norm", "lr", "tokens", "trained_tokens", "computed_tokens", "turns", "passes", "policy_version",
        "mismatch_abs_mean", "mismatch_abs_max", "tis_mean", "forward_seconds", "reference_seconds",
        "backward_seconds", "optimizer_seconds", "mfu", "gemm_peak_tflops", "seconds", "dlogp_pos_adv",
        "dlogp_neg_adv", "probe_seconds"]


def row(adv: float) -> TurnRow:
    return TurnRow(input_ids=[1, 2, 3, 4], response_start=2, old_logp=[0.0, 0.0], advantage=adv, weight=1.0,
                   traj_index=0)


def test_the_probe_of_each_sign_is_the_first_micro_batch_holding_both_else_its_first():
    stats = StepStats(ticking_clock())
    pos, neg, both = collate([row(1.0)], 0), collate([row(-1.0)], 0), collate([row(1.0), row(-1.0)], 0)
    for mb in (pos, neg, both, pos):
        stats.offer_probe(mb, torch.zeros(mb.input_ids.shape))
    assert stats.probes["pos"].batch is both
    assert stats.probes["neg"].batch is both
    assert stats.probes["pos"].has
    assert stats.probes["pos"].both


@pytest.mark.parametrize(("micro_batches", "chosen"), [
    ([(True, False), (True, True)], (1, 1)),  # a later micro-batch holding both: one forward, not two
    ([(True, True), (True, False), (True, True)], (0, 0)),
    ([(True, False), (False, True)], (0, 1)),
    ([(True, False), (False, True), (True, True)], (2, 2)),
    ([(False, False), (False, True)], (0, 1)),
    ([(False, False), (False, False)], (0, 0)),
])
def test_the_update_probe_prefers_one_micro_batch_holding_both_signs(micro_batches, chosen):
    """Micro-batches seen in order, each (has positive-, has negative-advantage tokens): the one each sign probes."""
    held: dict[int, tuple[int, tuple[bool, bool]]] = {}
    for k, flags in enumerate(micro_batches):
        for sign in (0, 1):
            if takes_probe(held[sign][1] if sign in held else None, flags[sign], all(flags)):
                held[sign] = (k, (flags[sign], all(flags)))
    assert (held[0][0], held[1][0]) == chosen
