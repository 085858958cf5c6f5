# Session 48, call 1: run28/call1.sh (issue 22's H200 figures at HEAD), only on an H200 (exits at once elsewhere).
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt; grep -q H200 /tmp/gpu.txt || exit 0
bash tests/gpu/runs/run28/call1.sh
