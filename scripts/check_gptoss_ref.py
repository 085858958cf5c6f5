"""Once, by hand (needs torch + transformers, e.g. /tmp/tvenv/bin/python): tests/ref/gptoss_ref.py's
numpy port against transformers' GptOssForCausalLM (float64, eager attention) on the tests' tiny
checkpoint. Prints the relative logit error."""
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import GptOssConfig, GptOssForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "ref"))
from gptoss_ref import CONFIG, forward, make_weights  # noqa: E402
from test_gptoss_ref import IDS  # noqa: E402

cfg = {k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type")}
hf = GptOssForCausalLM(GptOssConfig(**cfg, attn_implementation="eager", experts_implementation="eager")).double().eval()
w = make_weights()
sd = hf.state_dict()
missing = set(sd) - set(w)
assert not missing, missing
hf.load_state_dict({k: torch.tensor(np.asarray(v, np.float64)) for k, v in w.items()}, strict=True)
with torch.no_grad():
    theirs = hf(torch.tensor([IDS])).logits[0].numpy()
ours = forward(CONFIG, w, IDS)
print("rope:", hf.model.rotary_emb.rope_type, "attention_scaling", hf.model.rotary_emb.attention_scaling)
print("relative logit error numpy port vs transformers: %.2e" % (np.linalg.norm(ours - theirs) / np.linalg.norm(theirs)))
