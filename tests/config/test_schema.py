import pytest

from tests.conftest import REPO
from ziprl.config import ConfigError, ZipRLConfig, load_config
from ziprl.loop.stream import QuestionStream
from ziprl.registry import TRANSPORTS
from ziprl.retrieval.types import QAExample


def test_defaults_validate_and_overrides_coerce():
    cfg = load_config(None, ["learner.lr=3e-4", "env.strategy=react", "demos.datasets=hotpotqa,musique",
                             "model.path=none", "learner.bf16=false", "env.scoring.level_scale=0.5"])
    assert cfg.learner.lr == 3e-4
    assert cfg.env.strategy == "react"
    assert cfg.demos.datasets == ["hotpotqa", "musique"]
    assert cfg.model.path is None
    assert cfg.learner.bf16 is False
    assert cfg.env.scoring.level_scale == 0.5


@pytest.mark.parametrize("override, needle", [
    ("env.strategy=magic", "env.strategy"),
    ("learner.lr=fast", "expected float"),
    ("env.max_turns=2.5", "expected int"),
    ("nope.x=1", "no config section"),
    ("env.nope=1", "no field"),
    ("env.top_k", "section.field=value"),
    ("learner.zero_stage=4", "zero_stage"),
    ("ray.learner_ranks=0", "learner_ranks"),
    ("model.gpu_memory_utilization=1.5", r"gpu_memory_utilization must be in \(0, 1\]"),
])
def test_bad_overrides_fail_with_the_field_named(override, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(None, [override])


def test_vllm_memory_fraction_must_fit_the_gpu_share():
    share = ["model.engine=vllm", "ray.rollout_gpus=0.125"]
    with pytest.raises(ConfigError, match="claim more memory than it has"):
        load_config(None, share)
    assert load_config(None, [*share, "model.gpu_memory_utilization=0.11"]).model.gpu_memory_utilization == 0.11
    load_config(None, ["ray.rollout_gpus=0.125"])  # the HF engine takes no memory fraction


def test_weight_transports_are_the_configs_one_list():
    for transport in TRANSPORTS:
        assert load_config(None, [f"weights.transport={transport}"]).weights.transport == transport
    with pytest.raises(ConfigError, match="weights.transport must be 'object_store' or 'collective', got 'nccl'"):
        load_config(None, ["weights.transport=nccl"])


def test_yaml_files(tmp_path):
    for name in ("paper.yaml", "laptop.yaml"):
        assert isinstance(load_config(REPO / "configs" / name), ZipRLConfig)
    assert load_config(REPO / "configs" / "laptop.yaml").to_dict() == ZipRLConfig().to_dict()  # the defaults, written out
    bad = tmp_path / "bad.yaml"
    bad.write_text("env:\n  top_k: [1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("envv:\n  top_k: 3\n")
    with pytest.raises(ConfigError, match="unknown config key"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_question_stream_resumes_exactly():
    exs = [QAExample(str(i), f"q{i}", ["a"]) for i in range(5)]
    a = QuestionStream(exs, seed=3)
    first = [e.id for e in a.next_batch(7)]  # crosses an epoch boundary
    assert sorted(first[:5]) == [str(i) for i in range(5)]
    pos = a.position
    rest = [e.id for e in a.next_batch(6)]
    b = QuestionStream(exs, seed=3)
    b.restore(pos)
    assert [e.id for e in b.next_batch(6)] == rest
    with pytest.raises(ValueError, match="does not match"):
        QuestionStream(exs[:4], seed=3).restore(pos)


def test_removed_key_names_its_replacement(tmp_path):
    # issue 11's repro: `--set ray.queue_size=1` must say what replaced the queue, not only "no field"
    with pytest.raises(ConfigError, match=r"ray.queue_size was removed: admission follows the staleness capacity"):
        load_config(None, ["ray.queue_size=1"])
    path = tmp_path / "old.yaml"
    path.write_text("ray:\n  queue_size: 8\n")
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) \['queue_size'\] in ray.*ray.queue_size was removed"):
        load_config(path)


def test_auto_engine_dtype_is_the_learners_compute_dtype():
    from ziprl.config import ModelConfig, resolve_engine_dtype

    assert resolve_engine_dtype(ModelConfig(), True).dtype == "bfloat16"
    assert resolve_engine_dtype(ModelConfig(), False).dtype == "float32"
    assert resolve_engine_dtype(ModelConfig(), None).dtype == "float32"  # no learner: evaluation, demos
    assert resolve_engine_dtype(ModelConfig(dtype="float16"), True).dtype == "float16"  # an explicit dtype is kept
    assert ModelConfig().dtype == "auto"
