"""The trajectory viewer's data layer: the episode index in step order, episodes, step statistics, the prompt's parts,
files with missing or extra fields and bad inputs (the page, server, decoder and charts: their own test files)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ziprl.env.search_env import SearchCompressEnv
from ziprl.env.trajectory import save_trajectories
from ziprl.testing.viewer_data import EVIL, trajectory, write_many, write_run
from ziprl.view.command import main
from ziprl.view.data import INDEX_COLUMNS, build_index, episode, load_run, prompt_parts, step_stats
from ziprl.view.page import render_page


@pytest.fixture
def run_dir(tmp_path):
    return write_run(tmp_path / "run", n=12, steps=3)


def _row(index, episode_id):
    return dict(zip(index["columns"], index["rows"][episode_id], strict=True))


def test_index_covers_every_file_in_step_order(run_dir, tmp_path):
    save_trajectories([trajectory(0)], run_dir / "trajectories" / "step_000010.parquet")
    index = build_index(load_run(run_dir))
    assert index["columns"] == list(INDEX_COLUMNS)
    assert index["sources"] == ["step 1", "step 2", "step 3", "step 10", "eval adaptive", "eval react"]
    assert len(index["rows"]) == 5 * 12 + 1
    first = _row(index, 0)
    assert (first["question"], first["gold"], first["answer"], first["turns"], first["errors"]) == (EVIL, "Paris", "Paris", 3, 1)
    assert (first["step"], first["version"], first["source"], first["strategy"]) == (1, 1, "step 1", "adaptive")
    assert (first["reward"], first["em"], first["f1"], first["finished"], first["tokens"]) == (1.0, 1.0, 0.5, True, 6)
    assert _row(index, 1)["errors"] == 0
    assert _row(index, 1)["reward"] == 0.0
    react = _row(index, 5 * 12 - 1)
    assert (react["source"], react["step"], react["turns"]) == ("eval react", None, 5)
    assert [_row(index, i)["id"] for i in range(len(index["rows"]))] == list(range(len(index["rows"])))


def test_episode_turns_memory_and_errors(run_dir):
    ep = episode(load_run(run_dir), 7)  # i = 7: turn 2 is malformed
    assert (ep["qid"], ep["answer"], ep["gold"], ep["source"]) == ("q7", "Paris", ["Paris"], "step 1")
    t1, t2, t3 = ep["turns"]
    assert (t1["action"], t1["argument"], t1["note"], t1["note_level"], t1["q_com"]) == ("search", "query 0", "note 0 of episode 7", 1, None)
    assert t2["format_error"].startswith("no action")
    assert t2["argument"] is None
    assert t2["q_com"] == 0.75
    assert [n["turn"] for n in t2["memory_before"]] == [1]
    assert [n["turn"] for n in t3["memory_before"]] == [1]  # the malformed turn's note never entered memory
    assert t3["action"] == "answer"
    assert t3["prompt_tokens"] == 702
    with pytest.raises(KeyError, match="no episode 60"):
        episode(load_run(run_dir), 60)


def test_step_stats(run_dir):
    stats = step_stats(load_run(run_dir))
    assert [s["label"] for s in stats] == ["step 1", "step 2", "step 3", "eval adaptive", "eval react"]
    assert stats[0]["reward"] == pytest.approx(4 / 12)  # i % 3 == 0 for 4 of 12
    assert stats[0]["q_com"] == pytest.approx((0.75 + 0.25) / 2)  # turns 2 and 3 of each episode are scored
    assert stats[0]["levels"] == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0, 0])
    assert stats[4]["levels"] == pytest.approx([0.2] * 5)


def test_reads_files_with_missing_and_extra_fields(tmp_path):
    """Older/newer files: no em/f1/strategy columns, turns without q_sem/format_error, an extra per-turn field."""
    turn = pa.struct([("response_text", pa.string()), ("action", pa.string()), ("level", pa.int8()),
                      ("q_com", pa.float64()), ("noise_hits", pa.int64())])
    schema = pa.schema([("question_id", pa.string()), ("question", pa.string()), ("answers", pa.list_(pa.string())),
                        ("reward", pa.float64()), ("turns", pa.list_(turn)), ("new_top_level", pa.string())])
    rows = [{"question_id": "a", "question": "Q?", "answers": ["x"], "reward": 1.0, "new_top_level": "z",
             "turns": [{"response_text": '<compress level="2">n</compress><answer>x</answer>', "action": "answer",
                        "level": 2, "q_com": 0.5, "noise_hits": 3}]},
            {"question_id": "b", "question": "Q2?", "answers": [], "reward": float("nan"), "turns": []}]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp_path / "old.parquet")
    run = load_run(tmp_path / "old.parquet")
    row = _row(build_index(run), 0)
    assert (row["answer"], row["em"], row["strategy"], row["errors"], row["source"]) == ("x", 0.0, "", 0, "old")
    assert 'id="ziprl-episodes"' in render_page(run, static=True)
    t = episode(run, 0)["turns"][0]
    assert t["extra"] == {"noise_hits": 3}
    assert t["q_sem"] is None
    assert t["format_error"] is None
    assert step_stats(run)[0]["q_com"] == 0.5


def test_bad_inputs_fail_clearly(tmp_path, capsys):
    pq.write_table(pa.table({"x": [1]}), tmp_path / "other.parquet")
    with pytest.raises(ValueError, match="not a ZipRL trajectory file"):
        load_run(tmp_path / "other.parquet")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no trajectory Parquet files"):
        load_run(tmp_path / "empty")
    assert main([str(tmp_path / "missing"), "--out", str(tmp_path / "r.html")]) == 2
    assert "neither a trajectory Parquet file nor a run directory" in capsys.readouterr().err
    assert main([str(tmp_path / "other.parquet"), "--port", "70000"]) == 2


def test_prompt_parts_recover_what_the_env_showed(word_retriever):
    """The memory, raw observation and notice parsed back out of a real env prompt (escaped text unescaped)."""
    env = SearchCompressEnv({"strategy": "adaptive", "max_turns": 4}, retriever=word_retriever,
                            examples=[], )
    env.reset(options={"example": {"question": "Who directed <Sinister> & more?", "answers": ["Scott Derrickson"]}})
    env.step('<compress level="1">plan</compress><search>Scott Derrickson</search>')
    _, _, _, _, info = env.step('<compress level="2">Derrickson <b>directs</b> horror</compress><open>d1</open>')
    parts = prompt_parts("\n".join(m["content"] for m in info["messages"]))
    assert parts["observation"] == f"[d1] Scott Derrickson\n{word_retriever.passages['d1'].text}"
    assert parts["observation_label"] == "open d1"
    assert "Derrickson <b>directs</b> horror" in parts["memory"]
    assert "plan" in parts["memory"]
    _, _, _, _, info = env.step("no tags at all")
    assert prompt_parts(info["messages"][-1]["content"])["notice"].startswith("your last turn was not applied")


def test_prompt_parts_take_the_last_complete_observation_among_many_unclosed_headers():
    """A decoded prompt of 20,000 unclosed observation headers (an adversarial trajectory file) is parsed in one pass:
    the last complete block is found, the unclosed ones after it are ignored."""
    block = "OBSERVATION (turn 2, open d1):\n<observation>\nthe text\n</observation>"
    prompt = block + "\n" + "OBSERVATION (turn 3, x):\n<observation>\nno end " * 20_000
    parts = prompt_parts(prompt)
    assert parts["observation"] == "the text"
    assert parts["observation_label"] == "open d1"
    assert prompt_parts("OBSERVATION (turn 1, x):\n<observation>\nunclosed")["observation"] is None


def test_index_of_10000_episodes(tmp_path):
    path = write_many(tmp_path / "big.parquet", 10_000)
    run = load_run(path)
    index = build_index(run)
    assert len(index["rows"]) == 10_000
    assert _row(index, 9_999)["qid"] == "q9999"
    assert len(render_page(run, static=False)) < 4_000_000  # the served page embeds the index only
