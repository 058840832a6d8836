"""cluster/a100x8.yaml is a valid Ray cluster launcher config for the installed Ray."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

ray = pytest.importorskip("ray")
jsonschema = pytest.importorskip("jsonschema")

YAML = Path(__file__).resolve().parents[1] / "cluster" / "a100x8.yaml"


@pytest.fixture(scope="module")
def cfg() -> dict:
    return yaml.safe_load(YAML.read_text())


def test_matches_ray_schema(cfg):
    import ray.autoscaler

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(cfg, schema)


def test_ray_up_preparation_accepts_it(cfg):
    # What `ray up` does before launching: fill defaults for the provider, then validate.
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(copy.deepcopy(cfg)))


def test_head_runs_no_tasks_and_worker_has_8_gpus(cfg):
    types = cfg["available_node_types"]
    assert types[cfg["head_node_type"]]["resources"]["CPU"] == 0
    workers = [t for name, t in types.items() if name != cfg["head_node_type"]]
    assert any(t["resources"].get("GPU") == 8 for t in workers)


def test_image_is_current_ray_gpu_image(cfg):
    image = cfg["docker"]["image"]
    repo, tag = image.split(":")
    assert repo == "rayproject/ray"
    assert tag.endswith("-gpu")
    assert tag.split("-")[0] == ray.__version__, "image tag should match the installed Ray"
    images = [v for k, v in cfg["docker"].items() if k.endswith("image")]
    images += [t.get("docker", {}).get("worker_image", "") for t in cfg["available_node_types"].values()]
    assert not any("ray-ml" in i for i in images), "rayproject/ray-ml images are no longer published"


def test_installs_ziprl_with_gpu_extra(cfg):
    assert any("pip install" in c and "ziprl[gpu" in c for c in cfg["setup_commands"])
    assert cfg["head_start_ray_commands"]
    assert cfg["worker_start_ray_commands"]


def test_every_node_uses_the_operators_security_group(cfg):
    """Ray's auto-created group opens SSH to 0.0.0.0/0; an explicit group on every node type replaces it."""
    for name, t in cfg["available_node_types"].items():
        groups = t["node_config"].get("SecurityGroupIds")
        assert groups, name
        assert all(g.startswith("sg-") for g in groups), name
    rules = cfg["provider"].get("security_group", {}).get("IpPermissions", [])
    assert not any(r.get("CidrIp") == "0.0.0.0/0" for rule in rules for r in rule.get("IpRanges", []))
    text = YAML.read_text()
    assert "--port 22 --cidr <YOUR_IP>/32" in text
    assert "--source-group <SG_ID>" in text


def test_ray_token_authentication_is_on(cfg):
    assert "--env RAY_AUTH_MODE=token" in cfg["docker"]["run_options"]
    assert cfg["file_mounts"].get("~/.ray/auth_token") == "~/.ray/auth_token"
    for cmd in (cfg["head_start_ray_commands"][-1], cfg["worker_start_ray_commands"][-1]):
        assert "RAY_AUTH_MODE=token ray start" in cmd
    assert "--dashboard-host=127.0.0.1" in cfg["head_start_ray_commands"][-1]
