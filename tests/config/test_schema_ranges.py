"""Values that used to validate and then fail later are rejected by load_config (issue 14, item 6); every numeric
field has a range, checked at load for every command (issue 46, item 2). The CUDA probe: test_cuda.py."""

from __future__ import annotations

import dataclasses
import re
import types
import typing

import pytest

from tests.conftest import REPO
from ziprl.config import INT_MAX, RANGES, ConfigError, EnvConfig, ZipRLConfig, check_range, load_config, main
from ziprl.env import SearchCompressEnv
from ziprl.testing.word_retriever import PASSAGES, SizedWordRetriever


@pytest.mark.parametrize(("override", "needle"), [
    ("env.scoring.w_info=-0.4", "env.scoring.w_info must be >= 0, got -0.4"),
    ("env.scoring.w_sem=.nan", "env.scoring.w_sem must be a finite number"),
    ("env.scoring.w_ratio=nan", "env.scoring.w_ratio must be a finite number"),
    ("env.scoring.level_scale=inf", "level_scale must be a finite number"),
    ("env.memory_max_chars=-1", "env.memory_max_chars must be >= 0"),
    ("env.max_response_chars=0", "env.max_response_chars must be >="),
    ("learner.lr=-1", "learner.lr must be > 0"),
    ("learner.lr=nan", "learner.lr must be a finite number"),
    ("sft.lr=0", "sft.lr must be > 0"),
    ("run.checkpoint_every=0", "run.checkpoint_every must be >= 1"),
    ("learner.micro_batch_turns=0", "learner.micro_batch_turns"),
    ("learner.micro_batch_tokens=-1", "learner.micro_batch_tokens must be >= 0"),
    ("data.limit=0", "data.limit must be >= 1"),
    ("ray.http_port=70000", "ray.http_port"),
])
def test_out_of_range_values_are_config_errors(override, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.").replace("(", r"\(")):
        load_config(None, [override])


def test_defaults_and_bounds_still_validate():
    load_config(None, ["env.memory_max_chars=0", "env.scoring.w_level=0", "env.max_response_chars=64"])


def test_top_k_above_the_corpus_size_is_refused_when_the_corpus_is_known():
    retriever = SizedWordRetriever(PASSAGES)
    with pytest.raises(ConfigError, match=r"env.top_k=5 is more than the corpus's 3 passages"):
        SearchCompressEnv(EnvConfig(top_k=5), retriever=retriever)
    with pytest.raises(ConfigError, match="env.memory_max_chars"):
        SearchCompressEnv({"memory_max_chars": -1}, retriever=retriever)
    SearchCompressEnv(EnvConfig(top_k=3), retriever=retriever)


def test_weights_need_a_positive_sum():
    zero = [f"env.scoring.{w}=0" for w in ("w_ratio", "w_level", "w_info", "w_sem")]
    with pytest.raises(ConfigError, match=r"env.scoring weights .* must have a positive sum, got \(0.0, 0.0, 0.0, 0.0\)"):
        load_config(None, zero)


@pytest.mark.parametrize(("override", "message"), [  # issue 46's cases: exit 1 "internal error" or accepted before
    ("learner.seed=-1", "learner.seed must be in 0..4294967295, got -1"),
    ("data.seed=4294967296", "data.seed must be in 0..4294967295, got 4294967296"),
    ("model.num_threads=-3", "model.num_threads must be in 0..1024 (0 = torch's default), got -3"),
    ("ray.retriever_replicas=0", "ray.retriever_replicas must be >= 1, got 0"),
    ("ray.learner_cpus=-4", "ray.learner_cpus must be >= 0.0001 (Ray's smallest unit is 0.0001), got -4.0"),
    ("ray.rollout_gpus=-1", "ray.rollout_gpus must be 0 or >= 0.0001 (a fraction shares a GPU; Ray's smallest unit is "
                            "0.0001), got -1.0"),
    ("ray.retriever_max_batch=0", "ray.retriever_max_batch must be >= 1, got 0"),
    ("ray.retriever_timeout_s=1e300", "ray.retriever_timeout_s must be in (0, 1000000] (seconds), got 1e+300"),
    ("retriever.nprobe=-1", "retriever.nprobe must be >= 0 (0 = FAISS's default), got -1"),
    ("env.top_k=3000000000", "env.top_k must be in 1..2147483647, got 3000000000"),
    ("sampling.temperature=1e-9", "sampling.temperature must be 0 or >= 0.001 (0 = greedy), got 1e-09"),
    ("ray.http_port=0", "ray.http_port must be in 1..65535 (null = no HTTP route), got 0"),
    ("model.device=gpu", "model.device must be auto, cpu, cuda or cuda:N, got 'gpu'"),
    ("sampling.stop=['</answer>', '']", "sampling.stop must not hold an empty string"),
    ("demos.datasets=[]", "demos.datasets must name at least one QA set"),
    ("ray.address=''", "ray.address must be null (start a local cluster), auto or a cluster address"),
])
def test_config_show_refuses_what_launch_would(override, message, capsys):
    assert main(["--show", "--set", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}")
    assert err.count("\n") == 1


def _numeric_fields(cls: type = ZipRLConfig, prefix: str = "") -> list[str]:
    """Dotted names of every int or float field (nullable ones too), from the type hints."""
    out = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            out += _numeric_fields(tp, f"{prefix}{f.name}.")
        elif {int, float} & set(typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType)
                                else (tp,)):
            out.append(prefix + f.name)
    return out


def test_every_numeric_field_has_a_range():
    fields = _numeric_fields()
    assert len(fields) > 60
    assert sorted(set(fields) - set(RANGES)) == []
    assert sorted(set(RANGES) - set(fields)) == []


def _bounds(field: str) -> tuple[list, list]:
    """(values the range of ``field`` allows, values it refuses), at and around its bounds."""
    r, is_int = RANGES[field], _is_int(field)
    lo = int(r.lo) if is_int else float(r.lo)
    hi = r.hi if r.hi is not None else INT_MAX if is_int else None
    ok, bad = ([] if r.above else [lo]), [lo if r.above else lo - 1]
    if r.or_zero:
        ok, bad = [*ok, 0], [*bad, lo / 2]
    if hi is not None:
        ok, bad = [*ok, int(hi) if is_int else float(hi)], [*bad, int(hi) + 1 if is_int else float(hi) * 2]
    return ok, bad


def _is_int(field: str) -> bool:
    *sections, name = field.split(".")
    cls = ZipRLConfig
    for s in sections:
        cls = typing.get_type_hints(cls)[s]
    tp = typing.get_type_hints(cls)[name]
    return int in (typing.get_args(tp) or (tp,))


@pytest.mark.parametrize("field", sorted(RANGES))
def test_each_range_is_checked_at_load(field):
    ok, bad = _bounds(field)
    for value in ok:
        check_range(field, value)
    for value in bad:
        with pytest.raises(ConfigError, match=rf"^{re.escape(field)} must be .*, got {re.escape(str(value))}$"):
            load_config(None, [f"{field}={value!r}"])


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_still_loads(path):
    assert isinstance(load_config(path), ZipRLConfig)
