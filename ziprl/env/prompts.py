"""Building blocks of the system prompts (each strategy composes its own): the tools, the five granularity
levels and the turn format of the multi-granularity, coarse-to-fine prompt."""

from __future__ import annotations

from ziprl.config import EnvConfig
from ziprl.registry import TOOLS
from ziprl.scoring.levels import level_spec

_LEVEL_RETAINS = {
    1: "only the core conclusion",
    2: "the main facts and key conclusions",
    3: "decision points and the important context",
    4: "the full logical chain and important details",
    5: "nearly all critical information",
}

MEMORY = ("You see the question, your notes, and the newest OBSERVATION only once: compress it into a note "
          "in full sentences, keeping names, dates and numbers the question needs.\n")
THINK_FORMAT = "Turn format: <think>reasoning</think> then one action tag."
COMPRESS_FORMAT = """Turn format (nothing after the action):
<compress level="{level}">note on the observation</compress>
then one action tag."""


def level_table(level_scale: float = 1.0) -> str:
    """The five granularity levels with their (scaled) character ranges, one per line."""
    rows = []
    for g in range(1, 6):
        spec = level_spec(g, level_scale)
        rows.append(f"{g} {spec.name}, {spec.char_low}-{spec.char_high} chars: {_LEVEL_RETAINS[g]}")
    return "\n".join(rows)


def head(cfg: EnvConfig) -> str:
    """The part every strategy shares: the task, the turn budget and one line per registered tool."""
    tools = "\n".join(TOOLS[name]().describe(cfg) for name in TOOLS)
    return (f"You are a search agent. Answer the question by searching a document collection, in at most "
            f"{cfg.max_turns} turns.\nTools (end each turn with exactly one):\n{tools}\n")
