"""Inputs bounded or refused before any work (issue 46): huge questions, lone surrogates, a JSON array where JSONL
belongs, a FIFO where a file belongs, and prompts longer than the model's context in every command."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ziprl.cli import demos, index, sft, train
from ziprl.cli import eval as eval_cmd
from ziprl.config import ZipRLConfig
from ziprl.evaluation.harness import run_strategy
from ziprl.policy.engine import Generation, GenerationEngine
from ziprl.retrieval.corpus import iter_corpus, scan_corpus
from ziprl.retrieval.datasets import DatasetError, load_dataset, load_qa_jsonl, write_qa_jsonl
from ziprl.retrieval.passage_store import PassageStore, write_store
from ziprl.retrieval.retriever import Encoder, Retriever, build_index
from ziprl.retrieval.types import QAExample
from ziprl.scoring.metrics import normalize_answer
from ziprl.view.data import load_run
from ziprl.view.tokens import UNKNOWN_CONTEXT, make_decoder, model_context

BIG = 1_000_000  # characters of the huge question
COMMANDS = {"eval": eval_cmd.main, "train": train.main, "demos": demos.main, "index": index.main, "sft": sft.main}
ANY_CHAR = st.characters(exclude_categories=())  # every code point, lone surrogates included
SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"])


def qa_line(qid: str, question: str) -> str:
    return json.dumps({"id": qid, "question": question, "answers": ["Ann"], "supporting_titles": ["T"]})


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    """The input files the cases name."""
    d = tmp_path_factory.mktemp("inputs")
    good = qa_line("q-ok", "Who?")
    (d / "big.jsonl").write_text(good + "\n" + qa_line("huge-1", "x" * BIG) + "\n")
    (d / "sur.jsonl").write_text(good + "\n\n" + qa_line("q-sur", "who \ud800 is it") + "\n")  # json escapes \ud800
    (d / "qarray.jsonl").write_text("[" + good + ",\n" + qa_line("q2", "What?") + "]\n")
    (d / "carray.jsonl").write_text(json.dumps([{"id": "a", "title": "A", "text": "x"}]) + "\n")
    os.mkfifo(d / "fifo.jsonl")
    os.mkfifo(d / "fifo.parquet")
    return d


@pytest.fixture
def alarm():
    """Fail a test that blocks (opening a FIFO blocks until a writer comes) instead of hanging the suite."""
    def expire(signum, frame):
        raise TimeoutError("the command blocked")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def run(cmd: str, argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = COMMANDS[cmd](argv)
        except SystemExit as exc:
            code = exc.code
    return code, err.getvalue()


def dataset_argv(cmd: str, dataset: str) -> list[str]:
    """A command line of ``cmd`` playing ``dataset``: eval, train and demos, each with tiny settings."""
    return {"eval": ["--dataset", dataset, "--limit", "1", "--max-turns", "1", "--out", "eval-out"],
            "train": ["--out", "run", "--steps", "1", "--set", f"data.dataset={dataset}", "--set", "env.max_turns=1",
                      "--set", "sampling.max_new_tokens=8"],
            "demos": ["--datasets", dataset, "--out", "demos.parquet"]}[cmd]


CASES = [  # (command, argv with {d}, what the error line must say)
    *[(cmd, dataset_argv(cmd, "{d}/big.jsonl"),
       f"QA file {{d}}/big.jsonl line 2: question 'huge-1' is {BIG} characters, more than data.max_question_chars=8000")
      for cmd in ("eval", "train", "demos")],
    *[(cmd, dataset_argv(cmd, "{d}/sur.jsonl"),
       "QA file {d}/sur.jsonl line 3: question 'q-sur' holds a lone surrogate in its question (U+D800 at character 4)")
      for cmd in ("eval", "train", "demos")],
    *[(cmd, dataset_argv(cmd, "{d}/qarray.jsonl"),
       "{d}/qarray.jsonl is a JSON array, not JSONL (one JSON object per line); convert it with: python -c")
      for cmd in ("eval", "train", "demos")],
    ("index", ["build", "--corpus", "{d}/carray.jsonl", "--out", "idx"],
     "{d}/carray.jsonl is a JSON array, not JSONL (one JSON object per line); convert it with: python -c"),
    ("eval", ["--set", "retriever.corpus={d}/carray.jsonl", "--out", "eval-out"],
     "{d}/carray.jsonl is a JSON array, not JSONL"),
    *[(cmd, dataset_argv(cmd, "{d}/fifo.jsonl"), "QA file {d}/fifo.jsonl is a FIFO (named pipe), not a regular file")
      for cmd in ("eval", "train", "demos")],
    ("index", ["build", "--corpus", "{d}/fifo.jsonl", "--out", "idx"],
     "corpus file {d}/fifo.jsonl is a FIFO (named pipe), not a regular file"),
    ("eval", ["--set", "retriever.corpus={d}/fifo.jsonl", "--out", "eval-out"],
     "corpus file {d}/fifo.jsonl is a FIFO (named pipe), not a regular file"),
    ("sft", ["--demos", "{d}/fifo.parquet", "--out", "sft-out"],
     "demo file {d}/fifo.parquet is a FIFO (named pipe), not a regular file"),
    ("eval", ["--set", "data.max_question_chars=0", "--out", "eval-out"], "data.max_question_chars must be >= 1, got 0"),
]


DEEP = "[" * 100_000 + "]" * 100_000  # a line nested deeper than the JSON parser's recursion limit


def passage(doc_id: str, text: str = "x") -> str:
    return json.dumps({"id": doc_id, "title": "T", "text": text})


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """Corpora whose problem is after line 1, one of two passages, and a QA file beside that one."""
    c = tmp_path_factory.mktemp("corpora")
    for name, lines in {"dup.jsonl": [passage("a"), passage("a")], "empty.jsonl": [passage("a"), passage("b", "")],
                        "bad.jsonl": [passage("a"), passage("b"), passage("c"), '{"id": '],
                        "deep.jsonl": [passage("a"), DEEP], "small/corpus.jsonl": [passage("a"), passage("b")],
                        "deepqa.jsonl": [qa_line("q1", "Who?"), DEEP]}.items():
        (c / name).parent.mkdir(exist_ok=True)
        (c / name).write_text("\n".join(lines) + "\n")
    (c / "small" / "qa.jsonl").write_text(qa_line("q1", "Who?") + "\n")
    (c / "index").mkdir()
    (c / "index" / "manifest.json").write_text(json.dumps({"format": 2, "count": 2, "shards": 1}))
    return c


def with_corpus(cmd: str, *sets: str) -> list[str]:
    more = [a for s in sets for a in ("--set", s)]
    return {"eval": ["--limit", "1", "--max-turns", "1", "--out", "eval-out", *more],
            "train": ["--out", "run", "--steps", "1", "--set", "env.max_turns=1", *more]}[cmd]


LATE = [  # (command, argv with {c}, what the error line must say): found before the output directory is made
    *[case for cmd in ("eval", "train") for case in [
        (cmd, with_corpus(cmd, "retriever.corpus={c}/dup.jsonl"), "corpus {c}/dup.jsonl: duplicate id 'a' on lines 1 "
                                                                  "and 2; ids must be unique"),
        (cmd, with_corpus(cmd, "retriever.corpus={c}/empty.jsonl"), "corpus {c}/empty.jsonl line 2: field 'text' is "
                                                                    "empty"),
        (cmd, with_corpus(cmd, "retriever.corpus={c}/bad.jsonl"), "corpus {c}/bad.jsonl line 4: malformed JSON"),
        (cmd, with_corpus(cmd, "retriever.corpus={c}/deep.jsonl"), "corpus {c}/deep.jsonl line 2: JSON nested too "
                                                                   "deeply; each line must be one JSON object"),
        (cmd, with_corpus(cmd, "retriever.corpus={c}/small/corpus.jsonl"),
         "env.top_k=5 is more than the corpus's 2 passages; set env.top_k <= 2"),
        (cmd, with_corpus(cmd, "data.dataset={c}/small/qa.jsonl"),
         "env.top_k=5 is more than the corpus's 2 passages; set env.top_k <= 2"),
        (cmd, with_corpus(cmd, "retriever.index_dir={c}/index"),
         "env.top_k=5 is more than the corpus's 2 passages; set env.top_k <= 2"),
        (cmd, with_corpus(cmd, "retriever.corpus={c}/small/corpus.jsonl", "env.top_k=2", "retriever.shards=3"),
         "retriever.shards=3 is more than the corpus's 2 passages (a shard holds at least one); set retriever.shards "
         "<= 2"),
        (cmd, with_corpus(cmd, "data.dataset={c}/deepqa.jsonl"),
         "dataset file {c}/deepqa.jsonl line 2: JSON nested too deeply; each line must be one JSON object"),
    ]],
    ("demos", ["--datasets", "{c}/deepqa.jsonl", "--out", "demos.parquet"],
     "dataset file {c}/deepqa.jsonl line 2: JSON nested too deeply"),
]


@pytest.mark.parametrize(("cmd", "argv", "says"), LATE, ids=[f"{c} {' '.join(a)}" for c, a, _ in LATE])
def test_a_corpus_problem_past_line_1_is_found_before_the_output_is_made(cmd, argv, says, corpora, tmp_path,
                                                                          monkeypatch, no_models, alarm):
    """So the rerun with the corpus fixed is not refused as an output directory that is not empty."""
    monkeypatch.chdir(tmp_path)
    code, err = run(cmd, [a.replace("{c}", str(corpora)) for a in argv])
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    assert says.replace("{c}", str(corpora)) in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("cmd", "argv", "says"), CASES, ids=[f"{c} {' '.join(a)}" for c, a, _ in CASES])
def test_bad_input_is_one_error_line_before_any_model_loads(cmd, argv, says, d, tmp_path, monkeypatch, no_models,
                                                            alarm):
    monkeypatch.chdir(tmp_path)
    code, err = run(cmd, [a.replace("{d}", str(d)) for a in argv])
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    assert says.replace("{d}", str(d)) in lines[0]


def test_a_raised_question_limit_loads_the_huge_question(d):
    assert [len(e.question) for e in load_dataset(str(d / "big.jsonl"), max_question_chars=BIG)] == [4, BIG]


def test_named_datasets_apply_the_question_limit():
    with pytest.raises(DatasetError, match=r"dataset 'sample': question '.+' is \d+ characters, more than "
                                           r"data.max_question_chars=50"):
        load_dataset("sample", limit=1, max_question_chars=50)


@pytest.mark.parametrize("field", ["id", "question", "answers", "supporting_titles", "source"])
def test_a_lone_surrogate_in_any_question_text_is_refused(tmp_path, field):
    rec = {"id": "q1", "question": "Who?", "answers": ["Ann"], "supporting_titles": ["T"], "source": "s"}
    rec[field] = [rec[field][0] + "\udc80"] if isinstance(rec[field], list) else rec[field] + "\udc80"
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    with pytest.raises(DatasetError, match=r"line 1: question .+ holds a lone surrogate in its .+\(U\+DC80"):
        load_qa_jsonl(path)


def test_a_surrogate_pair_is_one_character_and_loads(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text('{"id": "q", "question": "Who \\ud83d\\ude00?", "answers": ["Ann"]}\n')
    assert load_qa_jsonl(path)[0].question == "Who \U0001f600?"


CHAR = st.characters(codec="utf-8")  # every character (no lone surrogate)
TEXT = st.text(CHAR, min_size=1, max_size=40).filter(lambda s: s.strip())
ANSWER = TEXT.filter(normalize_answer)  # a gold answer keeps a word after EM/F1 normalisation


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(CHAR, max_size=20), TEXT, st.lists(ANSWER, min_size=1, max_size=3)),
                min_size=1, max_size=4))
def test_any_unicode_question_round_trips(tmp_path_factory, rows):
    """Line breaks other than \\n (U+2028, U+0085, ...) inside a question stay inside it."""
    examples = [QAExample(f"{i}-{qid}", q.strip(), answers) for i, (qid, q, answers) in enumerate(rows)]
    path = write_qa_jsonl(examples, tmp_path_factory.mktemp("qa") / "qa.jsonl")
    assert load_qa_jsonl(path) == examples


# ---------------------------------------------------------------- corpus text: any Unicode, never a crash


def fffd(text: str) -> str:
    return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)


ANY_TEXT = st.text(st.one_of(ANY_CHAR, SURROGATE), min_size=1, max_size=200).filter(lambda s: s.strip())


ID_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="[]\u2023"), max_size=10).map(
    lambda s: " ".join(s.split()))  # every id the agent can address (ziprl.retrieval.corpus.id_problem)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(ID_TEXT, ANY_TEXT, ANY_TEXT), min_size=1, max_size=5))
def test_any_unicode_corpus_is_read_stored_and_returned(tmp_path_factory, rows):
    """Lone surrogates in a title or text become U+FFFD; everything else comes back as written, through the passage
    store."""
    tmp = tmp_path_factory.mktemp("corpus")
    path = tmp / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": f"{i}-{doc}", "title": title, "text": text}) + "\n"
                            for i, (doc, title, text) in enumerate(rows)), encoding="utf-8")
    want = [(f"{i}-{doc}", fffd(title), fffd(text)) for i, (doc, title, text) in enumerate(rows)]
    assert [(p.doc_id, p.title, p.text) for _, p in iter_corpus(path)] == want
    scan = scan_corpus(path)
    write_store((p for _, p in iter_corpus(path)), tmp, scan.id_hashes)
    store = PassageStore(tmp)
    assert [(p.doc_id, p.title, p.text) for p in map(store.passage, range(len(rows)))] == want
    assert [store.row_of(doc_id) for doc_id, _, _ in want] == list(range(len(rows)))


def test_a_huge_passage_with_lone_surrogates_is_indexed_and_found(tmp_path, caplog):
    path = tmp_path / "corpus.jsonl"
    texts = ["\ud800 start " + "ω" * BIG, "plain \udfff text", "emoji \U0001f600 \u2028 \x00 end"]
    path.write_text("".join(json.dumps({"id": f"d{i}", "title": f"T\udc00{i}", "text": t}) + "\n"
                            for i, t in enumerate(texts)), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="ziprl.retrieval.corpus"):
        out = build_index(path, tmp_path / "idx", Encoder(), progress=False)
    assert sum("lone surrogates" in r.getMessage() for r in caplog.records) == 2  # one per reading: scan, then store
    retriever = Retriever.load(out)
    assert retriever.open("d1").text == "plain \ufffd text"
    assert len(retriever.open("d0").text) == len(texts[0])
    assert {h.doc_id for h in retriever.search(["emoji end \ufffd"], 3)[0]} == {"d0", "d1", "d2"}


# ---------------------------------------------------------------- generation bounded in eval as in training


class WordCountEngine(GenerationEngine):
    """A prompt is one token per 'overflow' in the messages (plus one); every response is the same answer."""

    tokenizer = None

    def __init__(self, max_context: int):
        self.max_context, self.prompts = max_context, []

    def encode_chat(self, messages):
        return [1] * (1 + sum(m["content"].count("overflow") for m in messages))

    def generate(self, prompts, sampling, seed=None):
        self.prompts += prompts
        return [Generation(list(p), [1], [0.0], "<answer>a</answer>", "stop") for p in prompts]

    def load_weights(self, named_arrays, version):
        raise AssertionError("not used")


def test_eval_ends_an_episode_whose_prompt_outgrows_the_context(word_retriever, caplog):
    cfg = ZipRLConfig()
    cfg.env.max_turns, cfg.sampling.max_new_tokens, cfg.rollout.group_size = 2, 8, 1
    examples = [QAExample("long", "overflow " * 100 + "?", ["a"]), QAExample("short", "Who?", ["a"])]
    engine = WordCountEngine(max_context=50 + 8)
    with caplog.at_level(logging.WARNING, logger="ziprl.policy.rollout"):
        stats, trajs = run_strategy(cfg, "adaptive", (examples, word_retriever, engine), progress=False)
    assert max(len(p) for p in engine.prompts) <= 50
    assert [(t.question_id, len(t.turns), t.finished) for t in trajs] == [("long", 0, False), ("short", 2, False)]
    assert stats["turns"] == 1.0
    assert any("1 of 2 episodes ended unfinished" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- the viewer decodes within the model's context


@pytest.fixture
def word_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"Question:": 0, "a": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4}))
    turn = pa.struct([("prompt_ids", pa.list_(pa.int64()))])
    pq.write_table(pa.table({"question": ["Q?"], "turns": pa.array([[{"prompt_ids": [0, 1]}]], pa.list_(turn))}),
                   tmp_path / "t.parquet")
    return tmp_path


def test_the_viewer_does_not_decode_a_prompt_past_the_model_context(word_tokenizer, capsys):
    decode = make_decoder(str(word_tokenizer), load_run(word_tokenizer / "t.parquet"))
    assert decode([0, 1, 1, 1]) == "Question: a a a"
    assert decode([0] + [1] * 10**6) == ""
    assert decode([0] + [1] * 5) == ""
    err = capsys.readouterr().err
    assert err.count("[view] note:") == 1
    assert "a prompt of 1000001 tokens is longer than the 4-token context of the model at" in err


def test_model_context_without_a_config_is_the_documented_default(word_tokenizer):
    assert model_context(word_tokenizer / "tokenizer.json") == 4
    (word_tokenizer / "config.json").write_text("{}")
    assert model_context(word_tokenizer / "tokenizer.json") == UNKNOWN_CONTEXT

