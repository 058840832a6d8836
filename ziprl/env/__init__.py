"""SearchCompressEnv and its parts. Imports neither torch nor ray.

The data it works on (passages, hits, QA examples, the ``RetrieverLike`` protocol) and the retriever itself
are in :mod:`ziprl.retrieval`.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from ziprl.env.search_env import SearchCompressEnv

ENV_ID = "ziprl/SearchCompress-v0"


def register(env_id: str = ENV_ID):
    """Register with gymnasium (idempotent) and return an ``env_creator(config_dict)``.

    The creator takes RLlib's ``EnvContext``/dict with optional keys ``env``, ``retriever`` (config
    sections) and returns a SearchCompressEnv: ``ray.tune.register_env("ziprl", ziprl.env.register())``.
    """
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point="ziprl.env.search_env:SearchCompressEnv")

    def env_creator(config: dict[str, Any] | None = None) -> SearchCompressEnv:
        config = dict(config or {})
        return SearchCompressEnv(config=config.get("env"), retriever_config=config.get("retriever"))

    return env_creator


register()

__all__ = ["ENV_ID", "SearchCompressEnv", "register"]
