"""One kaon engine (its own thread runs the model) and the bookkeeping of its requests: submit,
drain outputs into vLLM-shaped results, abort. Shared by LLM and AsyncLLM."""
import ctypes as C
import itertools
import json
import os
from typing import Dict, List, Optional, Sequence

from . import _lib
from ._lib import lib
from .outputs import CompletionOutput, Logprob, RequestOutput
from .plugins import load_plugins
from .sampling_params import CSampling, SamplingParams

# vLLM engine argument -> how it maps (None: accepted only at its neutral value, checked below).
_NEUTRAL = {"dtype": ("auto",), "trust_remote_code": (False, True), "enforce_eager": (False, True),
            "tokenizer": (None,), "quantization": (None,), "disable_log_stats": (False, True),
           "skip_tokenizer_init": (False, True)}


def _engine_options(model: str, args: dict):
    o = _lib.EngineOptions()
    lib.kaon_engine_options_default(C.byref(o))
    keep = []  # encoded strings the struct points to

    def s(v):
        b = str(v).encode()
        keep.append(b)
        return b

    o.model = s(model)
    # vLLM's skip_tokenizer_init: token ids in and out only. A dummy:CONFIG model has no tokenizer.
    o.load_tokenizer = not args.get("skip_tokenizer_init", model.startswith("dummy:"))
    ints = {"max_model_len": 2, "max_num_seqs": 1, "max_num_batched_tokens": 1, "block_size": 1,
            "tensor_parallel_size": 1, "data_parallel_size": 1, "n_threads": 1}
    for name, value in args.items():
        if name in ints:
            if not isinstance(value, int) or isinstance(value, bool) or value < ints[name]:
                raise ValueError(f"{name} must be an integer >= {ints[name]}, got {value!r}")
            setattr(o, name, value)
        elif name == "device":
            if not isinstance(value, str) or not (value in ("cpu", "cuda", "noop") or value.startswith("cuda:")):
                raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {value!r}")
            o.device = s(value)
        elif name == "gpu_memory_utilization":
            if not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {value!r}")
            o.gpu_memory_utilization = value
        elif name == "kv_cache_memory_bytes":
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"kv_cache_memory_bytes must be a positive integer, got {value!r}")
            o.kv_cache_memory = value
        elif name == "kv_cache_dtype":
            if value not in ("auto", "bf16", "fp8", "fp8_e4m3"):
                raise ValueError(f"kv_cache_dtype must be auto, bf16, fp8 or fp8_e4m3, got {value!r}")
            o.kv_cache_dtype = s(value)
        elif name == "enable_prefix_caching":
            o.disable_prefix_caching = not value
        elif name == "enable_expert_parallel":
            o.enable_expert_parallel = bool(value)
        elif name == "speculative_config":
            if value is None:
                continue
            if not isinstance(value, dict) or not value.get("method"):
                raise ValueError("speculative_config must be a dict with 'method' (e.g. 'ngram')")
            sp = o.speculative
            for k, v in value.items():
                if k in ("method", "model", "oracle_file"):
                    setattr(sp, k, s(v))
                elif k in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "disable_by_batch_size"):
                    setattr(sp, k, int(v))
                else:
                    raise ValueError(f"speculative_config: unknown key {k!r}")
        elif name in _NEUTRAL:
            if value not in _NEUTRAL[name]:
                raise ValueError(f"{name}={value!r} is not supported by kaon (it reads the format from the model file)")
        elif name != "seed":
            raise TypeError(f"unknown engine argument {name!r}")
    return o, keep


class Tracker:
    """One submitted request: its handle and what it produced so far."""
    __slots__ = ("handle", "request_id", "prompt", "prompt_ids", "params", "ids", "texts", "lps",
                 "cum", "finish", "stop_reason", "prompt_lps", "cached", "finished", "error", "tag")

    def __init__(self, handle, request_id, prompt, prompt_ids, params):
        self.handle, self.request_id, self.prompt = handle, request_id, prompt
        self.prompt_ids, self.params = prompt_ids, params
        n = params.n
        self.ids = [[] for _ in range(n)]
        self.texts = [[] for _ in range(n)]
        self.lps = [[] if params.logprobs is not None else None for _ in range(n)]
        self.cum = [0.0] * n
        self.finish = [None] * n
        self.stop_reason = [None] * n
        self.prompt_lps = None
        self.cached = 0
        self.finished = False
        self.error = None


