"""The training loop: the question stream, rollout sources, the staleness-aware scheduler, the weight push and the
one loop that ties them to a learner (:func:`ziprl.loop.training.train_loop`).

Nothing here imports torch or Ray: the learner (``ziprl.learner``) owns the math and the weights, the rollout
sources run episodes (in this process: :mod:`ziprl.loop.in_process`; on Ray: ``ziprl.actors``).
"""
