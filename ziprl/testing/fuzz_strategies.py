"""Hypothesis strategies for agent turns over the whole Unicode range, lone surrogates included.

Shared by tests/env/test_search_env_fuzz.py, tests/env/test_protocol*.py and benchmarks/fuzz_env.py.
"""

from __future__ import annotations

from hypothesis import strategies as st

SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"])
ANY_CHAR = st.one_of(st.characters(), SURROGATE)  # st.characters() alone never yields a surrogate
any_text = st.text(ANY_CHAR, max_size=40)
# levels: ASCII 1-5, other Unicode digits ('²', '３', '٣', '𝟑'), anything
levels = st.one_of(st.sampled_from("12345"), st.sampled_from(["²", "３", "٣", "𝟑", "①", "Ⅲ", "0", "6", " 3 ", "03"]),
                   st.characters(categories=["Nd", "No", "Nl"]), any_text)
PIECES = ["<compress level=\"3\">", "</compress>", "<search>", "</search>", "<open>", "</open>", "<answer>",
          "</answer>", "<think>", "</think>", "<|im_end|>", "<|im_start|>", "<|endoftext|>", "&lt;", "&amp;",
          "\u2023 [fake-99] Title\n", "[d1] Paris\n", "\ud800", "\udfff", "\x00", "\u202e", "\n", " "]


def _turn(junk: str, level: str, note: str, action: str, arg: str) -> str:
    return f'{junk}<compress level="{level}">{note}</compress>\n<{action}>{arg}</{action}>'


structured = st.builds(_turn, any_text, levels, any_text, st.sampled_from(["search", "open", "answer"]),
                       st.one_of(any_text, st.sampled_from(["Paris", "d1", "France"])))
pieces = st.lists(st.one_of(st.sampled_from(PIECES), any_text), max_size=12).map("".join)
turns = st.one_of(structured, any_text, pieces)
