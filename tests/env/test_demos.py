"""Cold-start demonstrations: the scripted teacher through the real retriever; only correct, well-formed
episodes are kept, and the file is what SFT reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ziprl.cli.demos import main
from ziprl.config import ZipRLConfig, load_config
from ziprl.env.demos import synthesize
from ziprl.env.protocol import parse_turn
from ziprl.learner.sft import DemoFileError, read_demos
from ziprl.retrieval.datasets import load_dataset
from ziprl.retrieval.retriever import Retriever
from ziprl.retrieval.types import QAExample
from ziprl.testing.stops import stop_after


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


def _cfg(tmp_path, *more: str):
    from ziprl.config import load_config
    from ziprl.retrieval.datasets import write_qa_jsonl

    qa = write_qa_jsonl([QAExample("q1", "Where is Paris?", ["France"], ["Paris"]),
                         QAExample("q2", "Who?", ["x"]),  # no supporting titles
                         QAExample("q3", "Who is Ed Wood?", ["a filmmaker"], ["Ed Wood"]),
                         QAExample("q4", "Who is Scott Derrickson?", ["a director"], ["Scott Derrickson"]),
                         # its gold holds the hit marker, which no turn can write (scrubbed to '>'): answered wrong
                         QAExample("q5", "Where is Paris?", ["Fr\u2023ance"], ["Paris"])],
                        tmp_path / "qa" / "qa.jsonl")
    return load_config(None, [f"demos.datasets={qa}", "demos.limit=0", f"demos.out={tmp_path / 'd.parquet'}", *more])


def _table(path):
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def test_a_stopped_run_keeps_its_progress_and_resumed_writes_what_a_straight_run_does(tmp_path, word_retriever,
                                                                                     monkeypatch):
    """Stopped after question 3 of 5 (a SIGTERM's Stop), the progress file holds those questions' episodes and
    counts and no demos file is written; resumed, only questions 4 and 5 are played, the demos equal a run that was
    never stopped, and the progress file is gone."""
    from ziprl.env import demos
    from ziprl.loop.stop import Stop

    straight, _ = demos.build_demos(_cfg(tmp_path / "a"), retriever=word_retriever, progress=False)
    cfg = _cfg(tmp_path / "b")
    with pytest.raises(Stop):
        demos.build_demos(cfg, retriever=word_retriever, progress=False, stop=stop_after(3))
    out = Path(cfg.demos.out)
    partial = demos.partial_path(out)
    assert not out.exists() and demos.is_partial_file(partial) and not demos.is_demos_file(partial)
    saved = demos.read_partial(partial, demos.demo_settings(cfg, demos.demo_examples(cfg)))
    assert saved.done == 3 and saved.counts == {"episodes": 2, "kept": 2, "wrong": 0, "malformed": 0,
                                                "no_supporting_titles": 1}
    assert {r["question_id"] for r in saved.rows} == {"q1", "q3"}
    with pytest.raises(DemoFileError, match="progress of a stopped ziprl.demos"):  # SFT cannot take it for demos
        read_demos(partial)

    played = []
    real_play = demos.play
    monkeypatch.setattr(demos, "play", lambda env, teacher, ex: played.append(ex.id) or real_play(env, teacher, ex))
    path, counts = demos.build_demos(cfg, retriever=word_retriever, progress=False, resume=True)
    assert played == ["q4", "q5"]
    assert counts == {"episodes": 4, "kept": 3, "wrong": 1, "malformed": 0, "no_supporting_titles": 1,
                      "transitions": len(_table(path))}
    assert _table(path) == _table(straight) and demos.is_demos_file(path)
    assert not partial.exists()


def test_progress_is_saved_every_checkpoint_every_questions_and_a_build_continues_it(tmp_path, word_retriever):
    """With ``demos.checkpoint_every=2`` a run killed after question 3 (a second signal: no save then) keeps the
    progress of question 2; a build with the same settings (as launch's Stage 1 runs it) continues from there."""
    from ziprl.env import demos

    cfg = _cfg(tmp_path, "demos.checkpoint_every=2")
    with pytest.raises(KeyboardInterrupt):
        demos.build_demos(cfg, retriever=word_retriever, progress=False, stop=stop_after(3, checkpoint=False))
    partial = demos.partial_path(cfg.demos.out)
    assert demos.read_partial(partial, demos.demo_settings(cfg, demos.demo_examples(cfg))).done == 2
    path, counts = demos.build_demos(cfg, retriever=word_retriever, progress=False)
    assert counts["episodes"] == 4 and not partial.exists()
    straight, _ = demos.build_demos(_cfg(tmp_path / "a"), retriever=word_retriever, progress=False)
    assert _table(path) == _table(straight)


def test_resuming_with_other_settings_or_questions_is_refused_naming_them(tmp_path, word_retriever):
    from ziprl.env import demos

    cfg = _cfg(tmp_path, "env.top_k=3")
    with pytest.raises(KeyboardInterrupt):
        demos.build_demos(cfg, retriever=word_retriever, progress=False, stop=stop_after(2))
    partial = demos.partial_path(cfg.demos.out)
    before = partial.read_bytes()
    with pytest.raises(demos.DemoResumeError, match="env.top_k 3 then, 2 now"):
        demos.build_demos(_cfg(tmp_path, "env.top_k=2"), retriever=word_retriever, progress=False, resume=True)
    fewer = load_config(None, [f"demos.datasets={cfg.demos.datasets[0]}", "demos.limit=2", "env.top_k=3",
                               f"demos.out={cfg.demos.out}"])
    with pytest.raises(demos.DemoResumeError, match="questions.count 5 then, 2 now"):
        demos.build_demos(fewer, retriever=word_retriever, progress=False, resume=True)
    assert partial.read_bytes() == before and not Path(cfg.demos.out).exists()
    with pytest.raises(demos.DemoResumeError, match="no stopped run to continue"):
        demos.build_demos(_cfg(tmp_path / "new"), retriever=word_retriever, progress=False, resume=True)


@pytest.mark.slow
def test_sigterm_stops_the_demos_command_with_its_progress_and_resume_finishes(tmp_path):
    """``python -m ziprl.demos`` on SIGTERM: exit 143 with its progress; run again it refuses (exit 2) without
    --resume, and with another --limit; ``--resume`` writes the demos a straight run writes."""
    import signal
    import subprocess
    import sys
    import time

    from ziprl.env.demos import partial_path

    out = tmp_path / "demos.parquet"
    command = [sys.executable, "-m", "ziprl.demos", "--datasets", "sample", "--limit", "12", "--out", str(out),
               "--set", "demos.checkpoint_every=1"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))  # not an inherited SIG_IGN
    deadline = time.monotonic() + 600
    while not partial_path(out).is_file():  # a question is done
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=600)[0]
    assert proc.returncode == 143, output
    assert "[demos] stopped after question" in output and not out.exists()
    done = int(output.split("[demos] stopped after question ")[1].split()[0])
    assert 1 <= done < 12

    before = partial_path(out).read_bytes()
    again = subprocess.run(command, capture_output=True, text=True)
    assert again.returncode == 2 and "pass --resume to continue it" in again.stderr, again.stderr
    other = subprocess.run([*command[:5], "--limit", "10", *command[7:], "--resume"], capture_output=True, text=True)
    assert other.returncode == 2 and "questions.count 12 then, 10 now" in other.stderr, other.stderr
    assert partial_path(out).read_bytes() == before and not out.exists()
    resumed = subprocess.run([*command, "--resume"], capture_output=True, text=True)
    assert resumed.returncode == 0 and "kept 12/12 episodes" in resumed.stdout, resumed.stderr
    assert not partial_path(out).exists()
    assert main(["--datasets", "sample", "--limit", "12", "--out", str(tmp_path / "straight.parquet")]) == 0
    assert _table(out) == _table(tmp_path / "straight.parquet")


