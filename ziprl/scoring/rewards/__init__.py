"""Outcome rewards, one module each, registered in :data:`ziprl.registry.REWARDS` when first looked up.

A reward is a function ``(prediction, gold_answers) -> float`` decorated with ``@REWARDS.register("name")``;
``env.reward=name`` selects it.
"""
