"""Tools (the action tags), one module each, registered in :data:`ziprl.registry.TOOLS` when first looked up.

A new tool is one module here: subclass :class:`Tool`, decorate it with ``@TOOLS.register("tag")``; the
parser, the system prompt, the engines' stop strings and the eval statistics pick it up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ziprl.config import EnvConfig
from ziprl.env.context import Observation

if TYPE_CHECKING:
    from ziprl.env.search_env import SearchCompressEnv


@dataclass
class ToolResult:
    """What a tool call gave: a new observation and/or an error for the agent, the reward and answer metrics."""

    observation: Observation | None = None
    error: str | None = None  # shown to the agent as a NOTICE; the episode goes on
    reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)  # e.g. em, f1 (into the step's info)
    retrieved: int = 0  # passages this call retrieved
    noise_doc_ids: list[str] = field(default_factory=list)  # of them, the ones env.retrieval_noise injected


class Tool:
    """An action tag ``<name>argument</name>`` the agent may end a turn with."""

    terminal = False  # the call ends the episode (its reward is the outcome reward)
    stats_key: str | None = None  # trajectory_stats reports the mean calls per question under this key

    def describe(self, cfg: EnvConfig) -> str:
        """The tool's line in the system prompt."""
        raise NotImplementedError

    def run(self, env: SearchCompressEnv, argument: str, written: str) -> ToolResult:
        """Call the tool with the unescaped ``argument`` (``written``: as the agent wrote it); a ValueError
        becomes a tool error the agent sees."""
        raise NotImplementedError


def closing_tags() -> list[str]:
    """``</name>`` of every registered tool: where generation of a turn stops."""
    from ziprl.registry import TOOLS

    return [f"</{name}>" for name in TOOLS]