def _qa_with_corpus(folder: Path, examples: list[QAExample], titles: list[str]) -> str:
    from ziprl.retrieval.corpus import write_corpus
    from ziprl.retrieval.datasets import write_qa_jsonl
    from ziprl.retrieval.types import Passage

    write_corpus([Passage(f"{folder.name}-{i}", t, f"{t} is a place.") for i, t in enumerate(titles)],
                 folder / "corpus.jsonl")
    return str(write_qa_jsonl(examples, folder / "qa.jsonl"))


def test_datasets_on_different_corpora_are_refused_before_any_episode(tmp_path, monkeypatch, capsys):
    """Played on the first one's corpus, the second's questions would be answered without their evidence."""
    from ziprl.env import demos
    from ziprl.retrieval.datasets import DatasetError

    a = _qa_with_corpus(tmp_path / "a", [QAExample("a1", "Where is Paris?", ["France"], ["Paris"])], ["Paris"])
    b = _qa_with_corpus(tmp_path / "b", [QAExample("b1", "Where is Rome?", ["Italy"], ["Rome"])], ["Rome"])
    monkeypatch.setattr("ziprl.retrieval.retriever.Retriever.from_config",
                        lambda *a, **k: pytest.fail("a retriever was built"))
    monkeypatch.setattr(demos, "synthesize", lambda *a, **k: pytest.fail("an episode was played"))
    out = tmp_path / "d.parquet"
    cfg = load_config(None, [f"demos.datasets={a},{b}", f"demos.out={out}"])
    with pytest.raises(DatasetError, match=(
            rf"demos.datasets search different corpora \({a} on {tmp_path / 'a' / 'corpus.jsonl'}; {b} on "
            rf"{tmp_path / 'b' / 'corpus.jsonl'}\), but the teacher plays them all on one retriever; run ziprl.demos "
            "once per corpus, or set retriever.corpus to one corpus holding every passage they need")):
        demos.build_demos(cfg, progress=False)
    assert main(["--datasets", f"{a},{b}", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "search different corpora" in err
    assert not out.exists() and not demos.partial_path(out).exists()


def test_datasets_on_one_corpus_or_an_explicit_corpus_share_the_retriever(tmp_path):
    from ziprl.env.demos import demo_retriever_config
    from ziprl.retrieval.datasets import SAMPLE_DIR

    a = _qa_with_corpus(tmp_path / "a", [QAExample("a1", "Where is Paris?", ["France"], ["Paris"])], ["Paris"])
    b = _qa_with_corpus(tmp_path / "b", [QAExample("b1", "Where is Rome?", ["Italy"], ["Rome"])], ["Rome"])
    both = load_config(None, [f"demos.datasets={a},{b}", f"retriever.corpus={tmp_path / 'a' / 'corpus.jsonl'}"])
    assert demo_retriever_config(both).corpus == str(tmp_path / "a" / "corpus.jsonl")
    sample = load_config(None, [f"demos.datasets=sample,{SAMPLE_DIR / 'qa.jsonl'}"])  # the shipped corpus, twice
    assert demo_retriever_config(sample) == sample.retriever


def test_a_question_in_two_listed_datasets_is_refused_naming_both(tmp_path, capsys):
    from ziprl.env.demos import demo_examples
    from ziprl.retrieval.datasets import SAMPLE_DIR, DatasetError, load_dataset

    b = _qa_with_corpus(tmp_path / "b", [QAExample("b1", "Where is Rome?", ["Italy"], ["Rome"])], ["Rome"])
    with pytest.raises(DatasetError, match=rf"question 'b1' is in both {b} and {b}, and would be played twice; list "
                                           "each dataset once in demos.datasets"):
        demo_examples(load_config(None, [f"demos.datasets={b},{b}"]))
    shipped = str(SAMPLE_DIR / "qa.jsonl")
    first = load_dataset("sample")[0].id
    out = tmp_path / "d.parquet"
    assert main(["--datasets", f"sample,{shipped}", "--limit", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and f"question {first!r} is in both sample and {shipped}" in err
    assert not out.exists()
