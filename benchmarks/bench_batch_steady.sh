#!/usr/bin/env bash
# batch-predict against predict in steady state: each command's rate over the difference of a 2,000- and a
# 400-image run, so that its fixed costs (Ray's start and stop, the interpreter's start) cancel.
#   benchmarks/bench_batch_steady.sh EXPORT_DIR PHOTOS_DIR [ROUNDS]
# EXPORT_DIR: an export (bench_batch.py leaves /tmp/vitdeploy-bench/vit-s16-hf-random-emb-art); PHOTOS_DIR: at least
# 2,000 JPEG files under it (bench_batch.py's /tmp/vitdeploy-bench/photos-2000). -b ort, 2 threads, batch 8.
set -u
ART=$1 PHOTOS=$2 ROUNDS=${3:-2}
VITDEPLOY="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/vitdeploy"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/small" "$WORK/large"
find "$PHOTOS" -type f -name "*.jpg" | sort | head -2000 | xargs -I{} cp {} "$WORK/large/"
find "$WORK/large" -type f | sort | head -400 | xargs -I{} cp {} "$WORK/small/"
printf 'runtime: {threads: 2, batch_size: 8}\n' > "$WORK/p.yaml"
seconds() { local s e; s=$(date +%s.%N); "$@" > /dev/null 2>&1; e=$(date +%s.%N); echo "$e - $s" | bc; }
for round in $(seq "$ROUNDS"); do
  declare -A t=()
  for n in small large; do
    t[predict_$n]=$(seconds "$VITDEPLOY" predict "$WORK/$n" -a "$ART" -b ort --json -c "$WORK/p.yaml")
    rm -rf "$WORK/out.parquet"
    t[batch_$n]=$(seconds "$VITDEPLOY" batch-predict "$WORK/$n" -o "$WORK/out.parquet" -a "$ART" -b ort -c "$WORK/p.yaml")
  done
  p=$(echo "1600 / (${t[predict_large]} - ${t[predict_small]})" | bc -l)
  b=$(echo "1600 / (${t[batch_large]} - ${t[batch_small]})" | bc -l)
  printf 'round %d: predict %.1f img/s, batch-predict %.1f img/s, ratio %.2f (load %s)\n' \
    "$round" "$p" "$b" "$(echo "$b / $p" | bc -l)" "$(cut -d' ' -f1 /proc/loadavg)"
done
