"""The turn protocol: parse an assistant turn, and escape untrusted text before it enters a prompt.

A well-formed turn is (text outside the tags is ignored)::

    <think>optional</think>
    <compress level="3">summary of the pending observation</compress>
    <search>query</search>  |  <open>doc-id</open>  |  <answer>final answer</answer>

The action tags are the registered tools (:data:`ziprl.registry.TOOLS`). Parsing never raises: every problem becomes ``ParsedTurn.error``, a message meant for the agent.

Text from outside the model (passages, titles, tool results, teacher notes, the question) passes through
:func:`escape` before it enters a prompt or a training target; :func:`scrub` is its first half, for raw text an
observation stores. The model's own turns, shown back to it (``react``), pass through :func:`defuse`. Neither
output holds a chat-template control token (``<|im_end|>``, ``<s>``, ``<<SYS>>``, ``<start_of_turn>``,
``[INST]``, ...), so text tokenized with any tokenizer's special tokens parsed cannot forge a turn.
Search-hit lines start with :data:`HIT_MARK`, which scrub removes from any other text and
:func:`escape_observation` keeps in a tool's observation, so a passage cannot forge a hit line in a prompt
(:func:`parse_hits` reads only marked lines). An observation shows a title or id on one line, cut to
:data:`MAX_SHOWN_CHARS` characters (with an ellipsis), as passage text is cut to ``snippet_chars`` and
``open_max_chars``; a corpus refuses ids that long (:func:`ziprl.retrieval.corpus.id_problem`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ziprl.registry import TOOLS

_LEVEL_RE = re.compile(r"""^\s*level\s*=\s*(?:"([^"]*)"|'([^']*)'|(\S+))\s*$""", re.IGNORECASE)
_ASCII_LEVEL_RE = re.compile(r"^[ \t]*([1-5])[ \t]*$")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
MAX_SHOWN_CHARS = 200  # of a title or id in an observation (the open tool's label cuts ids there too)
HIT_MARK = "\u2023"  # '‣' opens every search-hit line; scrub() replaces it in all other text
HIT_LINE_RE = re.compile(rf"^{HIT_MARK} \[([^\]\n]+)\] (.*)$", re.MULTILINE)
# the '[' of a bracketed all-caps word: [INST], [/INST], [SYSTEM_PROMPT], [TOOL_CALLS], [SEP], [gMASK]
_BRACKET_TOKEN_RE = re.compile(r"\[(?=/?[a-z]?[A-Z][A-Z0-9_]*\])")
_ENTITIES = {"&amp;": "&", "&lt;": "<", "&gt;": ">", "&#91;": "["}
_ENTITY_RE = re.compile("|".join(_ENTITIES))


@dataclass(frozen=True)
class ParsedTurn:
    """The parts of one assistant turn; ``error`` is None exactly when the turn is well-formed."""

    action: str | None = None  # search | open | answer
    argument: str = ""
    compression: str | None = None  # text of the <compress> block, None if absent
    level: int | None = None
    error: str | None = None


