"""Exposure (issue 14, item 7): Ray token auth on for clusters ZipRL starts, the HTTP route's token, JSON limits."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ziprl.config import HTTP_TOKEN_ENV, ConfigError, load_config

serve_retriever = pytest.importorskip("ziprl.actors.serve_retriever")
pytestmark = pytest.mark.ray_cluster


def test_deeply_nested_json_is_a_400_message_not_a_recursion_error():
    deep = b"[" * 200_000 + b"]" * 200_000
    assert serve_retriever.parse_body(deep) == f"JSON nested deeper than {serve_retriever.MAX_JSON_DEPTH} levels"
    assert serve_retriever.parse_body(b'{"queries": ["[[[[[[[[[[[[ in a string"], "k": 2}') == {
        "queries": ["[[[[[[[[[[[[ in a string"], "k": 2}
    assert serve_retriever.parse_body(b"[1]") == "body must be a JSON object"
    assert serve_retriever.parse_body(b"\xff") == "body must be JSON"


def test_bearer_token_check():
    assert serve_retriever.authorized(None, None)
    assert serve_retriever.authorized("Bearer s3cret", "s3cret")
    assert not serve_retriever.authorized(None, "s3cret")
    assert not serve_retriever.authorized("Bearer wrong", "s3cret")


def test_binding_beyond_loopback_requires_a_token(monkeypatch):
    monkeypatch.delenv(HTTP_TOKEN_ENV, raising=False)
    with pytest.raises(ConfigError, match=HTTP_TOKEN_ENV):
        load_config(None, ["ray.http_host=0.0.0.0", "ray.http_port=8000"])
    load_config(None, ["ray.http_host=0.0.0.0"])  # no route, nothing exposed
    monkeypatch.setenv(HTTP_TOKEN_ENV, "s3cret")
    load_config(None, ["ray.http_host=0.0.0.0", "ray.http_port=8000"])


@pytest.mark.slow
def test_a_local_cluster_refuses_clients_without_its_token():
    import ray
    from ray._private.ray_constants import ENABLE_RAY_CLUSTERS_ENV_VAR

    from ziprl.actors.ray_utils import init_ray, stop_ray, token_auth_enabled
    from ziprl.config import RayConfig

    assert os.environ.get("RAY_AUTH_MODE") in (None, "token"), "the test environment opted out of Ray auth"
    init_ray(RayConfig(), num_cpus=1)
    try:
        assert token_auth_enabled()
        assert ray.get(ray.remote(lambda: 41 + 1).remote()) == 42
        address = ray.get_runtime_context().gcs_address
        # the cluster listens on 127.0.0.1 only, an address Ray's client turns into this machine's external IP unless
        # its multi-node mode is off (docs/security.md)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | {ENABLE_RAY_CLUSTERS_ENV_VAR: "0"}
        code = f"import ray; ray.init(address={address!r}); print(ray.get(ray.remote(lambda: 1).remote()))"
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                              env={**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "not-the-cluster-token" * 2})
        assert proc.returncode != 0
        assert "1\n" not in proc.stdout
    finally:
        stop_ray()
