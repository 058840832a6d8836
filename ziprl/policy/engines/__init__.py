"""Generation engines, one module each, registered in :data:`ziprl.registry.ENGINES` when first looked up.

A new engine is one module here: register an :class:`ziprl.policy.engine.EngineSpec` with
``ENGINES.register("name")(EngineSpec(...))``, importing the engine class lazily; ``model.engine=name`` then
selects it everywhere (config, rollout actors, eval, weight pushes).
"""
