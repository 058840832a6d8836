"""Extension points: context strategies, tools, outcome rewards, generation engines, advantage estimators, policy
losses (and their normalisations), weight transports and named datasets register themselves by name (as verl
registers its advantage estimators).

Each registry owns a package; the first lookup imports every module of that package (found with pkgutil),
and each module registers its entry with a decorator, e.g. ``@STRATEGIES.register("window")``. Adding one is one
new file in the registry's package (below). Stdlib only, so the config may validate names against it; a
registration module therefore imports nothing heavy at import time.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_HYPHENATED_RE = re.compile(r"^[a-z][a-z0-9_-]*$")  # dataset names: "hotpotqa-dev"


class Registry(Mapping[str, Any]):
    """A read-only name -> entry mapping filled by the modules of ``package``; iterates in (order, name) order."""

    def __init__(self, kind: str, package: str, hyphens: bool = False):
        self.kind, self.package = kind, package
        self._name_re = _HYPHENATED_RE if hyphens else _NAME_RE
        self._entries: dict[str, tuple[int, Any]] = {}
        self._loaded = False

    def register(self, name: str, order: int = 100) -> Callable[[Any], Any]:
        """Decorator: register the decorated object under ``name`` (lower-case identifier, with hyphens where the
        registry allows them; ``order`` sorts)."""
        if not self._name_re.match(name):
            allowed = "a-z, 0-9, _, -" if self._name_re is _HYPHENATED_RE else "a-z, 0-9, _"
            raise ValueError(f"{self.kind} name {name!r} must be a lower-case identifier ({allowed})")

        def add(obj: Any) -> Any:
            if name in self._entries and self._entries[name][1] is not obj:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = (order, obj)
            return obj

        return add

    def _load(self) -> dict[str, tuple[int, Any]]:
        if not self._loaded:
            self._loaded = True  # set first: a plugin module may look the registry up while it is imported
            try:
                pkg = importlib.import_module(self.package)
                for mod in pkgutil.iter_modules(pkg.__path__):
                    if not mod.name.startswith("_"):
                        importlib.import_module(f"{self.package}.{mod.name}")
            except BaseException:
                self._loaded = False  # a plug-in that fails to import fails every lookup, never half a registry
                raise
        return self._entries

    def names(self) -> tuple[str, ...]:
        """The registered names, in (order, name) order."""
        return tuple(sorted(self._load(), key=lambda n: (self._entries[n][0], n)))

    def __getitem__(self, name: str) -> Any:
        entries = self._load()
        if name not in entries:
            raise KeyError(f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())}")
        return entries[name][1]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._load())

    def __repr__(self) -> str:
        return repr(self.names())


STRATEGIES = Registry("context strategy", "ziprl.env.strategies")
TOOLS = Registry("tool", "ziprl.env.tools")
REWARDS = Registry("outcome reward", "ziprl.scoring.rewards")
ENGINES = Registry("generation engine", "ziprl.policy.engines")
TRANSPORTS = Registry("weight transport", "ziprl.weights")  # weights.transport
ADVANTAGES = Registry("advantage estimator", "ziprl.learner.advantages")
LOSSES = Registry("policy loss", "ziprl.learner.losses")
LOSS_NORMS = Registry("loss normalisation", "ziprl.learner.losses")  # shares the losses' package
DATASETS = Registry("named dataset", "ziprl.retrieval.sets", hyphens=True)
