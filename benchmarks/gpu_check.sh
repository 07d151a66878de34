#!/usr/bin/env bash
# The GPU check: one script a GPU host runs in about 8-10 minutes, from the source tree, that writes
# docs/benchmarks-gpu.md and docs/benchmarks-gpu.json:
#   1. the GPU tests (tests/gpu: CUDA vs CPU rows, bf16 label agreement, the server on CUDA, a real OOM, NCCL)
#   2. one distillation epoch of configs/fashion_vit.yaml on this GPU (after a one-epoch backbone fit), timed
#   3. benchmarks/serve_load.py in fp32 and in bf16 (short settings) on the served artifact: the committed
#      fashion-vit if this host's torch loads and runs it, else the model of step 2 exported here
#   4. the raw artifact's throughput at large batch x samples and its FLOP/s against the device's peak, and fp32
#      vs bf16 predictions (label agreement, accuracy, ECE, NLL) on the test split (benchmarks/gpu_flops.py)
#   5. the torch.export artifact on CUDA: step 2's model exported as TorchScript, compiled by AOTInductor for this
#      GPU (training/export/torch_export_version.py, verified against that director.ts), and both formats' forwards
#      timed interleaved on the GPU (benchmarks/export_ab.py)
# It stops at once, writing nothing, when no CUDA device is present. A failing step is recorded with its exit
# status in the report and the next step runs.
#
# usage: benchmarks/gpu_check.sh [--wheels DIR] [--data DIR] [--work DIR] [--python PYTHON]
#   --wheels DIR   install the *.whl in DIR first (what the host lacks: benchmarks/gpu_wheels.txt), into WORK/site
#   --data DIR     Fashion-MNIST's four .gz files (default: $DIRECTOR_FASHION_ROOT or the Debian package's folder)
#   --work DIR     scratch folder: logs, runs, exported artifacts (default: ${TMPDIR:-/tmp}/director-gpu-check)
#   --python PY    the interpreter that has torch (default: python3)
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
PY=python3
WHEELS=""
DATA=${DIRECTOR_FASHION_ROOT:-/usr/share/datasets/fashion-mnist}
WORK=${TMPDIR:-/tmp}/director-gpu-check
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 64 ;;
  esac
done

fail() { echo "gpu_check: $*" >&2; exit 2; }

"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else f"gpu_check: no CUDA device: torch {torch.__version__} (built for CUDA {torch.version.cuda}) sees none")' \
  || fail "this script measures a GPU and found none; nothing was written"

rm -rf "$WORK" && mkdir -p "$WORK" || fail "cannot create $WORK"
export PYTHONPATH="$ROOT"
if [ -n "$WHEELS" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$WHEELS"/*.whl \
    || fail "installing the wheels of $WHEELS failed"
  export PYTHONPATH="$ROOT:$WORK/site"
fi
"$PY" -c "import fastapi, uvicorn, pydantic_settings, multipart, orjson, httpx, tokenizers, prometheus_client, PIL, pytest" \
  || fail "the serving stack is missing: pass --wheels DIR with the wheels of benchmarks/gpu_wheels.txt"
[ -f "$DATA/t10k-images-idx3-ubyte.gz" ] || fail "Fashion-MNIST not found in $DATA (pass --data DIR)"
export DIRECTOR_FASHION_ROOT="$DATA" PYTHONUNBUFFERED=1

"$PY" - "$WORK/host.json" <<'EOF'
import json, platform, subprocess, sys, time, torch
smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                     text=True, check=False).stdout.strip()
json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": torch.cuda.get_device_name(0),
           "gpus": torch.cuda.device_count(), "driver": smi or "?", "torch": torch.__version__,
           "cuda": torch.version.cuda, "python": platform.python_version()}, open(sys.argv[1], "w"))
EOF

# step NAME LIMIT_S COMMAND...: run COMMAND under a time limit, its output in WORK/NAME.log; record its exit status
# and seconds in WORK/steps.tsv
step() {
  local name=$1 limit=$2 start=$SECONDS status
  shift 2
  echo "gpu_check: $name (at most ${limit}s)"
  timeout "$limit" "$@" >"$WORK/$name.log" 2>&1
  status=$?
  printf '%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - start))" >>"$WORK/steps.tsv"
  [ "$status" -eq 0 ] || echo "gpu_check: $name exited $status (see $WORK/$name.log)" >&2
  return "$status"
}

