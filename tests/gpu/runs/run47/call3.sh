# Session 62, call 3 (any GPU; ~300 s; after call 1 or 2 on the warm machine). Qwen3-30B-A3B's
# batch-1 kernel map with the MoE switches off (as run in session 62), with PDL (the default; compare session 60's 4,142.5
# us step, 438 launches) and without (KAON_PDL=0: each kernel's own time with no overlap) to
# choose the next MoE kernel work (route 10.08 us, gate/up 21.66, down 16.43 a layer in session 60).
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
# switches off (session 61: norm fusion slower)
for pdl in 1 0; do
    echo "== trace, Qwen3-30B-A3B batch 1, KAON_PDL=$pdl ($(( $(date +%s) - T0 )) s in)"
    KAON_PDL=$pdl timeout 140 bash tests/gpu/trace_decode.sh bench/configs/Qwen__Qwen3-30B-A3B.json 0 32 1 16 \
        | grep -v "^run rc" | head -16 | cut -c1-110
    for f in $OUT/trace_*.txt; do case $f in *_pdl?.txt) ;; *) mv "$f" "${f%.txt}_pdl$pdl.txt" ;; esac; done
done
echo "done in $(( $(date +%s) - T0 )) s"
find $OUT -type f ! -name "trace_*.txt" -delete
