# Call 2: FP8 decode widen baseline; batch 1 + prefill 8k with/without the wgmma prefill; 64/256 in flight (wgmma on).
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep "build rc" /tmp/build_stdout.txt
source tests/gpu/runs/run21/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== dec fp8 widen"; build-gpu/gpu_driver dec_bench 32 8 128 fp8 2>&1 | grep timing
echo "== decode wgmma"; KAON_FA_WGMMA=1 timeout 130 python3 bench/gpu_decode.py --kaon build-gpu/kaon --prefill 8192 --json $OUT/decode_wgmma.jsonl 2>&1 | tail -4
echo "== decode mma"; timeout 130 python3 bench/gpu_decode.py --kaon build-gpu/kaon --prefill 8192 --json $OUT/decode_mma.jsonl 2>&1 | tail -4
echo "== throughput wgmma"; KAON_FA_WGMMA=1 timeout 200 python3 bench/gpu_throughput.py --kaon build-gpu/kaon --requests 64 256 --output 1024 --json $OUT/throughput_wgmma.jsonl 2>&1 | grep "requests ("
echo "== pytest"; timeout 50 python3 -m pytest -q -x tests/gpu/test_gpu.py -k "attention and not wgmma" 2>&1 | tail -2