@lru_cache(maxsize=8)
def _tag_re(actions: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile(rf"<(/?)({'|'.join(('think', 'compress', *actions))})\b([^<>]*)>", re.IGNORECASE)


@lru_cache(maxsize=8)
def _stray_lt_re(actions: tuple[str, ...]) -> re.Pattern[str]:
    """A '<' that does not open a protocol tag."""
    return re.compile(rf"<(?!/?(?:{'|'.join(('think', 'compress', *actions))})\b)", re.IGNORECASE)


def scrub(text: str) -> str:
    """Raw outside text made safe to store: lone surrogates become U+FFFD, the hit marker becomes '>'."""
    return _SURROGATE_RE.sub("\ufffd", text).replace(HIT_MARK, ">")


def escape(text: str) -> str:
    """Neutralise untrusted text so it can never open or close a protocol tag, hold a chat-template control token
    (no ``<`` or ``>`` is left, and the ``[`` of ``[INST]``-like words becomes ``&#91;``), forge a hit line, or
    carry a lone surrogate into a tokenizer. :func:`unescape` inverts it on scrubbed text."""
    text = scrub(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _BRACKET_TOKEN_RE.sub("&#91;", text)


def defuse(text: str, actions: tuple[str, ...] | None = None) -> str:
    """The model's own turn as shown back to it: its protocol tags kept, every other ``<`` and the ``[`` of
    ``[INST]``-like words escaped, so it holds no chat-template control token (and no hit marker)."""
    text = _stray_lt_re(TOOLS.names() if actions is None else actions).sub("&lt;", scrub(text))
    return _BRACKET_TOKEN_RE.sub("&#91;", text)


def escape_observation(text: str) -> str:
    """A tool's observation (built by :func:`format_hits` / :func:`format_passage`, which scrub every part from
    outside, so each hit marker in it is the env's) escaped for a prompt: as :func:`escape`, markers kept."""
    return HIT_MARK.join(escape(part) for part in text.split(HIT_MARK))


def _one_line(text: str) -> str:
    """``text`` scrubbed on one line, cut to :data:`MAX_SHOWN_CHARS` characters (the last an ellipsis)."""
    line = " ".join(scrub(text).split())
    return line if len(line) <= MAX_SHOWN_CHARS else line[: MAX_SHOWN_CHARS - 1] + "\u2026"


def format_hits(hits: list[Any]) -> str:
    """A search observation: per hit a marked ``‣ [doc-id] Title`` line (each cut by :func:`_one_line`), then its
    snippet (scrubbed)."""
    return "\n".join(f"{HIT_MARK} [{_one_line(h.doc_id)}] {_one_line(h.title)}\n{scrub(h.snippet)}" for h in hits) \
        or "(no results)"


def format_passage(passage: Any, max_chars: int) -> str:
    """An open-page observation: ``[doc-id] Title`` and the passage's first ``max_chars`` characters (scrubbed)."""
    return f"[{_one_line(passage.doc_id)}] {_one_line(passage.title)}\n{scrub(passage.text[:max_chars])}"


def parse_hits(text: str) -> list[tuple[str, str]]:
    """(doc id, title) of every marked hit line of a search observation, in order."""
    return HIT_LINE_RE.findall(text)


def unescape(text: str) -> str:
    """Inverse of :func:`escape` (used when a model copies escaped observation text into its output)."""
    return _ENTITY_RE.sub(lambda m: _ENTITIES[m.group(0)], text)


def _parse_level(attrs: str) -> tuple[int | None, str | None]:
    m = _LEVEL_RE.match(attrs)
    if not attrs.strip() or m is None:
        return None, 'the <compress> tag needs a level attribute, e.g. <compress level="3">'
    raw = next(g for g in m.groups() if g is not None)
    level = _ASCII_LEVEL_RE.match(raw)  # ASCII digits only: '²', '３', '٣' are not levels
    if level is None:
        return None, f"compression level must be an ASCII digit from 1 to 5, got {raw[:20]!r}"
    return int(level.group(1)), None


def parse_turn(text: str, max_chars: int = 20000, actions: tuple[str, ...] | None = None) -> ParsedTurn:
    """Parse one assistant response into its compression and its single action; never raises.

    ``actions``: the tool names an action may use (default: every registered tool)."""
    if not isinstance(text, str):
        return ParsedTurn(error=f"the response must be text, got {type(text).__name__}")
    if len(text) > max_chars:
        return ParsedTurn(error=f"the response is {len(text)} characters; the limit is {max_chars}")
    actions_known = TOOLS.names() if actions is None else actions
    blocks: list[tuple[str, str, str]] = []  # (tag, attrs, content)
    open_tag: tuple[str, str, int] | None = None
    for m in _tag_re(actions_known).finditer(text):
        closing, name, attrs = m.group(1) == "/", m.group(2).lower(), m.group(3)
        if open_tag is None:
            if closing:
                return ParsedTurn(error=f"</{name}> closes a tag that was never opened")
            open_tag = (name, attrs, m.end())
        elif closing and name == open_tag[0]:
            blocks.append((name, open_tag[1], text[open_tag[2] : m.start()]))
            open_tag = None
        elif name != "think" and open_tag[0] != "think":
            return ParsedTurn(error=f"<{name}> appears inside <{open_tag[0]}>; tags cannot be nested")
    if open_tag is not None:
        return ParsedTurn(error=f"<{open_tag[0]}> is never closed; close it with </{open_tag[0]}>")

    compress = [b for b in blocks if b[0] == "compress"]
    actions = [b for b in blocks if b[0] in actions_known]
    compression, level, error = None, None, None
    if len(compress) > 1:
        error = f"write exactly one <compress> block per turn, found {len(compress)}"
    elif compress:
        compression = compress[0][2].strip()
        level, error = _parse_level(compress[0][1])
    if error is None and not actions:
        error = "no action: end the turn with exactly one of " + ", ".join(f"<{a}>…</{a}>" for a in actions_known)
    elif error is None and len(actions) > 1:
        names = ", ".join(f"<{a[0]}>" for a in actions)
        error = f"exactly one action per turn, found {len(actions)} ({names})"
    if error is not None:
        return ParsedTurn(compression=compression, level=level, error=error)
    action, _, argument = actions[0]
    argument = " ".join(argument.split())
    if not argument:
        return ParsedTurn(compression=compression, level=level, error=f"the <{action}> tag is empty")
    return ParsedTurn(action=action, argument=argument, compression=compression, level=level)
