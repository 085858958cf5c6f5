# Session 55, one short call for what budget is left (~300-460 s): on an H100 call2.sh with only the
# padded, SiLU and model tests; on an H200 h200.sh with the 3,000-request run cut at 300 s.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    TP_LIMIT=300 bash tests/gpu/runs/run39/h200.sh
else
    FP8_K="padded or silu or model" bash tests/gpu/runs/run39/call2.sh
fi
