"""The learning gate: the production update path must make the agent better, and a broken update must fail it.

``ziprl.train``'s path (``train_loop`` with the in-process rollout source, ``compute_advantages``, the DeepSpeed
``Trainer``, the weight push into the ``HFEngine`` that generates the next step) trains a cold-started 2-layer
Llama on a one-turn colour bandit played through the real env (``tests/learning_task.py``). Chance is 1/4; the
reward must climb from its measured starting rate to >= 0.6 in 16 steps, with on-policy log-probs that agree.
``benchmarks/learning_gate.py`` measures the margin over seeds and shows that each mutation of the update path
(advantage sign, loss mask shifted, optimizer step skipped, weights not pushed, behaviour log-probs off by one
token) fails this gate (``benchmarks/results/learning_gate.md``).
"""

from __future__ import annotations

from tests.learning_task import (
    GATE_SEED,
    MAX_ONPOLICY_GAP,
    MIN_END,
    MIN_GAIN,
    cold_start,
    run_gate,
    write_dataset,
)


def test_the_update_path_learns_the_bandit(tiny_model_dir, tmp_path):
    dataset = write_dataset(tmp_path / "questions.jsonl")
    stage1 = cold_start(tiny_model_dir, dataset, tmp_path / "stage1")
    result = run_gate(stage1, dataset, tmp_path / "run", seed=GATE_SEED)
    print("learning gate:", result)
    assert result["max_onpolicy_gap"] <= MAX_ONPOLICY_GAP, result
    assert result["start"] <= 0.45, result  # starts near chance (1/4): nothing learned before RL
    assert result["end"] >= MIN_END and result["end"] - result["start"] >= MIN_GAIN, result
    assert result["passed"]


def test_hrr_alone_raises_compression_quality(tiny_model_dir, tmp_path):
    """Every reward is 0 (A_GRPO = 0): w = 0.2 trains on the HRR term alone and raises the mean Q_com of the
    compress turns; w = 0 (same seed, same questions and sampling) has no gradient at all."""
    from tests.learning_task import HRR_MIN_GAIN, HRR_MIN_LEAD, hrr_cold_start, run_hrr, write_hrr_dataset

    dataset = write_hrr_dataset(tmp_path / "questions.jsonl")
    stage1 = hrr_cold_start(tiny_model_dir, dataset, tmp_path / "stage1")
    hrr, grpo = (run_hrr(stage1, dataset, tmp_path / f"w{w}", seed=GATE_SEED, w=w) for w in (0.2, 0.0))
    print("HRR check:", {k: v for k, v in hrr.items() if k != "q_com"}, {k: v for k, v in grpo.items() if k != "q_com"})
    assert set(hrr["rewards"]) == set(grpo["rewards"]) == {0.0}  # the outcome reward is held constant
    assert grpo["max_grad_norm"] == 0.0 and grpo["hrr_abs_mean"] == 0.0  # w = 0: nothing to learn from
    assert hrr["hrr_abs_mean"] > 0 and hrr["q_com"][0] == grpo["q_com"][0]  # same first step, then HRR trains
    assert hrr["gain"] >= HRR_MIN_GAIN, hrr
    assert hrr["end"] - grpo["mean"] >= HRR_MIN_LEAD, (hrr, grpo)  # w = 0's policy never moves: its whole run
