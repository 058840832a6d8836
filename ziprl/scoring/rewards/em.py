"""``em``: exact match after SQuAD normalisation (the paper's reward)."""

from ziprl.registry import REWARDS
from ziprl.scoring.metrics import exact_match

REWARDS.register("em", order=0)(exact_match)
