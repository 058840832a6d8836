"""The CUDA probe behind model.device: what torch's build and the NVIDIA driver say, read without importing
torch."""

from __future__ import annotations

import ctypes
import importlib.util
import types

import pytest

from ziprl.config import ConfigError, load_config
from ziprl.config import cuda as probe


def test_cuda_is_checked_where_torch_can_tell(monkeypatch):
    monkeypatch.setattr(probe, "_torch_cuda_build", lambda: True)
    monkeypatch.setattr(probe, "_nvidia_gpus", lambda: 0)
    with pytest.raises(ConfigError, match=r"^model.device=cuda asks for a CUDA device and this machine has none that "
                                          r"torch may use; set model.device=auto \(CUDA when available\) or cpu$"):
        load_config(None, ["model.device=cuda"])
    assert load_config(None, ["model.device=cuda", "ray.address=auto"]).model.device == "cuda"  # a joined cluster's
    assert load_config(None, ["model.device=auto"]).model.device == "auto"
    monkeypatch.setattr(probe, "_nvidia_gpus", lambda: 2)
    assert load_config(None, ["model.device=cuda:1"]).model.device == "cuda:1"
    with pytest.raises(ConfigError, match=r"model.device=cuda:2 asks for a CUDA device and this machine has 2 "
                                          r"\(cuda:0..cuda:1\) that torch"):
        load_config(None, ["model.device=cuda:2"])
    monkeypatch.setattr(probe, "_torch_cuda_build", lambda: False)
    with pytest.raises(ConfigError, match=r"^model.device=cuda asks for CUDA and the installed torch is built without "
                                          r"it; set model.device=auto"):
        load_config(None, ["model.device=cuda"])
    monkeypatch.setattr(probe, "_torch_cuda_build", lambda: None)  # no torch, or a ROCm build: nothing to tell
    assert load_config(None, ["model.device=cuda"]).model.device == "cuda"


def test_the_cuda_probe_agrees_with_torch():
    torch = pytest.importorskip("torch")
    assert (probe.missing_cuda("cuda", None) == "") is torch.cuda.is_available()
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert probe.missing_cuda(f"cuda:{count}", None) != ""
    assert probe.missing_cuda(f"cuda:{count}", "auto") == ""


@pytest.mark.parametrize(("version_py", "cuda"), [
    ("cuda: Optional[str] = None\nhip: Optional[str] = None\n", False),
    ("cuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n", True),
    ("cuda = '11.8'\nhip = None\n", True),
    ("cuda: Optional[str] = None\nhip: Optional[str] = '6.2.41133'\n", None),
])
def test_the_torch_build_is_read_without_importing_torch(version_py, cuda, tmp_path, monkeypatch):
    (tmp_path / "version.py").write_text(version_py)
    spec = types.SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "torch" else None)
    assert probe._torch_cuda_build() is cuda


class FakeNVML:
    """libnvidia-ml's three calls, reporting ``count`` GPUs."""

    def __init__(self, count: int):
        self.count, self.shut = count, False

    def nvmlInit_v2(self) -> int:  # noqa: N802 (NVML's names)
        return 0

    def nvmlDeviceGetCount_v2(self, out) -> int:  # noqa: N802
        out._obj.value = self.count
        return 0

    def nvmlShutdown(self) -> int:  # noqa: N802
        self.shut = True
        return 0


@pytest.mark.parametrize(("visible", "gpus"), [(None, 4), ("", 0), ("1", 1), ("0,2", 2), ("0,-1,2", 1), ("-1", 0),
                                               ("GPU-1a2b,GPU-3c4d", 2), ("0,1,2,3,4,5", 4)])
def test_nvidia_gpus_follow_cuda_visible_devices(visible, gpus, monkeypatch):
    nvml = FakeNVML(4)
    monkeypatch.setattr(ctypes, "CDLL", lambda name: nvml)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert probe._nvidia_gpus() == gpus
    assert nvml.shut


def test_no_driver_is_no_gpu(monkeypatch):
    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert probe._nvidia_gpus() == 0
