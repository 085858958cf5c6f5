# Session 55, first call (any GPU; from the repository root): on an H200 issue 15's 3,000-request
# FP8 figure after the padded tests (h200.sh, ~560 s); on an H100 the FP8 suite, latency and batch 1 (call2.sh).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    bash tests/gpu/runs/run39/h200.sh
else
    bash tests/gpu/runs/run39/call2.sh
fi
