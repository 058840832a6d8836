#!/usr/bin/env bash
# Issue 48's open measurements on a lent GPU machine, as one command within its 10-minute limit (../shared/GPU.md),
# once `scripts/gpu_learn.sh ... --install-only` has installed the payload of `scripts/gpu_payload.sh --ray` into STORE:
#   1. scripts/gpu_check.sh                                        OUT/gpu_check/report.md
#   2. benchmarks/engine_throughput.py --arch smollm2-135m,qwen3-1.7b: static decode's prefill and decode
#      tokens/s beside the memory-bound ceilings                   engine_throughput_TAG
#   3. benchmarks/decode_ops.py --time at 64 rows and 1,152 positions: one captured step's milliseconds against
#      its memory-bound floor, and the kernels it spends them in   decode_ops_TAG
#   4. benchmarks/gpu_async.py --modes split,off: two processes on one GPU against sequential (thread was
#      measured: gpu_async_h200.md); split first, so a cut keeps it
#                                                                  gpu_async_TAG_split
#   5. benchmarks/gpu_async.py --arch qwen3-1.7b --modes off: the learner's MFU in ziprl.train at 1.7B
#                                                                  gpu_async_TAG_1p7b
# Each step runs under its share of --minutes; a step cut short keeps what its benchmark wrote. Every file written
# ends up in OUT/results.tgz (the machine sends back a few files per command).
#
#   scripts/gpu_round.sh [--store /tmp/ziprl-store] [--out DIR] [--tag h200] [--minutes 9] [--dry-run]
#
# OUT (default $OUT, else runs/gpu_round) is new or empty, checked before anything is written. Without a CUDA GPU it
# says so and exits 0. PYTHON=... picks the interpreter (default python3).
set -uo pipefail
HERE=$PWD
cd "$(dirname "$0")/.." || exit 1

die() { echo "gpu_round: $*" >&2; exit 2; }
abs() { if [[ $1 = /* ]]; then echo "$1"; else echo "$HERE/$1"; fi; }
STORE=/tmp/ziprl-store
DEST=$PWD/runs/gpu_round
[ -z "${OUT:-}" ] || DEST=$(abs "$OUT")  # the device's $OUT; relative: to the caller's directory, as --out
TAG=h200
MINUTES=9
DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --store) [ -n "${2:-}" ] || die "--store needs a directory"; STORE=$(abs "$2"); shift 2 ;;
    --out) [ -n "${2:-}" ] || die "--out needs a directory"; DEST=$(abs "$2"); shift 2 ;;
    --tag) [[ ${2:-} =~ ^[a-z0-9_]+$ ]] || die "--tag needs lower-case letters, digits or _"; TAG=$2; shift 2 ;;
    --minutes) [[ ${2:-} =~ ^[1-9][0-9]{0,2}$ ]] && [ "$2" -le 600 ] || die "--minutes needs a positive integer (at most 600)"
               MINUTES=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) grep -m1 '^#   scripts/gpu_round.sh' "$0" | sed 's/^#  *//'; exit 0 ;;
    *) die "unknown argument $1" ;;
  esac
done
if [ -e "$DEST" ] || [ -L "$DEST" ]; then
  { [ -d "$DEST" ] && [ ! -L "$DEST" ] && [ -z "$(ls -A "$DEST")" ]; } \
    || die "--out $DEST exists and is not an empty directory; nothing was written: choose a new one"
fi
PY=${PYTHON:-python3}
TOTAL=$(( MINUTES * 60 - 15 ))  # 15 s kept for the archive
gpu_check() { bash scripts/gpu_check.sh "$DEST/gpu_check/report.md"; }
engine_throughput() {
  "$PY" benchmarks/engine_throughput.py --arch smollm2-135m,qwen3-1.7b --rows 64 --prompt-tokens 1024 --new-tokens 128 \
    --repeats 2 --name "engine_throughput_$TAG"
}
decode_ops() {
  "$PY" benchmarks/decode_ops.py --device cuda --time --rows 64 --span 1152 --name "decode_ops_$TAG"
}
gpu_async() { "$PY" benchmarks/gpu_async.py --modes split,off --steps 4 --name "gpu_async_${TAG}_split"; }
gpu_async_1p7b() { "$PY" benchmarks/gpu_async.py --arch qwen3-1.7b --modes off --steps 3 --name "gpu_async_${TAG}_1p7b"; }
STEPS=(gpu_check:11 engine_throughput:20 decode_ops:7 gpu_async:32 gpu_async_1p7b:30)  # step: its share of TOTAL, in percent
if [ "$DRY" = 1 ]; then
  echo "gpu_round plan (dry run), within $MINUTES minutes, files into $DEST/results.tgz:"
  for step in "${STEPS[@]}"; do
    echo "  ${step%:*} (at most $(( TOTAL * ${step#*:} / 100 )) s):$(declare -f "${step%:*}" | sed -n '3p' | tr -s ' ')"
  done
  exit 0
fi
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
  echo "gpu_round: no CUDA GPU visible to PyTorch ($PY): nothing to do"
  exit 0
fi
[ -d "$STORE/site" ] || die "no $STORE/site: install the payload first (scripts/gpu_learn.sh --piece LAST --sha256 HEX --install-only)"
mkdir -p "$DEST/results" || die "cannot create $DEST"
export PYTHONPATH="$STORE/site:$PWD" ZIPRL_DATA="$STORE/data" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PY DEST TAG
export -f gpu_check engine_throughput decode_ops gpu_async gpu_async_1p7b
stamp=$DEST/.started
touch "$stamp"
for step in "${STEPS[@]}"; do
  name=${step%:*} limit=$(( TOTAL * ${step#*:} / 100 ))
  echo "gpu_round: $(date +%T) $name (at most $limit s)"
  timeout "$limit" bash -c "$name" > "$DEST/$name.log" 2>&1
  echo "gpu_round: $name exit code $?"
  tail -4 "$DEST/$name.log"
done
find benchmarks/results -newer "$stamp" -type f -exec cp {} "$DEST/results/" \;
archive=$(mktemp /tmp/gpu_round.XXXXXX) && tar -czf "$archive" -C "$DEST" --exclude=.started . && mv "$archive" "$DEST/results.tgz"
echo "gpu_round: $(date +%T) results in $DEST/results.tgz"
