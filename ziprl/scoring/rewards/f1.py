"""``f1``: token-level F1 against the best-matching gold answer (a denser signal than EM)."""

from ziprl.registry import REWARDS
from ziprl.scoring.metrics import f1_score

REWARDS.register("f1", order=1)(f1_score)
