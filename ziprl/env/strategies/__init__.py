"""Context strategies, one module each, registered in :data:`ziprl.registry.STRATEGIES` when first looked up.

A new strategy is one module here: subclass :class:`ziprl.env.context.Strategy`, decorate it with
``@STRATEGIES.register("name")``; ``env.strategy=name`` then selects it everywhere (config, env, eval).
"""
