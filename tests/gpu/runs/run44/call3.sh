# Session 60, call 3 (an H200: issue 22's bars; ~500 s; from the repository root; carry .debs, .whl,
# .llama; a warm machine keeps build-gpu). bf16 batch 1 twice (with the host's share a step), 64 in
# flight 1,024 / 1,024 (kaon-stats now carries decode_host_seconds: the engine thread's share of the
# decode steps), then the llama.cpp ratios (run40/vs_llama.sh).
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
C8=bench/configs/meta-llama__Llama-3.1-8B.json
for i in 1 2; do
    timeout 80 python3 bench/gpu_decode.py --config $C8 --tokens 256 --kaon build-gpu/kaon 2>&1 | grep -E "^decode|^copy" | tr '\n' ' '; echo
done
echo "== GEMV shapes alone (gpu_driver timings: o 4096 x 4096, down 4096 x 14336, gate/up, qkv, the LM head)"
timeout 60 build-gpu/gpu_driver timings 2>&1 | grep '"linear"' | grep '"n": 1,' | cut -c1-160
echo "== 64 in flight, 1,024 / 1,024"
timeout 200 python3 bench/gpu_throughput.py --kaon build-gpu/kaon --config $C8 --requests 64 --output 1024 2>&1 \
    | python3 -c "
import json, sys
for l in sys.stdin:
    if l.startswith('{'):
        r = json.loads(l); s = json.loads(r['stats'][0].split('kaon-stats: ', 1)[1]) if r.get('stats') else {}
        print(f\"{r['output_tok_s']:.0f} tok/s = {r['roofline_fraction'] * 100:.1f}% of {r['roofline_tok_s']:.0f}; \"
              f\"decode steps {s.get('decode_step_seconds')} s, host {s.get('decode_host_seconds')} s; \"
              f\"prefill steps {s.get('prefill_step_seconds')} s, host {s.get('prefill_host_seconds')} s\")
"
VS_LIMIT=250 bash tests/gpu/runs/run40/vs_llama.sh
