#!/usr/bin/env bash
# The CUDA checks, run from the repository root on a machine with an NVIDIA GPU and a CUDA build of torch:
#   1. the tests that need no Ray or tritonserver (runtime, evaluate, model, export, base, cli), with the
#      gpu-marked ones and the drift suite's torch-fp32-cuda / torch-fp16-cuda cases running for real;
#   2. the CLI on the demo model: export, `info`, `validate` with torch-fp16 on cuda, `bench` torch vs torch-fp16,
#      and a ViT-B/16 (random weights, written by transformers) exported and benched on cuda in FP32 and FP16.
# Missing dependencies may be carried as wheels in .whl/ (installed into that machine's Python, which is thrown away).
# Logs go to $OUT (default /tmp/gpu-check); each step's last lines are printed.
set -u
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CI=
if compgen -G ".whl/*.whl" >/dev/null; then  # into the machine's own Python: subprocesses of the tests see them too
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade .whl/*.whl || exit 1
fi
export PYTHONPATH=$PWD
# the console script, without installing the package
mkdir -p /tmp/bin
printf '#!/bin/sh\nexec %s -c "import sys; from vitdeploy.cli import main; sys.argv[0] = \\"vitdeploy\\"; main()" "$@"\n' \
  "$(command -v python3)" > /tmp/bin/vitdeploy
chmod +x /tmp/bin/vitdeploy
export PATH=/tmp/bin:$PATH VITDEPLOY_REF_PYTHON=${VITDEPLOY_REF_PYTHON:-$(command -v python3)}

step() {  # step NAME SECONDS COMMAND...: run it under a time limit; its output goes to $OUT/NAME.log and is
  local name=$1 limit=$2 t0=$SECONDS rc  # appended to $OUT/steps.log (the device tool brings back few files)
  shift 2
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  { echo "== $name: rc=$rc in $((SECONDS - t0)) s: $*"; cat "$OUT/$name.log"; } >>"$OUT/steps.log"
  [ "$name" = tests ] || rm "$OUT/$name.log"
  echo "== $name: rc=$rc in $((SECONDS - t0)) s"
  tail -n "${TAIL:-12}" "$OUT/steps.log"
}

step env 60 sh -c 'nvidia-smi -L; python3 -c "import torch; print(torch.__version__, torch.version.cuda)"; vitdeploy info'
TAIL=40 step tests "${TEST_LIMIT:-300}" python3 -m pytest -p no:cacheprovider -q -rs -n "${WORKERS:-8}" --dist loadfile \
  -m "not serial and not multinode" tests/runtime tests/evaluate tests/model tests/export tests/base tests/cli \
  --ignore=tests/evaluate/test_report_browser.py
step demo-export 120 vitdeploy export -o /tmp/demo --engine skip
TAIL=20 step demo-validate 120 vitdeploy validate -a /tmp/demo -b torch,ort,ort-fp16,torch-fp16
TAIL=20 step demo-bench 120 vitdeploy bench -a /tmp/demo -b torch,torch-fp16 --batch-sizes 1,8,32 --iterations 20
step demo-predict 60 vitdeploy predict -a /tmp/demo -b torch -c scripts/gpu_cuda.yaml -k 1 vitdeploy/demo/images
if [ -z "${SKIP_VIT_B:-}" ]; then
  step vitb-checkpoint 120 python3 -c '
import torch, transformers
torch.manual_seed(0)
cfg = transformers.ViTConfig(image_size=224, patch_size=16, num_labels=1000)
transformers.ViTForImageClassification(cfg).eval().save_pretrained("/tmp/vitb")
transformers.ViTImageProcessor(size={"height": 224, "width": 224}).save_pretrained("/tmp/vitb")'
  printf 'model: {checkpoint: /tmp/vitb}\nexport: {int8: {enabled: false}}\n' >/tmp/vitb.yaml
  TAIL=20 step vitb-export 240 vitdeploy export -c /tmp/vitb.yaml -o /tmp/vitb-out --engine skip
  TAIL=20 step vitb-bench 120 vitdeploy bench -a /tmp/vitb-out -c /tmp/vitb.yaml -b torch,torch-fp16 \
    --batch-sizes 1,8,32,128 --iterations 20
fi
