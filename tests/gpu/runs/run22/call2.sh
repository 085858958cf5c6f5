# Call 2 (H200): HTTP sweep 512/128 at 256 clients (default, KAON_DEC_TC=0) and 1024 clients (default).
source tests/gpu/runs/run21/env.sh
export KAON_NINJA_JOBS=16; tests/gpu/run_all.sh build > $OUT/build_stdout.txt 2>&1; grep "build rc" $OUT/build_stdout.txt
O=$OUT
CONCURRENCY=256 NUM_PROMPTS=512 MAX_NUM_SEQS=256 OUT=$O/sweep256 timeout 170 bash bench/gpu_sweep.sh > $O/sweep256.txt 2>&1; tail -4 $O/sweep256.txt
CONCURRENCY=1024 NUM_PROMPTS=1024 MAX_NUM_SEQS=1024 OUT=$O/sweep1024 timeout 200 bash bench/gpu_sweep.sh > $O/sweep1024.txt 2>&1; tail -4 $O/sweep1024.txt
KAON_DEC_TC=0 CONCURRENCY=256 NUM_PROMPTS=512 MAX_NUM_SEQS=256 OUT=$O/sweep256_old timeout 170 bash bench/gpu_sweep.sh > $O/sweep256_old.txt 2>&1; tail -4 $O/sweep256_old.txt
