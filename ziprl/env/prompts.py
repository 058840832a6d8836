"""System prompts for each context strategy: the multi-granularity, coarse-to-fine prompt and its variants."""

from __future__ import annotations

from ziprl.scoring.levels import level_spec

_LEVEL_RETAINS = {
    1: "only the core conclusion",
    2: "the main facts and key conclusions",
    3: "decision points and the important context",
    4: "the full logical chain and important details",
    5: "nearly all critical information",
}

_TOOLS = """Tools (end each turn with exactly one):
<search>query</search> returns the top {top_k} passages as [doc-id] title + snippet
<open>doc-id</open> shows one passage in full
<answer>short answer</answer> finishes"""

_FORMAT = """Turn format (nothing after the action):
<compress level="N">{compress_what}</compress>
then one action tag."""


def level_table(level_scale: float = 1.0) -> str:
    """The five granularity levels with their (scaled) character ranges, one per line."""
    rows = []
    for g in range(1, 6):
        spec = level_spec(g, level_scale)
        rows.append(f"{g} {spec.name}, {spec.char_low}-{spec.char_high} chars: {_LEVEL_RETAINS[g]}")
    return "\n".join(rows)


def system_prompt(strategy: str, *, top_k: int, max_turns: int, level_scale: float = 1.0, uniform_level: int = 3) -> str:
    """The system prompt for ``strategy`` (adaptive | uniform | react | summary)."""
    head = (f"You are a search agent. Answer the question by searching a document collection, in at most "
            f"{max_turns} turns.\n" + _TOOLS.format(top_k=top_k) + "\n")
    memory = ("You see the question, your notes, and the newest OBSERVATION only once: compress it into a note "
              "in full sentences, keeping names, dates and numbers the question needs.\n")
    if strategy == "adaptive":
        return head + memory + (
            "First judge the observation's relevance to the question, then choose the level: strongly relevant "
            "-> fine (4-5), partly -> medium (3), weakly or not -> coarse (1-2). Stay in the level's range.\n"
            + level_table(level_scale) + "\n" + _FORMAT.format(compress_what="note on the observation")
        )
    if strategy == "uniform":
        s = level_spec(uniform_level, level_scale)
        return head + memory + f"Always use level {uniform_level} ({s.char_low}-{s.char_high} chars).\n" + (
            _FORMAT.format(compress_what="note on the observation").replace('level="N"', f'level="{uniform_level}"'))
    if strategy == "react":
        return head + "You see every earlier turn and observation.\nTurn format: <think>reasoning</think> then one action tag."
    if strategy == "summary":
        return head + ("You see the question, automatic summaries of earlier observations and the newest one.\n"
                       "Turn format: <think>reasoning</think> then one action tag.")
    raise ValueError(f"unknown strategy {strategy!r}; use adaptive, uniform, react or summary")
