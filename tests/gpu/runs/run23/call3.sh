# Call 3 (same H200): FP8 decode frag; prefill attention wgmma vs mma; HTTP sweep 256; FP8-cache 256 in flight frag.
export KAON_NINJA_JOBS=16
[ -x build-gpu/gpu_driver ] || { tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep "build rc" /tmp/build_stdout.txt; }
source tests/gpu/runs/run21/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== dec fp8 frag"; KAON_DTC_FP8_FRAG=1 build-gpu/gpu_driver dec_bench 32 8 128 fp8 2>&1 | grep timing | grep -v '"B": 1,'
echo "== attn wgmma"; KAON_FA_WGMMA=1 timeout 60 build-gpu/gpu_driver attn_bench 32 8 128 16384 0 2>&1 | grep timing
echo "== attn mma"; timeout 60 build-gpu/gpu_driver attn_bench 32 8 128 16384 0 2>&1 | grep timing
echo "== fp8 256 frag"; KAON_DTC_FP8_FRAG=1 timeout 150 python3 bench/gpu_throughput.py --kaon build-gpu/kaon --requests 256 --output 1024 --kv-cache-dtype fp8 2>&1 | grep "requests ("
echo "== sweep 256 wgmma"; KAON_FA_WGMMA=1 CONCURRENCY=256 NUM_PROMPTS=512 MAX_NUM_SEQS=256 OUT=$OUT/sweep256 timeout 170 bash bench/gpu_sweep.sh > /tmp/sweep256.txt 2>&1; tail -4 /tmp/sweep256.txt
