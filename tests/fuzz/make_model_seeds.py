"""Writes the seed corpus of fuzz_model_gguf: the smallest GGUF models of each architecture
family kaon loads (dense Llama/Qwen2/Qwen3/Mistral, Mixtral, Qwen3-MoE, Qwen2-MoE), in F32 and
in Q8_0/Q4_0, so the fuzzer starts from files that load and run.
    python3 tests/fuzz/make_model_seeds.py  (needs numpy and gguf; run from the repository)"""
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "ref"))

from gguf import GGMLQuantizationType as QT  # noqa: E402
from moe_models import make_moe_config, make_moe_weights, save_moe_gguf  # noqa: E402
from tiny_models import make_config, make_weights, save_gguf  # noqa: E402

SMALL = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, vocab_size=40, max_position_embeddings=64)


def small(cfg):
    cfg.update(SMALL)
    cfg.pop("head_dim", None)
    if "moe_intermediate_size" in cfg:
        cfg["moe_intermediate_size"] = 32
    if "shared_expert_intermediate_size" in cfg:
        cfg["shared_expert_intermediate_size"] = 32
    for k in ("num_experts", "num_local_experts"):
        if k in cfg:
            cfg[k] = 4
    cfg["num_experts_per_tok"] = 2
    if "mlp_only_layers" in cfg:
        cfg["mlp_only_layers"] = [0] if cfg["architectures"][0] == "Qwen3MoeForCausalLM" else []
    if cfg.get("rope_scaling"):
        cfg["rope_scaling"]["original_max_position_embeddings"] = 16
    return cfg


def main():
    out = HERE / "seeds" / "model_gguf"
    out.mkdir(parents=True, exist_ok=True)
    for arch in ("llama", "qwen2", "qwen3", "mistral"):
        cfg = small(make_config(arch))
        save_gguf(out / f"{arch}.gguf", cfg, make_weights(cfg, seed=1))
    for arch in ("mixtral", "qwen3moe", "qwen2moe"):
        cfg = small(make_moe_config(arch))
        w = make_moe_weights(cfg, seed=2)
        save_moe_gguf(out / f"{arch}.gguf", cfg, w)
        save_moe_gguf(out / f"{arch}-q8_0.gguf", cfg, w, QT.Q8_0)
    cfg = small(make_moe_config("mixtral"))
    save_moe_gguf(out / "mixtral-q4_0.gguf", cfg, make_moe_weights(cfg, seed=3), QT.Q4_0)
    for p in sorted(out.iterdir()):
        print(p.name, p.stat().st_size)


if __name__ == "__main__":
    main()
