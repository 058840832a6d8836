"""Evaluation: the paper's comparison of context strategies (:mod:`~ziprl.evaluation.harness`) and its
noisy-retrieval sweep (:mod:`~ziprl.evaluation.noise`); ``python -m ziprl.eval`` runs both."""
