"""Rollout admission: AReaL's staleness-aware capacity rule, and the staleness of a group at training time.

Units are GRPO groups (one question x G trajectories). A learner step trains ``batch`` groups and moves the
policy from version v to v + 1. A group generated with weights of version u and trained at version v has lag
``v - u``; it may train only while the lag is at most ``max_staleness`` (0 = synchronous on-policy).
"""

from __future__ import annotations


def capacity(max_staleness: int, version: int, batch: int, accepted: int, running: int,
             steps: int | None = None) -> int:
    """How many more groups may start now: ``(max_staleness + version + 1) * batch - (accepted + running)``.

    AReaL's staleness manager: ``accepted`` counts the groups that finished and were kept (trained or waiting to
    be), ``running`` the groups being generated. Bounding every group started at version <= u by
    ``(max_staleness + u + 1) * batch`` means that, trained oldest version first, none is ever too stale.
    A run of ``steps`` learner steps also never starts more than the ``steps * batch`` groups it will train.
    """
    versions = max_staleness + version + 1
    return (versions if steps is None else min(versions, steps)) * batch - (accepted + running)


def lag(group_version: int, learner_version: int) -> int:
    """Versions between the weights a group was generated with and the policy it trains (must be >= 0)."""
    if group_version > learner_version:
        raise ValueError(f"a group of policy version {group_version} is newer than the learner ({learner_version})")
    return learner_version - group_version


def is_fresh(group_version: int, learner_version: int, max_staleness: int) -> bool:
    """Whether a group of ``group_version`` may train the policy at ``learner_version``."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    return lag(group_version, learner_version) <= max_staleness
