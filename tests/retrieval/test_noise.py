"""Noisy retrieval (env.retrieval_noise): off leaves episodes unchanged, 1 replaces every hit, seeds replay,
the trajectory records it, old trajectory files still load, and the eval sweep runs end to end."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ziprl.config import ConfigError, EnvConfig, load_config
from ziprl.env import SearchCompressEnv
from ziprl.env.protocol import HIT_MARK
from ziprl.env.scripted import ScriptedTeacher
from ziprl.env.trajectory import SCHEMA, Trajectory, Turn, load_trajectories, save_trajectories
from ziprl.evaluation.noise import injected_fraction, parse_noise_levels
from ziprl.retrieval.noise import inject_noise
from ziprl.retrieval.types import Hit, Passage, QAExample
from ziprl.testing.word_retriever import PASSAGES, SizedWordRetriever

FILLER = [Passage(f"f{i}", f"Filler {i}", f"Filler passage number {i} about topic {i % 7}.") for i in range(60)]
EXAMPLES = [QAExample("q1", "Were Scott Derrickson and Ed Wood of the same nationality?", ["yes"],
                      ["Scott Derrickson", "Ed Wood"]),
            QAExample("q2", "What is the capital of France?", ["Paris"], ["Paris"])]
IDS = re.compile(rf"^{HIT_MARK} \[([^\]\n]+)\] ", re.MULTILINE)


@pytest.fixture
def retriever() -> SizedWordRetriever:
    return SizedWordRetriever(PASSAGES + FILLER)


def play(retriever, seed: int, **env) -> tuple[list[str], list[dict]]:
    """One scripted-teacher episode: every observation and every step's info (messages dropped)."""
    e = SearchCompressEnv(EnvConfig(top_k=3, max_turns=6, **env), retriever=retriever, examples=EXAMPLES)
    teacher = ScriptedTeacher()
    obs, info = e.reset(seed=seed, options={"example": EXAMPLES[0]})
    observations, infos, done = [obs], [], False
    while not done:
        obs, _, term, trunc, info = e.step(teacher.respond(e))
        observations.append(obs)
        infos.append({k: v for k, v in info.items() if k != "messages"})
        done = term or trunc
    return observations, infos


def test_noise_zero_leaves_episodes_unchanged(retriever):
    clean = play(retriever, 3)
    assert play(retriever, 3, retrieval_noise=0.0) == clean
    obs, infos = clean
    assert [i["noisy_hits"] for i in infos] == [0] * len(infos)
    assert infos[-1]["em"] == 1.0
    searches = [i for i in infos if i["action"] == "search"]
    assert searches
    assert all(i["retrieved"] == 3 and i["noise_doc_ids"] == [] for i in searches)
    assert [i["retrieved"] for i in infos if i["action"] == "open"] == [1, 1]


def test_noise_one_replaces_every_hit_with_another_passage(retriever):
    e = SearchCompressEnv(EnvConfig(top_k=3, retrieval_noise=1.0), retriever=retriever, examples=EXAMPLES)
    e.reset(seed=0, options={"example": EXAMPLES[1]})
    clean = [h.doc_id for h in retriever.search(["Paris"], 3)[0]]
    for _ in range(4):
        _, _, _, _, info = e.step('<compress level="1">note</compress><search>Paris</search>')
        shown = IDS.findall(e.context.pending.text)
        assert info["retrieved"] == info["noisy_hits"] == 3
        assert info["noise_doc_ids"] == shown
        assert all(s != c for s, c in zip(shown, clean, strict=True))
        for doc_id in shown:  # rendered as search renders that passage: the agent cannot tell
            p = retriever.open(doc_id)
            assert f"{HIT_MARK} [{p.doc_id}] {p.title}\n{p.text[:200]}" in e.context.pending.text
    # open is not noised: an injected id opens its own passage
    _, _, _, _, info = e.step(f'<compress level="1">note</compress><open>{shown[0]}</open>')
    assert info["noisy_hits"] == 0
    assert retriever.open(shown[0]).text in e.context.pending.text


def test_same_seed_replays_and_different_seeds_differ(retriever):
    a = play(retriever, 11, retrieval_noise=0.5)
    assert play(retriever, 11, retrieval_noise=0.5) == a
    injected = [i["noise_doc_ids"] for i in a[1]]
    assert any(injected)
    assert [i["noise_doc_ids"] for i in play(retriever, 12, retrieval_noise=0.5)[1]] != injected


def test_noise_does_not_change_which_questions_a_seed_picks(retriever):
    """The noise stream is spawned from the reset seed, never drawn from the env's own generator."""
    def picks(p: float) -> list[str]:
        e = SearchCompressEnv(EnvConfig(top_k=3, retrieval_noise=p), retriever=retriever, examples=EXAMPLES)
        out = [e.reset(seed=5)[1]["question_id"]]
        for _ in range(8):
            e.step('<compress level="1">n</compress><search>Paris</search>')
            out.append(e.reset()[1]["question_id"])
        return out

    assert picks(0.0) == picks(0.8)
    assert len(set(picks(0.0))) == 2


def test_measured_rate_matches_p():
    retriever = SizedWordRetriever(PASSAGES + FILLER)
    hits = retriever.search(["Filler topic"], 5)[0]
    rng = np.random.default_rng(0)
    counts = [len(inject_noise(hits, 0.3, retriever, rng)[1]) for _ in range(400)]
    assert sum(counts) / (400 * 5) == pytest.approx(0.3, abs=0.03)
    assert inject_noise(hits, 0.3, SizedWordRetriever(PASSAGES[:1]), rng) == (hits, [])  # nothing else to draw


