"""What the transformers comparisons test_gemma3_hf.py and test_deepseek_hf.py share: kaon's CPU
backend on a saved folder; a random transformers model (built, converted to bf16 as
from_pretrained leaves one, run for logits and greedy ids) and its saved files read back; the
f32 / bf16 runs of a tiny model with kaon's CPU results against them; kaon on CUDA (through
the GPU driver) against transformers in bf16 on the GPU."""
import json
import sys

import numpy as np
import pytest

from test_gpu import BUILD, REPO, agreement, kaon_logits as driver_logits, record, rel

sys.path.insert(0, str(REPO / "tests" / "ref"))
import kaon_cli  # noqa: E402
from logit_checks import first_divergence, greedy  # noqa: E402

SEED = 1234


# ---- kaon's CPU backend ------------------------------------------------------------------------

def kaon_exe():
    exe = BUILD / "kaon"
    if not exe.exists():
        pytest.fail(f"{exe} not found: build kaon (tests/gpu/run_all.sh build) or set KAON_BUILD")
    return exe


def kaon_cpu_logits(folder, ids, tmp, mode="prefill"):
    return kaon_cli.logits(kaon_exe(), folder, ids, tmp, mode, threads=8)


def kaon_cpu_greedy(folder, ids, n):
    return kaon_cli.greedy(kaon_exe(), folder, ids, n, threads=8)


# ---- transformers ------------------------------------------------------------------------------

def new_model(hcfg, seed, device="cpu"):
    """A transformers model of config hcfg (eager attention) on device, with transformers' own
    random init after torch.manual_seed(seed)."""
    import torch
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(hcfg, attn_implementation="eager")


def to_dtype(model, dtype, keep_f32=()):
    """model.to(dtype) as from_pretrained(dtype=...) leaves a model: the RoPE tables (computed
    in f32, not weights) and the buffers whose names end with one of keep_f32 stay f32.
    Module.to() alone would round them as well, and a bf16 inv_freq turns position p's angles
    by up to p * 2^-9 (errors growing with p)."""
    keep_f32 = tuple(keep_f32)
    keep = {n: b.detach().clone() for n, b in model.named_buffers() if "inv_freq" in n or n.endswith(keep_f32)}
    model = model.to(dtype)
    for n, b in keep.items():
        parent, _, attr = n.rpartition(".")
        model.get_submodule(parent)._buffers[attr] = b
    return model


def hf_logits(model, ids):
    import torch
    dev = next(model.parameters()).device
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids], device=dev)).logits[0].float().cpu().numpy().astype(np.float64)


def hf_greedy(model, ids, n):
    """Greedy continuation through transformers' own cache (sliding layers, the MLA latent
    cache): n ids and the top-2 margin at each step."""
    import torch
    dev = next(model.parameters()).device
    out, margins = [], []
    with torch.no_grad():
        res = model(input_ids=torch.tensor([ids], device=dev), use_cache=True)
        for i in range(n):
            lg = res.logits[0, -1].double().cpu().numpy()
            srt = np.sort(lg)
            out.append(int(lg.argmax()))
            margins.append(float(srt[-1] - srt[-2]))
            if i + 1 < n:
                res = model(input_ids=torch.tensor([[out[-1]]], device=dev), past_key_values=res.past_key_values,
                            use_cache=True)
    return out, margins


def load_saved(folder):
    """config.json as written and the weights as float32 numpy (bf16 included), names as
    stored."""
    from safetensors.torch import load_file
    cfg = json.loads((folder / "config.json").read_text())
    w = {}
    for f in sorted(folder.glob("*.safetensors")):
        w.update({k: v.float().numpy() for k, v in load_file(str(f)).items()})
    return cfg, w


# ---- (a) a tiny model in f32 and bf16: transformers, then kaon's CPU backend ---------------------

