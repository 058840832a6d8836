"""The one-rank DeepSpeed bootstrap: a process's rendezvous port stays its own."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
CHILD = ("from ziprl.learner.distributed import init_distributed; init_distributed(); "
         "import torch.distributed as d; print('child group of', d.get_world_size())")


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS}
    return subprocess.run([sys.executable, "-c", code], env=clean | env, cwd=REPO, capture_output=True, text=True,
                          timeout=600)


def test_a_child_forms_its_own_group_after_the_parent_formed_one():
    """benchmarks/learning.py builds Stage 1 in-process, then starts RL runs as subprocesses: they inherited the
    port the parent's store still held and died with EADDRINUSE."""
    parent = (f"import subprocess, sys\nfrom ziprl.learner.distributed import init_distributed\ninit_distributed()\n"
              f"child = subprocess.run([sys.executable, '-c', {CHILD!r}], capture_output=True, text=True)\n"
              f"print(child.stdout, child.stderr[-3000:])\nsys.exit(child.returncode)")
    proc = run(parent)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "child group of 1" in proc.stdout


def test_a_launcher_port_is_kept():
    """A port the launcher set is the launcher's: read, never replaced or removed."""
    code = ("import os\nfrom ziprl.learner.distributed import init_distributed\n"
            "port = os.environ['MASTER_PORT']\ninit_distributed()\nassert os.environ['MASTER_PORT'] == port\n"
            "import torch.distributed as d\nprint('group of', d.get_world_size())")
    from ziprl.learner.distributed import free_port

    proc = run(code, MASTER_PORT=str(free_port()))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "group of 1" in proc.stdout


def test_no_op_is_compiled_to_form_a_group(tmp_path):
    """DeepSpeed compiled its shared-memory all-reduce op (used only by its inference all-reduce, never by ZipRL)
    the first time any process formed a group: 35-100 s of g++ on two cores in every launch from an empty cache.
    Forming a group now builds and loads nothing, whatever the build directory holds."""
    code = ("from ziprl.learner.distributed import init_distributed\nds = init_distributed()\n"
            "from deepspeed.comm import comm\nprint('shm op', comm.cdb.shm_comm_op)")
    proc = run(code, TORCH_EXTENSIONS_DIR=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "shm op None" in proc.stdout
    assert "built successfully" not in proc.stdout + proc.stderr
    assert not any(tmp_path.iterdir())


def test_the_groups_rendezvous_listens_on_its_address_only():
    """torch's own TCPStore listens on every interface: a one-rank learner on a laptop opened a port to its network.
    The store ZipRL starts listens on MASTER_ADDR (127.0.0.1 by default) only."""
    code = ("import os, psutil\nfrom ziprl.learner.distributed import init_distributed\ninit_distributed()\n"
            "port = int(os.environ.get('MASTER_PORT') or 0)\n"
            "print(sorted({c.laddr.ip for c in psutil.Process().net_connections('tcp') if c.status == 'LISTEN'}))")
    proc = run(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "['127.0.0.1']"
