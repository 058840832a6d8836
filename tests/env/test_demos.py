"""Cold-start demonstrations: the scripted teacher through the real retriever; only correct, well-formed
episodes are kept, and the file is what SFT reads."""

from __future__ import annotations

import json

import pytest

from ziprl.cli.demos import main
from ziprl.config import ZipRLConfig
from ziprl.env.demos import synthesize
from ziprl.env.protocol import parse_turn
from ziprl.learner.sft import read_demos
from ziprl.retrieval.datasets import load_dataset
from ziprl.retrieval.retriever import Retriever
from ziprl.retrieval.types import QAExample


@pytest.fixture(scope="module")
def retriever():
    from ziprl.config import RetrieverConfig

    return Retriever.from_config(RetrieverConfig())


def test_only_correct_well_formed_episodes_are_kept(retriever):
    good = load_dataset("sample")[:3]
    unanswerable = QAExample("bad-1", good[0].question, ["?!"], good[0].supporting_titles)  # normalises to ""
    empty = QAExample("bad-2", good[1].question, [""], good[1].supporting_titles)  # an empty <answer> tag
    no_titles = QAExample("bad-3", "Who?", ["Ann"])
    rows, counts = synthesize(ZipRLConfig(), [*good, unanswerable, empty, no_titles], retriever, progress=False)
    assert counts == {"episodes": 5, "kept": 3, "wrong": 1, "malformed": 1, "no_supporting_titles": 1}
    assert {r["question_id"] for r in rows} == {ex.id for ex in good}
    for ex in good:
        turns = [r for r in rows if r["question_id"] == ex.id]
        assert [r["turn"] for r in turns] == list(range(1, len(turns) + 1))
        assert turns[-1]["action"] == "answer"
        assert f"<answer>{ex.answers[0]}</answer>" in turns[-1]["response"]
        assert any(r["action"] == "search" for r in turns)
        assert any(r["action"] == "open" for r in turns)
        for r in turns:
            parsed = parse_turn(r["response"])
            assert parsed.error is None
            assert parsed.level == r["level"]
            messages = json.loads(r["messages"])
            assert [m["role"] for m in messages] == ["system", "user"]
            assert ex.question in messages[1]["content"]
        assert all(0 < r["q_com"] <= 1 for r in turns[1:])  # every turn after the first compressed an observation


def test_cli_writes_a_file_sft_reads(tmp_path, capsys):
    out = tmp_path / "demos.parquet"
    assert main(["--datasets", "sample", "--limit", "2", "--out", str(out)]) == 0
    assert "kept 2/2 episodes" in capsys.readouterr().out
    demos = read_demos(out)
    assert demos
    assert all(d["messages"][0]["role"] == "system" and d["response"] for d in demos)


def test_cli_rejects_bad_config(capsys):
    assert main(["--set", "env.strategy=magic"]) == 2
    assert "env.strategy" in capsys.readouterr().err


def test_limit_is_per_dataset_among_playable_questions(tmp_path, word_retriever):
    from ziprl.config import load_config
    from ziprl.env.demos import build_demos
    from ziprl.retrieval.datasets import write_qa_jsonl

    a = write_qa_jsonl([QAExample("a0", "Who?", ["x"]),  # no supporting titles: the teacher cannot play it
                        QAExample("a1", "Where is Paris?", ["France"], ["Paris"]),
                        QAExample("a2", "Who is Ed Wood?", ["a filmmaker"], ["Ed Wood"])], tmp_path / "a" / "qa.jsonl")
    b = write_qa_jsonl([QAExample("b0", "Who is Scott Derrickson?", ["a director"], ["Scott Derrickson"])],
                       tmp_path / "b" / "qa.jsonl")
    cfg = load_config(None, [f"demos.datasets={a},{b}", "demos.limit=1", f"demos.out={tmp_path / 'd.parquet'}"])
    path, counts = build_demos(cfg, retriever=word_retriever, progress=False)
    assert counts["episodes"] == 2
    assert counts["kept"] == 2
    assert counts["no_supporting_titles"] == 0
    assert {d["messages"][1]["content"].splitlines()[0] for d in read_demos(path)} == {
        "Question: Where is Paris?", "Question: Who is Scott Derrickson?"}
