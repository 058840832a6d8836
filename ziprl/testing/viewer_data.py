"""Synthetic trajectory files for the viewer tests (an adversarial document included)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ziprl.env.trajectory import SCHEMA, Trajectory, Turn, save_trajectories

# Every way a retrieved document could try to run script in the viewer; it sets data-pwned on <body> if it runs.
EVIL = ('</script><script>document.body.setAttribute("data-pwned","1")</script>'
        '<img src=x onerror="document.body.setAttribute(\'data-pwned\',\'2\')">'
        '<a id="evil-link" href="javascript:document.body.setAttribute(\'data-pwned\',\'3\')">x</a>'
        '<svg onload="document.body.setAttribute(\'data-pwned\',\'4\')"></svg> \u2028\u2029 &amp; {"a":"</script>"}')


def trajectory(i: int, strategy: str = "adaptive", n_turns: int = 3, evil: bool = False, version: int = 0) -> Trajectory:
    """Episode ``i``: search/open turns then an answer; turn 2 of every 7th episode is malformed."""
    turns = []
    for t in range(n_turns):
        last = t == n_turns - 1
        act = "answer" if last else ("search" if t % 2 == 0 else "open")
        note = EVIL if evil else f"note {t} of episode {i}"
        err = "no action: end the turn with exactly one action" if t == 1 and i % 7 == 0 and not last else None
        text = f'<compress level="{1 + t % 5}">{note}</compress>\n' + ("" if err else f"<{act}>{'Paris' if last else f'query {t}'}</{act}>")
        turns.append(Turn(prompt_ids=[1, 2, 3], response_ids=[4, 5], logprobs=[-0.1, -0.2], response_text=text,
                          action="invalid" if err else act, level=1 + t % 5, q_com=0.25 + 0.5 * (t % 2) if t else None,
                          q_ratio=0.9, q_level=1.0, q_info=0.3, q_sem=0.4, format_error=err, observation_chars=1200 * t,
                          context_chars=3000, prompt_tokens=700 + t, response_tokens=2))
    return Trajectory(question_id=f"q{i}", question=EVIL if evil else f"What is the capital of country {i}?",
                      answers=["Paris"], group_id=f"g{i}", policy_version=version, reward=float(i % 3 == 0),
                      em=float(i % 3 == 0), f1=0.5, finished=True, strategy=strategy, turns=turns)


def write_run(out: Path, n: int = 12, steps: int = 3) -> Path:
    """A run directory: ``steps`` training step files and eval files for adaptive and react (episode 0 is evil)."""
    for s in range(1, steps + 1):
        save_trajectories([trajectory(i, version=s, evil=i == 0) for i in range(n)],
                          out / "trajectories" / f"step_{s:06d}.parquet")
    save_trajectories([trajectory(i, evil=i == 0) for i in range(n)], out / "trajectories_adaptive.parquet")
    save_trajectories([trajectory(i, "react", n_turns=5, evil=i == 0) for i in range(n)], out / "trajectories_react.parquet")
    return out


def write_many(path: Path, n: int) -> Path:
    """One file of ``n`` episodes (copies of a few templates with distinct question ids), written fast."""
    templates = [dataclasses.asdict(trajectory(i, n_turns=2 + i % 3)) for i in range(21)]
    rows = [dict(templates[i % 21], question_id=f"q{i}", reward=float(i % 5) / 4) for i in range(n)]
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
    return path
