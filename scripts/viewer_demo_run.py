"""Write a small run for the viewer's README screenshot: the scripted teacher on the shipped sample.

    python scripts/viewer_demo_run.py runs/viewer_demo && python -m ziprl.view runs/viewer_demo

Three "training step" files (adaptive; the teacher answers wrong on a shrinking share of questions, and
one turn per episode is malformed early on) and eval files for adaptive and react, with real prompt ids
(SmolLM2's chat template), so the viewer decodes each turn's memory and raw observation. OUT is new, empty, or an
earlier output of this script (scripts/_script_out.py), checked before anything loads; the model's tokenizer, the
sample and the retriever load next, then the run is built beside OUT and moved in (a rerun replaces its files).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _script_out import building, checked_out

from ziprl.boundary import run_command
from ziprl.config import ModelConfig, RetrieverConfig
from ziprl.env.chat import chat_ids
from ziprl.env.scripted import ScriptedTeacher
from ziprl.env.search_env import SearchCompressEnv
from ziprl.env.trajectory import Trajectory, Turn, save_trajectories
from ziprl.policy.models import load_tokenizer, resolve_model_path
from ziprl.retrieval.datasets import load_dataset
from ziprl.retrieval.retriever import Retriever


def play(env, tok, example, wrong: bool, malformed: bool, version: int) -> Trajectory:
    teacher = ScriptedTeacher()
    _, info = env.reset(options={"example": example})
    traj = Trajectory(example.id, example.question, list(example.answers), policy_version=version,
                      strategy=env.config.strategy)
    while not env.done:
        text = teacher.respond(env)
        if wrong and "<answer>" in text:
            text = text.split("<answer>")[0] + "<answer>unknown</answer>"
        if malformed and env.turn == 1:
            text = text.replace("</compress>", "")  # an unclosed tag: a format error
        prompt, context_chars = chat_ids(tok, info["messages"]), info["context_chars"]
        response = tok.encode(text, add_special_tokens=False)
        _, reward, terminated, _, info = env.step(text)
        traj.turns.append(Turn(prompt_ids=prompt, response_ids=response, logprobs=[0.0] * len(response),
                               response_text=text, action=info["action"], level=info["level"], q_com=info["q_com"],
                               q_ratio=info["q_ratio"], q_level=info["q_level"], q_info=info["q_info"],
                               q_sem=info["q_sem"], format_error=info["format_error"],
                               observation_chars=info["observation_chars"], context_chars=context_chars, prompt_tokens=len(prompt), response_tokens=len(response)))
        traj.reward, traj.finished, traj.em, traj.f1 = reward, terminated, info.get("em", 0.0), info.get("f1", 0.0)
    return traj


@run_command
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="runs/viewer_demo", help="the run directory to write")
    out_dir = checked_out(ap.parse_args(argv).out, "bench", Path(__file__).name)
    # every input loads before anything is written: a failing load leaves OUT as it was
    tok = load_tokenizer(resolve_model_path(ModelConfig()))
    examples = load_dataset("sample", limit=8)
    retriever = Retriever.from_config(RetrieverConfig())
    with building(out_dir, "bench", Path(__file__).name) as tmp:
        for step in (1, 2, 3):
            env = SearchCompressEnv({"strategy": "adaptive", "max_turns": 8}, retriever=retriever)
            trajs = [play(env, tok, ex, wrong=i % 4 < 3 - step, malformed=i % 3 == step % 3, version=step)
                     for i, ex in enumerate(examples)]
            save_trajectories(trajs, tmp / "trajectories" / f"step_{step:06d}.parquet")
        for strategy in ("adaptive", "react"):
            env = SearchCompressEnv({"strategy": strategy, "max_turns": 8}, retriever=retriever)
            save_trajectories([play(env, tok, ex, False, False, 3) for ex in examples],
                              tmp / f"trajectories_{strategy}.parquet")
    print(f"wrote {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
