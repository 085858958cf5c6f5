# Session 56, first call (any GPU; from the repository root; carry .debs, .whl, .llama): on an H200
# issue 15's 3,000-request FP8 run cut at 300 s after the padded tests (run39/h200.sh, ~460 s); on an
# H100 the FP8 suite, latency batches and FP8 batch 1 (run39/call2.sh, ~420 s).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    TP_LIMIT=${TP_LIMIT:-300} bash tests/gpu/runs/run39/h200.sh
else
    bash tests/gpu/runs/run39/call2.sh
fi