class HFRuns:
    """transformers on a tiny f32 model and on its bf16 copy to_bf16(model), each saved first by
    save(model, folder, dtype name) in f32_folder / bf16_folder: logits of ids with the f32
    weights (f32), with the bf16 weights computing in bf16 (bf16) and in f32 (bf16w_f32); the
    greedy continuation of prompt by n ids with the f32 weights and its top-2 margins (greedy,
    margins). The numpy reference and kaon's CPU backend are then measured against them."""

    def __init__(self, model, to_bf16, save, f32_folder, bf16_folder, ids, prompt, n):
        self.f32_folder, self.bf16_folder, self.ids, self.prompt, self.n = f32_folder, bf16_folder, ids, prompt, n
        save(model, f32_folder, "float32")
        self.f32 = hf_logits(model, ids)
        self.greedy, self.margins = hf_greedy(model, prompt, n)
        model_b16 = to_bf16(model)
        save(model_b16, bf16_folder, "bfloat16")
        self.bf16 = hf_logits(model_b16, ids)                # bf16 weights, bf16 compute
        self.bf16w_f32 = hf_logits(model_b16.float(), ids)   # bf16 weights, f32 compute

    def reference_vs_hf(self, ref, ref_bf16w, greedy_ref=None):
        """The numpy reference of the saved f32 files (ref) against transformers in f32, that of
        the bf16 files (ref_bf16w) against transformers with the bf16 weights in f32; the greedy
        ids of greedy_ref (default ref) and where they first leave transformers'."""
        ref.reset()
        ref_bf16w.reset()
        res = {"ref_vs_hf_f32": rel(ref.forward(self.ids), self.f32),
               "ref_bf16w_vs_hf_bf16w_f32": rel(ref_bf16w.forward(self.ids), self.bf16w_f32)}
        ref_greedy, _ = greedy(greedy_ref or ref, self.prompt, self.n)
        res["ref_greedy_first_divergence"] = first_divergence(ref_greedy, self.greedy)
        res["ref_greedy"] = ref_greedy
        return res

    def kaon_cpu_vs_hf(self, tmp):
        """kaon's CPU backend on the saved folders: the relative errors of its f32 prefill and
        decode logits, of its bf16 logits against transformers in bf16 and with the bf16
        weights in f32; its greedy ids and where they first leave transformers'."""
        k32 = kaon_cpu_logits(self.f32_folder, self.ids, tmp)
        res = {"kaon_f32_vs_hf_f32": rel(k32, self.f32),
               "kaon_f32_decode_vs_hf_f32": rel(kaon_cpu_logits(self.f32_folder, self.ids, tmp, "decode"), self.f32)}
        kb = kaon_cpu_logits(self.bf16_folder, self.ids, tmp)
        res["kaon_bf16_vs_hf_bf16"] = rel(kb, self.bf16)
        res["kaon_bf16_vs_hf_bf16w_f32"] = rel(kb, self.bf16w_f32)
        got = kaon_cpu_greedy(self.f32_folder, self.prompt, self.n)
        res["kaon_greedy_first_divergence"] = first_divergence(got, self.greedy)
        res["hf_greedy"], res["kaon_greedy"] = self.greedy, got
        return res


def assert_greedy_near_ties(res, margins):
    """The reference's and kaon's greedy ids may only leave transformers' where its top two
    were within 1e-3."""
    for key in ("ref_greedy_first_divergence", "kaon_greedy_first_divergence"):
        i = res[key]
        assert i is None or margins[i] < 1e-3, (key, i, margins[i])


# ---- (b) kaon on CUDA against transformers in bf16 on the GPU -----------------------------------

def rel_by_pos(a, b, edges):
    """rel over the position ranges from each edge to the next (the last to len(a)), keyed
    "start-end"; empty ranges left out."""
    q = list(edges) + [len(a)]
    return {f"{a0}-{a1}": rel(a[a0:a1], b[a0:a1]) for a0, a1 in zip(q, q[1:]) if a1 > a0}


def cuda_vs_hf(record_as, name, folder, model, ids, tmp, chunks, edges, cpu=None):
    """kaon on CUDA (the GPU driver, one run per {mode: chunk size} of chunks) against
    transformers' logits of ids with the bf16 model (then made fp32: build a new one for more
    runs): per mode the relative error, top-1 agreement where transformers' top-2 margin > 0.1
    and, past 64 tokens, the error by position (edges). With cpu, kaon's CPU backend too (f32
    math on the same bf16 weights) against transformers in fp32, cpu(kaon's logits, fp32
    logits, model, ids) adding its own entries. Recorded as record_as, printed, returned."""
    import torch
    V = model.config.vocab_size
    ref = hf_logits(model, ids)
    ref32 = hf_logits(model.float(), ids)
    torch.cuda.empty_cache()
    res = {"hf_bf16_vs_fp32": rel(ref, ref32), "n_tokens": len(ids)}
    if cpu:
        kc = kaon_cpu_logits(folder, ids, tmp)
        res["kaon_cpu_vs_hf_fp32"] = rel(kc, ref32)
        res.update(cpu(kc, ref32, model, ids))
        del kc
    for mode, chunk in chunks.items():
        k = driver_logits(folder, "cuda", chunk, ids, V, tmp)
        (tmp / f"k_cuda_{chunk}.f32").unlink(missing_ok=True)  # up to 600 x 262144 floats
        a, n_sel = agreement(k, ref)
        res[mode] = dict(rel_err=rel(k, ref), rel_err_vs_fp32=rel(k, ref32), top1=a, positions=n_sel)
        if len(ids) > 64:  # where the error grows: by position
            res[mode]["rel_err_by_pos"] = rel_by_pos(k, ref, edges)
        del k
    record(record_as, model=name, **res)
    print(name, json.dumps(res))
    return res


def assert_cuda_close(res, chunks):
    """Each CUDA run within relative error 2e-2 of transformers in bf16, top-1 agreement >= 99%."""
    for mode in chunks:
        assert res[mode]["rel_err"] <= 2e-2, (mode, res[mode])
        assert res[mode]["top1"] >= 0.99, (mode, res[mode])