CONFIG=configs/fashion_vit.yaml
RUN=(--config "$CONFIG" --set "run_dir=$WORK/run" --set "data.root=$DATA" --set threads=8)

step gpu-tests 150 "$PY" -m pytest -q -rs -p no:cacheprovider tests/gpu --junitxml "$WORK/gpu-tests.xml"

step fit-backbone 60 "$PY" -m training fit-backbone "${RUN[@]}" --set fit.epochs=1
DISTIL_START=$SECONDS
if step distil-epoch 90 "$PY" -m training distil "${RUN[@]}" --set distil.epochs=1; then
  "$PY" - "$WORK" "$((SECONDS - DISTIL_START))" "$CONFIG" <<'EOF'
import json, sys, torch
work, seconds, config = sys.argv[1], int(sys.argv[2]), sys.argv[3]
run = torch.load(f"{work}/run/director.pt", map_location="cpu", weights_only=False)
json.dump({"command": f"python -m training distil --config {config} --set distil.epochs=1", "seconds": seconds,
           "run_seconds": round(float(run["seconds"]), 1), "history": run["history"]},
          open(f"{work}/distil.json", "w"), indent=1, default=str)
EOF
fi

# the served artifact: the committed one if this torch loads and runs it, else the model just distilled, exported here
REPO="$ROOT/model_repository"
if ! "$PY" -c "
import torch
m = torch.jit.load('$REPO/fashion-vit/1/director.ts', map_location='cuda')
assert m.sample_rows(torch.zeros(2, 1, 28, 28, device='cuda'), torch.tensor([1, 3], device='cuda')).shape[0] == 4
" >"$WORK/load-check.log" 2>&1; then
  echo "gpu_check: this torch cannot run the committed artifact (see $WORK/load-check.log); exporting one here"
  REPO="$WORK/repo"
  step export 120 "$PY" -m training export "${RUN[@]}" --set "export.repository=$REPO" --set export.version=1 \
    --set "export.docs_dir=$WORK/docs"
fi

SERVE=(benchmarks/serve_load.py --mode load --repository "$REPO" --model fashion-vit --version 1 --device cuda
       --threads 4 --max-batch-samples 1024 --concurrency 1 32 --requests 400 --seconds 5 --overload-seconds 4)
step serve-fp32 75 "$PY" "${SERVE[@]}" --out "$WORK/serve-fp32.json" --markdown "$WORK/serve-fp32.md"
step serve-bf16 75 "$PY" "${SERVE[@]}" --bf16 --out "$WORK/serve-bf16.json" --markdown "$WORK/serve-bf16.md"
step raw-flops 60 "$PY" benchmarks/gpu_flops.py --artifact "$REPO/fashion-vit/1" --data "$DATA" --out "$WORK/flops.json"

# the package is compiled from the model of step 2: a TorchScript version of it to verify against, unless step 3
# served one already
SOURCE="$WORK/repo"
if [ "$REPO" != "$SOURCE" ]; then
  step export 120 "$PY" -m training export "${RUN[@]}" --set "export.repository=$SOURCE" --set export.version=1 \
    --set "export.docs_dir=$WORK/docs"
fi
if [ -f "$SOURCE/fashion-vit/1/director.ts" ] \
    && step aoti-cuda 150 "$PY" -m training.export.torch_export_version "${RUN[@]}" \
      --version "$SOURCE/fashion-vit/1" --out "$WORK/aoti/fashion-vit/1" --device cuda --threads 8; then
  step export-ab 60 "$PY" benchmarks/export_ab.py --version "$WORK/aoti/fashion-vit/1" --device cuda --threads 4 \
    --repeats 5 --min-seconds 0.2 --out "$WORK/export-ab.json"
fi

"$PY" benchmarks/gpu_report.py --work "$WORK" --markdown docs/benchmarks-gpu.md --json docs/benchmarks-gpu.json \
  || fail "writing the report failed"
echo "gpu_check: done in ${SECONDS}s; logs in $WORK"