class Engine:
    def __init__(self, model: str, **engine_args):
        if not isinstance(model, str) or not model:
            raise ValueError("model must be the path of a GGUF file or a Hugging Face folder")
        if not model.startswith("dummy:") and not os.path.exists(model):
            raise FileNotFoundError(f"model not found: {model}")
        load_plugins()  # before the engine looks its architecture up
        opts, keep = _engine_options(model, engine_args)
        self._seed = engine_args.get("seed")
        if self._seed is not None and (not isinstance(self._seed, int) or self._seed < 0):
            raise ValueError(f"seed must be a non-negative integer, got {self._seed!r}")
        self._h = lib.kaon_engine_create(C.byref(opts))
        del keep
        if not self._h:
            raise RuntimeError(f"kaon: cannot create the engine: {_lib.last_error()}")
        info = _lib.EngineInfo()
        lib.kaon_engine_get_info(self._h, C.byref(info))
        self.max_model_len, self.vocab_size = info.max_model_len, info.vocab_size
        self.arch = info.arch.decode() if info.arch else None
        self._counter = itertools.count()
        self._token_text: Dict[int, str] = {}

    # ---- text ----
    def _need(self):
        if not self._h:
            raise RuntimeError("kaon: the engine is closed")
        return self._h

    def tokenize(self, text: str, add_special_tokens: bool = True) -> List[int]:
        b = text.encode("utf-8")
        ids, n = C.POINTER(C.c_int32)(), C.c_size_t()
        if lib.kaon_engine_tokenize(self._need(), b, len(b), add_special_tokens, C.byref(ids), C.byref(n)):
            raise ValueError(f"kaon: tokenize: {_lib.last_error()}")
        try:
            return ids[:n.value]
        finally:
            lib.kaon_free(ids)

    def detokenize(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        arr = (C.c_int32 * max(1, len(ids)))(*ids)
        text, n = C.c_void_p(), C.c_size_t()
        if lib.kaon_engine_detokenize(self._need(), arr, len(ids), skip_special_tokens, C.byref(text), C.byref(n)):
            raise ValueError(f"kaon: detokenize: {_lib.last_error()}")
        return _lib.take_bytes(text, n.value).decode("utf-8", "replace")

    def special_tokens(self) -> dict:
        st = _lib.SpecialTokens()
        stop = (C.c_int32 * 64)()
        if lib.kaon_engine_special_tokens(self._need(), C.byref(st), stop, 64):
            raise RuntimeError(f"kaon: {_lib.last_error()}")
        return {"bos_token_id": None if st.bos < 0 else st.bos, "eos_token_id": None if st.eos < 0 else st.eos,
                "stop_token_ids": list(stop[:min(st.n_stop, 64)])}

    def apply_chat_template(self, messages, add_generation_prompt=True, chat_template=None,
                            chat_template_kwargs=None) -> str:
        if not isinstance(messages, (list, tuple)) or not all(isinstance(m, dict) for m in messages):
            raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts")
        kw = json.dumps(chat_template_kwargs).encode() if chat_template_kwargs else None
        tmpl = chat_template.encode() if chat_template else None
        text, n = C.c_void_p(), C.c_size_t()
        if lib.kaon_engine_apply_chat_template(self._need(), json.dumps(list(messages)).encode(), kw, tmpl,
                                               add_generation_prompt, C.byref(text), C.byref(n)):
            raise ValueError(f"kaon: {_lib.last_error()}")
        return _lib.take_bytes(text, n.value).decode("utf-8", "replace")

    def token_text(self, tid: int) -> str:
        t = self._token_text.get(tid)
        if t is None:
            t = self._token_text[tid] = self.detokenize([tid], skip_special_tokens=False)
        return t

    # ---- requests ----
    def prompt_ids(self, prompt):
        """(text or None, ids) from a str, a list of ids, or vLLM's {"prompt"} / {"prompt_token_ids"}."""
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                prompt = list(prompt["prompt_token_ids"])
            elif "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("a dict prompt needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, str):
            return prompt, self.tokenize(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            if not prompt:
                raise ValueError("empty prompt")
            bad = [t for t in prompt if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})")
            return None, list(prompt)
        raise ValueError(f"a prompt must be a str, a list of token ids or a dict, got {type(prompt).__name__}")

    def submit(self, prompt, params: Optional[SamplingParams], request_id=None) -> Tracker:
        text, ids = self.prompt_ids(prompt)
        if params is None:
            params = SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be SamplingParams, got {type(params).__name__}")
        k = next(self._counter)
        seed = None if self._seed is None else (self._seed + k) % 2**64
        cs = CSampling(params, seed)
        arr = (C.c_int32 * len(ids))(*ids)
        h = lib.kaon_engine_submit(self._need(), arr, len(ids), C.byref(cs.struct))
        if not h:
            raise ValueError(f"kaon: request refused: {_lib.last_error()}")
        return Tracker(h, str(k) if request_id is None else str(request_id), text, ids, params)

    def drain(self, t: Tracker) -> bool:
        """Takes every queued output of t; True when something new came."""
        out, got = _lib.Output(), False
        while not t.finished and lib.kaon_request_next(t.handle, C.byref(out), 0) == 1:
            got = True
            i = out.index
            n = out.n_tokens
            if n:
                t.ids[i].extend(out.token_ids[:n])
                if out.logprobs:
                    self._logprobs(t, i, out.logprobs, n)
            if out.text_len:
                t.texts[i].append(C.string_at(out.text, out.text_len).decode("utf-8", "replace"))
            if out.prompt_logprobs and t.prompt_lps is None:
                t.prompt_lps = [None] + [self._lp_dict(out.prompt_logprobs[p]) for p in range(1, out.n_prompt_logprobs)]
            if out.finish:
                t.finish[i] = _lib.FINISH.get(out.finish, "error")
                if out.stop_reason:
                    t.stop_reason[i] = out.stop_reason.decode("utf-8", "replace")
                elif out.stop_token >= 0 and out.stop_token in (t.params.stop_token_ids or ()):
                    t.stop_reason[i] = out.stop_token
                if out.error and not t.error:
                    t.error = out.error.decode("utf-8", "replace")
            t.cached = out.cached_tokens
            if out.finished:
                t.finished = True
        return got

    def _lp_dict(self, lp):
        d = {}
        for r in range(lp.n_top):
            x = lp.top[r]
            d[x.token] = Logprob(x.logprob, r + 1, self.token_text(x.token))
        if lp.token not in d:
            d[lp.token] = Logprob(lp.logprob, None, self.token_text(lp.token))
        # The sampled token first, as vLLM lists it.
        return {lp.token: d[lp.token], **{k: v for k, v in d.items() if k != lp.token}}

    def _logprobs(self, t, i, lps, n):
        for k in range(n):
            t.lps[i].append(self._lp_dict(lps[k]))
            t.cum[i] += lps[k].logprob

    def result(self, t: Tracker) -> RequestOutput:
        outs = [CompletionOutput(index=i, text="".join(t.texts[i]), token_ids=list(t.ids[i]),
                                 cumulative_logprob=t.cum[i] if t.lps[i] is not None else None,
                                 logprobs=list(t.lps[i]) if t.lps[i] is not None else None,
                                 finish_reason=t.finish[i], stop_reason=t.stop_reason[i])
                for i in range(len(t.ids))]
        return RequestOutput(request_id=t.request_id, prompt=t.prompt, prompt_token_ids=t.prompt_ids,
                             prompt_logprobs=t.prompt_lps, outputs=outs, finished=t.finished,
                             num_cached_tokens=t.cached)

    def release(self, t: Tracker):
        """Aborts t if it still runs and frees its handle (once)."""
        if t.handle:
            lib.kaon_request_free(t.handle)
            t.handle = None

    def close(self):
        if self._h:
            lib.kaon_engine_destroy(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
