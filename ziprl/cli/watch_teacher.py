"""Watch the scripted teacher: play its episodes through SearchCompressEnv on the shipped sample, print each turn.

    python -m ziprl.watch_teacher [--episodes 2] [--strategy adaptive] [--level-scale 0.5]
"""

from __future__ import annotations

import argparse

from ziprl.boundary import run_command
from ziprl.cli.common import at_least
from ziprl.config import ConfigError, EnvConfig, ScoringConfig
from ziprl.env import SearchCompressEnv
from ziprl.env.scripted import ScriptedTeacher
from ziprl.registry import STRATEGIES


@run_command
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=2)
    ap.add_argument("--strategy", default="adaptive", choices=list(STRATEGIES))
    ap.add_argument("--level-scale", type=float, default=0.5)
    ap.add_argument("--seed", type=at_least(0), default=0)
    args = ap.parse_args(argv)
    if args.episodes < 1:
        raise ConfigError(f"--episodes must be >= 1, got {args.episodes}")
    env = SearchCompressEnv(EnvConfig(strategy=args.strategy, scoring=ScoringConfig(level_scale=args.level_scale)))
    teacher = ScriptedTeacher()
    for ep in range(args.episodes):
        _, info = env.reset(seed=args.seed + ep)
        print(f"\n=== episode {ep + 1}: {env.example.question}  (gold: {env.example.answers[0]})")
        done = False
        while not done:
            response = teacher.respond(env)
            _, reward, term, trunc, info = env.step(response)
            q = f"Q_com={info['q_com']:.3f}" if info["q_com"] is not None else "Q_com=-"
            print(f"turn {info['turn']:>2} {info['action']:<7} level={info['level']} {q} "
                  f"obs={info['observation_chars']}ch context={info['context_chars']}ch  {info['argument'][:60]!r}")
            done = term or trunc
        print(f"reward={reward:.2f} EM={info.get('em', 0.0):.0f} F1={info.get('f1', 0.0):.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
