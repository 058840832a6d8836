"""Helpers shared by the tests (tests/) and the benchmarks (benchmarks/): a tiny model built from nothing, the
learning gate's tasks, hypothesis strategies for agent turns, synthetic viewer runs and word retrievers.

The top layer: it may import anything in ZipRL, and nothing in ZipRL imports it. This file imports nothing, so a
helper's own dependencies (hypothesis, a dev dependency, in ``fuzz_strategies``) load only with that helper."""