def test_noise_needs_a_retriever_with_random_access():
    class SearchOnly:
        def search(self, queries, k):
            return [[] for _ in queries]

        def open(self, doc_id):
            raise KeyError(doc_id)

    SearchCompressEnv(EnvConfig(), retriever=SearchOnly(), examples=EXAMPLES).reset(seed=0)  # noise off: fine
    env = SearchCompressEnv(EnvConfig(retrieval_noise=0.1), retriever=SearchOnly(), examples=EXAMPLES)
    with pytest.raises(ValueError, match="SearchOnly lacks __len__, hit_at: add them or set env.retrieval_noise=0"):
        env.reset(seed=0)


def test_config_validates_noise():
    assert load_config(None, ["env.retrieval_noise=0.25"]).env.retrieval_noise == 0.25
    for bad in ("1.5", "-0.1"):
        with pytest.raises(ConfigError, match=r"env.retrieval_noise must be in \[0, 1\]"):
            load_config(None, [f"env.retrieval_noise={bad}"])
    assert parse_noise_levels("0.5, 0,1") == [0.0, 0.5, 1.0]
    for bad in ("x", "0,2", ""):
        with pytest.raises(ConfigError, match="--noise"):
            parse_noise_levels(bad)


def test_trajectory_noise_fields_round_trip_and_old_files_load(tmp_path):
    t = Trajectory("q", "Q?", ["a"], turns=[Turn(action="search", retrieved=3, noisy_hits=2, noise_doc_ids=["x", "y"]),
                                            Turn(action="open", retrieved=1)])
    back = load_trajectories(save_trajectories([t], tmp_path / "new.parquet"))
    assert back == [t]
    assert injected_fraction(back) == pytest.approx(2 / 3)
    noise = ("retrieved", "noisy_hits", "noise_doc_ids")  # turn columns added after the first file format
    old = dataclasses.asdict(t)
    old["turns"] = [{k: v for k, v in turn.items() if k not in noise} for turn in old["turns"]]
    old_turn = pa.struct([f for f in SCHEMA.field("turns").type.value_type if f.name not in noise])
    old_schema = SCHEMA.set(SCHEMA.get_field_index("turns"), pa.field("turns", pa.list_(old_turn)))
    pq.write_table(pa.Table.from_pylist([old], schema=old_schema), tmp_path / "old.parquet")
    (loaded,) = load_trajectories(tmp_path / "old.parquet")
    assert [(u.action, u.retrieved, u.noisy_hits, u.noise_doc_ids) for u in loaded.turns] == [
        ("search", 0, 0, []), ("open", 0, 0, [])]


@pytest.mark.slow
def test_real_retriever_hit_at_renders_like_search():
    from ziprl.config import RetrieverConfig
    from ziprl.retrieval.retriever import Retriever

    r = Retriever.from_config(RetrieverConfig())
    hit = r.search(["Paris"], 1)[0][0]
    row = next(i for i in range(len(r)) if r.hit_at(i).doc_id == hit.doc_id)
    assert r.hit_at(row) == dataclasses.replace(hit, score=0.0)
    assert isinstance(r.hit_at(0), Hit)


@pytest.mark.slow
def test_rollout_records_noise_and_eval_sweep_writes_curve(tiny_model_dir, tmp_path):
    from ziprl.cli.eval import main
    from ziprl.config import RetrieverConfig, SamplingConfig
    from ziprl.policy import HFEngine
    from ziprl.policy.rollout import rollout
    from ziprl.retrieval.retriever import Retriever

    class SearchingEngine(HFEngine):
        """The tiny model's real generations, with the text replaced by one search (so every turn retrieves)."""

        def generate(self, prompts, sampling, seed=None):
            return [dataclasses.replace(g, text='<compress level="2">n</compress><search>Paris France</search>')
                    for g in super().generate(prompts, sampling, seed)]

    engine, retr = SearchingEngine(tiny_model_dir, device="cpu"), Retriever.from_config(RetrieverConfig())
    cfg = EnvConfig(max_turns=2, top_k=4, retrieval_noise=1.0)
    (traj,) = rollout(engine, lambda: SearchCompressEnv(cfg, retriever=retr, examples=EXAMPLES), EXAMPLES[1:],
                      SamplingConfig(max_new_tokens=2), seed=1)
    assert [(t.retrieved, t.noisy_hits, len(t.noise_doc_ids)) for t in traj.turns] == [(4, 4, 4), (4, 4, 4)]

    out = tmp_path / "sweep"
    rc = main(["--noise", "0,1", "--strategy", "adaptive,react", "--model", str(tiny_model_dir), "--limit", "1",
               "--max-turns", "2", "--samples", "1", "--out", str(out), "--set", "sampling.max_new_tokens=4",
               "--set", "model.device=cpu"])
    assert rc == 0
    report = json.loads((out / "noise.json").read_text())
    assert report["noise_levels"] == [0.0, 1.0]
    assert set(report["results"]) == {"adaptive", "react"}
    for strategy, by_p in report["results"].items():
        assert set(by_p) == {"0", "1"}
        for p, s in by_p.items():
            assert s["trajectories"] == 1
            assert s["turns"] == 2
            assert {"em", "f1", "q_com", "mean_level"} <= s.keys()
            assert len(load_trajectories(out / f"noise_{p}" / f"trajectories_{strategy}.parquet")) == 1
    assert (out / "noise.md").read_text().count("\n| ") == 5  # header + 2 strategies x 2 levels
    assert (out / "noise.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["--noise", "0,2"]) == 2
