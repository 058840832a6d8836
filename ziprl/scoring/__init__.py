"""Scoring: answer metrics (EM, F1) and compression quality Q_com. Pure Python (stdlib + nltk)."""

from ziprl.scoring.compression import CompressionScore, compression_quality
from ziprl.scoring.keywords import extract_keywords
from ziprl.scoring.levels import LEVELS, LevelSpec, level_spec
from ziprl.scoring.metrics import exact_match, f1_score, normalize_answer

__all__ = [
    "LEVELS",
    "CompressionScore",
    "LevelSpec",
    "compression_quality",
    "exact_match",
    "extract_keywords",
    "f1_score",
    "level_spec",
    "normalize_answer",
]
