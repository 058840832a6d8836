"""Generation engines, one package each, registered in :data:`ziprl.registry.ENGINES` when first looked up.

A new engine is one package here: its ``__init__.py`` registers an :class:`ziprl.policy.engine.EngineSpec` with
``ENGINES.register("name")(EngineSpec(...))`` and imports nothing heavy (the engine class is imported lazily), its
``engine.py`` holds the engine class, and its helpers sit beside it. ``model.engine=name`` then selects it everywhere
(config, rollout actors, eval, weight pushes).
"""
