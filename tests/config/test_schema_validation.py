"""Cross-field validation fails before any work starts, naming the fields and the fix; ``--show`` round-trips."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from tests.conftest import REPO
from ziprl.config import ConfigError, SamplingConfig, ZipRLConfig, describe, load_config, main
from ziprl.policy.rollout import rollout


@pytest.mark.parametrize(("overrides", "needle"), [
    (["run.checkpoint_every=0"], "run.checkpoint_every must be >= 1"),
    (["env.window_size=0"], "env.window_size must be >= 1"),
    (["model.dtype=float8"], "model.dtype must be float32, bfloat16, float16 or auto, got 'float8'"),
    (["learner.drop_zero_variance_groups=true", "rollout.group_size=1"],
     "learner.drop_zero_variance_groups=true drops every group when rollout.group_size=1"),
    (["model.engine=vllm", "model.device=cpu"], "model.engine=vllm runs on CUDA only"),
    (["rollout.batch_questions=5", "learner.global_batch_questions=2", "ray.max_staleness=1"],
     "rollout.batch_questions=5 is more than the 4 groups"),
    (["rollout.overlap=thread", "ray.max_staleness=0"],
     "rollout.overlap=thread generates the next batch while the learner trains on this one, so that batch is one "
     "policy version old, and ray.max_staleness=0 allows none: set ray.max_staleness >= 1, or rollout.overlap=off"),
    (["rollout.overlap=threads"], "rollout.overlap must be off, thread or auto, got 'threads'"),
])
def test_impossible_combinations_are_refused(overrides, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, overrides)


def test_the_edges_of_those_combinations_validate():
    load_config(None, ["learner.drop_zero_variance_groups=true", "rollout.group_size=2",
                       "rollout.batch_questions=4", "learner.global_batch_questions=2", "ray.max_staleness=1",
                       "model.engine=vllm", "model.device=auto"])
    load_config(None, ["rollout.overlap=thread", "ray.max_staleness=1"])
    load_config(None, ["rollout.overlap=auto", "ray.max_staleness=0"])  # auto picks off by itself


class LongResponses:
    """An engine whose context has no room for a prompt once ``max_new_tokens`` is reserved."""

    max_context = 128

    def generate(self, *args, **kwargs):
        raise AssertionError("no generation may start")


def test_no_room_for_a_prompt_in_the_model_context_is_refused():
    with pytest.raises(ConfigError, match=r"sampling.max_new_tokens=128 leaves no room for a prompt in the "
                                          r"model's 128-token context; lower sampling.max_new_tokens"):
        rollout(LongResponses(), lambda: None, [], SamplingConfig(max_new_tokens=128), group_size=2, seed=0)


def test_every_field_and_section_is_documented():
    def walk(obj, prefix=""):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                assert len(type(value).__doc__) > 20, f"{prefix}{f.name}"
                walk(value, f"{prefix}{f.name}.")
            else:
                assert len(f.metadata.get("help", "")) > 10, f"{prefix}{f.name}"

    walk(ZipRLConfig())


@pytest.mark.parametrize("source", [None, "paper.yaml"])
def test_show_prints_a_loadable_documented_config(source, tmp_path, capsys):
    path = None if source is None else REPO / "configs" / source
    overrides = ["env.strategy=window", "sampling.stop=['</x>', 'a: b # c']", "retriever.query_prefix='query: '"]
    assert main(["--show", *(["--config", str(path)] if path else []), *[a for o in overrides for a in ("--set", o)]]) == 0
    text = capsys.readouterr().out
    cfg = load_config(path, overrides)
    assert text == describe(cfg)
    assert "  # context strategy, any name registered" in text
    assert "  strategy: window" in text
    assert "    w_ratio: 0.3\n" in text
    assert "(length within the level's range). Paper: 0.3. Default: 0.3.\n" in text
    assert "log_every" not in text
    (tmp_path / "shown.yaml").write_text(text)
    assert isinstance(yaml.safe_load(text), dict)
    assert load_config(tmp_path / "shown.yaml") == cfg


def test_show_reports_a_bad_override(capsys):
    assert main(["--show", "--set", "env.strategy=magic"]) == 2
    assert "env.strategy must be a registered strategy" in capsys.readouterr().err
