"""The viewer's decoder: real token ids (SmolLM2's chat template) back into each turn's memory and
observation."""

from __future__ import annotations

import pytest

from ziprl.env.search_env import SearchCompressEnv
from ziprl.env.trajectory import Trajectory, Turn, save_trajectories
from ziprl.testing.viewer_data import trajectory
from ziprl.view.data import episode, load_run
from ziprl.view.tokens import make_decoder


@pytest.mark.slow
def test_tokenizer_decodes_prompts_into_memory_and_observation(tmp_path, default_model_dir, word_retriever):
    """Real token ids (SmolLM2's chat template) decoded back into what each turn's prompt showed."""
    from ziprl.env.chat import chat_ids
    from ziprl.policy.models import load_tokenizer

    tok = load_tokenizer(default_model_dir)
    env = SearchCompressEnv({"strategy": "adaptive", "max_turns": 4}, retriever=word_retriever, examples=[])
    _, info = env.reset(options={"example": {"question": "Where does Scott Derrickson live?", "answers": ["Los Angeles"]}})
    responses = ['<compress level="1">plan</compress><search>Scott Derrickson</search>',
                 '<compress level="2">Derrickson lives in Los Angeles</compress><answer>Los Angeles</answer>']
    traj = Trajectory("q", "Where does Scott Derrickson live?", ["Los Angeles"])
    for text in responses:
        prompt = chat_ids(tok, info["messages"])
        _, _, _, _, info = env.step(text)
        traj.turns.append(Turn(prompt_ids=prompt, response_text=text, action=info["action"]))
    save_trajectories([traj], tmp_path / "t.parquet")
    run = load_run(tmp_path / "t.parquet")
    assert make_decoder("none", run) is None
    run.decode = make_decoder(str(default_model_dir), run)
    t1, t2 = episode(run, 0)["turns"]
    assert t1["observation"] is None
    assert "(empty)" in t1["memory"]
    assert t2["observation"].startswith("> [d1] Scott Derrickson\n")  # the hit marker, as the prompt renders it
    assert t2["observation_label"] == 'search "Scott Derrickson"'
    assert "plan" in t2["memory"]
    save_trajectories([trajectory(0)], tmp_path / "garbage.parquet")  # prompt ids [1, 2, 3]: not this tokenizer's prompts
    assert make_decoder(str(default_model_dir), load_run(tmp_path / "garbage.parquet")) is None
