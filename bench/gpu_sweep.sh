#!/usr/bin/env bash
# Serving sweep on a GPU: kaon serve --device cuda --load-format dummy on a real model's config
# (default Llama-3.1-8B-Instruct), then bench/serve.py at max concurrency 1..1024; the results
# JSON, the PNG plots, the server log and nvidia-smi go under $OUT.
#
#   KAON_BUILD=build-cuda OUT=/tmp/sweep bash bench/gpu_sweep.sh
#
# Settings (environment): CONFIG (a bench/configs/*.json), CONCURRENCY (1,4,16,64,256,1024),
# INPUT_LEN (512), OUTPUT_LEN (128), NUM_PROMPTS (16: at least this many per level),
# PROMPTS_PER_CONCURRENCY (1: at least this many per request in flight), MAX_NUM_SEQS (1024),
# MAX_MODEL_LEN (4096), GPU_UTIL (0.9), PYTHON (python3), EXTRA_SERVE_ARGS.
# Dummy weights have no tokenizer: bench/dummy_model.py writes one covering the vocabulary next to
# the config, so the stream carries one chunk per token as with a real model; prompts go as token
# ids. Needs only python3 (matplotlib for the PNGs; without it `python3 bench/plot.py
# $OUT/serve-*.json --out-dir $OUT` makes them later on any machine). With torch, the copy
# bandwidth is measured first and each level is printed beside its serving roofline (prefill at
# 790 TFLOP/s + decode steps at that bandwidth; bench/roofline.py --serve); BW overrides it.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${KAON_BUILD:?set KAON_BUILD to a kaon build with CUDA}"
: "${OUT:?set OUT to a folder for the results}"
CONFIG=${CONFIG:-bench/configs/meta-llama__Llama-3.1-8B-Instruct.json}
CONCURRENCY=${CONCURRENCY:-1,4,16,64,256,1024}
INPUT_LEN=${INPUT_LEN:-512}
OUTPUT_LEN=${OUTPUT_LEN:-128}
NUM_PROMPTS=${NUM_PROMPTS:-16}
PROMPTS_PER_CONCURRENCY=${PROMPTS_PER_CONCURRENCY:-1}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-1024}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-4096}
GPU_UTIL=${GPU_UTIL:-0.9}
PYTHON=${PYTHON:-python3}
name=$(basename "$CONFIG" .json)
mkdir -p "$OUT"

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
# The copy bandwidth (bytes read + written per second) before the server takes the memory.
BW=${BW:-$("$PYTHON" -c 'import sys; sys.path.insert(0, "bench"); from gpu_decode import copy_bandwidth; print(copy_bandwidth())' 2>/dev/null || true)}
"$PYTHON" bench/dummy_model.py "$CONFIG" "$OUT/model"
vocab=$("$PYTHON" -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c.get("vocab_size") or c["text_config"]["vocab_size"])' "$CONFIG")

rm -f "$OUT/port"
"$KAON_BUILD/kaon" serve "$OUT/model" --load-format dummy --device cuda --port 0 --port-file "$OUT/port" \
  --served-model-name "$name" --max-num-seqs "$MAX_NUM_SEQS" --max-model-len "$MAX_MODEL_LEN" \
  --gpu-memory-utilization "$GPU_UTIL" ${EXTRA_SERVE_ARGS:-} > "$OUT/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT

for _ in $(seq 1200); do  # up to 10 minutes for start-up (weights, CUDA graphs)
  kill -0 $server 2>/dev/null || { echo "kaon serve exited:"; tail -30 "$OUT/server.log"; exit 1; }
  if [ -s "$OUT/port" ]; then
    read -r host port < "$OUT/port"
    if "$PYTHON" -c 'import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
        "http://$host:$port/health" 2>/dev/null; then break; fi
  fi
  sleep 0.5
done
[ -n "${port:-}" ] || { echo "kaon serve did not start"; tail -30 "$OUT/server.log"; exit 1; }
echo "kaon serve ready on $host:$port ($(grep -m1 -o 'GPU memory plan.*' "$OUT/server.log" || true))"

KAON_COMMIT=${KAON_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || true)} \
"$PYTHON" bench/serve.py --base-url "http://$host:$port" --model "$name" --label kaon-cuda \
  --prompt-format ids --random-vocab-size "$vocab" \
  --random-input-len "$INPUT_LEN" --random-output-len "$OUTPUT_LEN" \
  --num-prompts "$NUM_PROMPTS" --min-prompts-per-concurrency "$PROMPTS_PER_CONCURRENCY" \
  --max-concurrency "$CONCURRENCY" --num-gpus 1 --result-dir "$OUT" \
  --metadata "config=$CONFIG" "load_format=dummy" "server=kaon serve --device cuda" \
  2>&1 | tee "$OUT/serve.txt"

kill $server 2>/dev/null || true
wait $server 2>/dev/null || true
trap - EXIT
result=$(ls -t "$OUT"/serve-*.json 2>/dev/null | head -1 || true)
if [ -n "$BW" ] && [ -n "$result" ]; then
  "$PYTHON" bench/roofline.py "$CONFIG" --serve "$result" --bw "$BW" | tee "$OUT/roofline.txt"
else
  echo "no serving roofline: copy bandwidth not measured (torch missing? set BW=bytes/s) or no result JSON"
fi
grep -E "engine:|plan|graph" "$OUT/server.log" | head -5 || true
echo "results in $OUT: $(ls "$OUT" | tr '\n' ' ')"
