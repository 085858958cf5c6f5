# Call 4: HTTP sweep 512/128 at 256 clients, default vs KAON_DEC_TC=0 (old decode kernel in mixed steps too).
source tests/gpu/runs/run21/env.sh
export KAON_NINJA_JOBS=16; tests/gpu/run_all.sh build > $OUT/build_stdout.txt 2>&1; grep "build rc" $OUT/build_stdout.txt
export CONCURRENCY=256 NUM_PROMPTS=512 MAX_NUM_SEQS=256
O=$OUT; OUT=$O/sweep_tc timeout 200 bash bench/gpu_sweep.sh > $O/sweep_tc.txt 2>&1; tail -4 $O/sweep_tc.txt
KAON_DEC_TC=0 OUT=$O/sweep_old timeout 200 bash bench/gpu_sweep.sh > $O/sweep_old.txt 2>&1; tail -4 $O/sweep_old.txt
