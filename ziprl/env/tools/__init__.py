"""Tools (the action tags), one module each, registered in :data:`ziprl.registry.TOOLS` when first looked up.

A new tool is one module here: subclass :class:`Tool`, decorate it with ``@TOOLS.register("tag")``; the
parser, the system prompt, the engines' stop strings and the eval statistics pick it up. Two optional hooks bring
it into the scripted teacher's Stage 1 demonstrations (:meth:`Tool.demonstrate`) and the tokenized env's candidate
turns (:meth:`Tool.candidates`); a tool without them is offered to the model but never demonstrated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ziprl.config import EnvConfig
from ziprl.env.context import Observation

if TYPE_CHECKING:
    from ziprl.env.scripted import DemoPlan
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

    def demonstrate(self, plan: DemoPlan, env: SearchCompressEnv) -> str | None:
        """The argument the scripted teacher plays with this tool on this turn, or None to leave the turn to the
        next tool (in registry order). It may read and update ``plan``. Default: never demonstrated."""
        return None

    def candidates(self, env: SearchCompressEnv) -> list[str]:
        """The arguments the tokenized env offers with this tool on this turn, best first. Default: none."""
        return []


def seen_labels(env: SearchCompressEnv) -> set[str]:
    """The labels of the observations the agent has in context: its notes' and the pending one's."""
    ctx = env.context
    return {n.label for n in ctx.memory} | ({ctx.pending.label} if ctx.pending else set())


def closing_tags() -> list[str]:
    """``</name>`` of every registered tool: where generation of a turn stops."""
    from ziprl.registry import TOOLS

    return [f"</{name}>" for name in TOOLS]
