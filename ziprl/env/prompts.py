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

_TOOLS = """Tools (end every turn with exactly one):
  <search>a query</search>        search the corpus; returns the top {top_k} passages as [doc-id] title + snippet
  <open>doc-id</open>             read one passage in full (ids come from search results)
  <answer>final answer</answer>   finish with a short answer (a name, date, number or short phrase)"""

_FORMAT = """Every turn has this shape (nothing after the action tag):
<think>brief reasoning (optional)</think>
<compress level="N">{compress_what}</compress>
<search>...</search>  or  <open>...</open>  or  <answer>...</answer>"""


def level_table(level_scale: float = 1.0) -> str:
    """The five granularity levels with their (scaled) character ranges, one per line."""
    rows = []
    for g in range(1, 6):
        s = level_spec(g, level_scale)
        rows.append(f"  level {g} ({s.name}, {s.char_low}-{s.char_high} characters): keeps {_LEVEL_RETAINS[g]}")
    return "\n".join(rows)


def system_prompt(strategy: str, *, top_k: int, max_turns: int, level_scale: float = 1.0, uniform_level: int = 3) -> str:
    """The system prompt for ``strategy`` (adaptive | uniform | react | summary)."""
    head = (
        "You are a search agent. Answer the user's question by searching a document collection.\n"
        f"You have at most {max_turns} turns.\n\n" + _TOOLS.format(top_k=top_k) + "\n\n"
    )
    if strategy == "adaptive":
        return head + (
            "Your context is small. Each turn shows the question, your memory (notes you wrote earlier) and "
            "the newest OBSERVATION, which you see only once: compress it into a note now.\n"
            "Choose the compression level by the observation's relevance to the question:\n"
            "1. First judge how relevant the observation is to the question.\n"
            "2. Strong relevance (it contains facts needed for the answer) -> a fine level (4-5) and a longer note.\n"
            "   Partial relevance -> a medium level (3). Weak or no relevance -> a coarse level (1-2), a short note.\n"
            "3. Write the note within the level's character range, in full sentences, keeping names, dates and "
            "numbers that bear on the question.\n\n"
            "Levels:\n" + level_table(level_scale) + "\n\n"
            + _FORMAT.format(compress_what="note on the observation (or your current state if there is none)")
        )
    if strategy == "uniform":
        s = level_spec(uniform_level, level_scale)
        return head + (
            "Your context is small. Each turn shows the question, your memory (notes you wrote earlier) and "
            "the newest OBSERVATION, which you see only once: compress it into a note now.\n"
            f"Always use level {uniform_level} ({s.char_low}-{s.char_high} characters), in full sentences, keeping "
            "names, dates and numbers that bear on the question.\n\n"
            + _FORMAT.format(compress_what="note on the observation").replace('level="N"', f'level="{uniform_level}"')
        )
    if strategy == "react":
        return head + (
            "You see the full history of your turns and every observation.\n\n"
            "Every turn has this shape (nothing after the action tag):\n"
            "<think>brief reasoning</think>\n<search>...</search>  or  <open>...</open>  or  <answer>...</answer>"
        )
    if strategy == "summary":
        return head + (
            "Each turn shows the question, automatic summaries of earlier observations, and the newest observation.\n\n"
            "Every turn has this shape (nothing after the action tag):\n"
            "<think>brief reasoning</think>\n<search>...</search>  or  <open>...</open>  or  <answer>...</answer>"
        )
    raise ValueError(f"unknown strategy {strategy!r}; use adaptive, uniform, react or summary")
