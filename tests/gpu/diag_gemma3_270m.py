"""Diagnostic (GPU machine, transformers 5.17): a 2-layer model of the google/gemma-3-270m shape with
every parameter random (std 0.02), saved in f32: how transformers reads the config (RoPE tables per
layer type), what `kaon info` makes of the folder, and kaon's CPU logits against HF's by position.
    python3 tests/gpu/diag_gemma3_270m.py   (after tests/gpu/run_all.sh build)"""
import json, sys, subprocess, numpy as np, torch
sys.path.insert(0, "tests/gpu"); sys.path.insert(0, "tests/ref")
from transformers import Gemma3TextConfig, AutoModelForCausalLM
cfg = json.loads(open("bench/configs/google__gemma-3-270m.json").read())
cfg["num_hidden_layers"] = 2; cfg["layer_types"] = cfg["layer_types"][:2]
c = Gemma3TextConfig.from_dict(cfg)
print("rope_parameters:", getattr(c, "rope_parameters", None))
print("layer_types:", c.layer_types[:6], "sliding_window", c.sliding_window)
torch.manual_seed(0)
m = AutoModelForCausalLM.from_config(c, attn_implementation="eager").float()
for n, p in m.named_parameters():
    torch.nn.init.normal_(p, std=0.02)
m.save_pretrained("/tmp/g2")
print("saved rope:", {k: v for k, v in json.load(open("/tmp/g2/config.json")).items() if "rope" in k or k in ("layer_types",)})
print("attn impl:", m.config._attn_implementation)
for i, l in enumerate(m.model.layers):
    a = l.self_attn
    print(i, getattr(a, "layer_type", None), getattr(a, "sliding_window", None), getattr(a, "scaling", None))
print([n for n in dir(m.model) if "rotary" in n])
for n in dir(m.model):
    if "rotary" in n:
        r = getattr(m.model, n)
        print(n, type(r).__name__, {k: (v.shape if hasattr(v, "shape") else v) for k, v in vars(r).items() if not k.startswith("_")})
        for k, v in r.named_buffers(): print("  buf", k, v.flatten()[:4].tolist(), v.flatten()[-2:].tolist())
ids = [2] + list(range(1000, 1063))
with torch.no_grad():
    ref = m(torch.tensor([ids])).logits[0].numpy()
subprocess.run(["build-gpu/kaon", "info", "/tmp/g2"], check=False)
subprocess.run(["build-gpu/kaon", "logits", "-m", "/tmp/g2", "--prompt-ids", ",".join(map(str, ids)), "-o", "/tmp/k.f32", "--threads", "8"], check=True)
k = np.fromfile("/tmp/k.f32", np.float32).reshape(len(ids), -1)
for a0, a1 in [(0, 1), (1, 2), (2, 8), (8, 64)]:
    print(a0, a1, float(np.linalg.norm(k[a0:a1] - ref[a0:a1]) / np.linalg.norm(ref[a0:a1])))
