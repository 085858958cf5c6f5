# Session 47 call 3 (right after call 2, same warm machine: its build in /tmp/kb): issue 22's
# throughput bars at HEAD, 64 / 256 in flight and the HTTP sweeps at 256 and 1,024 clients.
if [ -x /tmp/kb/kaon ]; then rm -rf build-gpu; cp -a /tmp/kb build-gpu; echo "build from call 2";
else export KAON_NINJA_JOBS=16; tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep "build rc" /tmp/build_stdout.txt | head -1; fi
source tests/gpu/runs/run21/env.sh
[ -f .debs/unpack.sh ] && source .debs/unpack.sh > /dev/null
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== 64 / 256 in flight, 1024 / 1024"
timeout 150 python3 bench/gpu_throughput.py --kaon build-gpu/kaon --requests 64 256 --output 1024 2>&1 | grep -vi "info" | tail -4
O=$OUT
for c in 256 1024; do
    echo "== sweep $c"
    n=$((c > 512 ? c : 512))
    CONCURRENCY=$c NUM_PROMPTS=$n MAX_NUM_SEQS=$c OUT=$O/sweep$c timeout 170 bash bench/gpu_sweep.sh > $O/sweep$c.txt 2>&1
    grep -h '"kind": "serve_roofline"' $O/sweep$c.txt | tail -1
done
find $O -type f ! -name "serve-kaon-*.json" -delete
