"""LLM: offline generation like vLLM's LLM class, over one kaon engine.

The engine runs in its own C thread; this thread only submits requests and waits on a
waitset (GIL released). A KeyboardInterrupt (or any exception) while waiting aborts the call's
requests, whose KV blocks return to the pool at once, and the LLM stays usable.
"""
import ctypes as C
from typing import Iterator, List, Optional, Sequence, Union

from ._lib import lib
from .engine import Engine, Tracker
from .outputs import RequestOutput
from .sampling_params import SamplingParams

# How long one wait may block: a signal handler (Ctrl-C) runs at the latest this often.
_WAIT_MS = 100


def _as_list(prompts):
    """A batch of prompts, and whether the caller gave a single one."""
    if isinstance(prompts, (str, dict)):
        return [prompts], True
    if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)], True  # one prompt of token ids
    if isinstance(prompts, (list, tuple)):
        return list(prompts), False
    raise ValueError(f"prompts must be a str, a list of str, token ids or a list of them, got {type(prompts).__name__}")


def _params_for(params, n):
    if params is None or isinstance(params, SamplingParams):
        return [params] * n
    if isinstance(params, (list, tuple)):
        if len(params) != n:
            raise ValueError(f"{len(params)} sampling params for {n} prompts")
        return list(params)
    raise TypeError(f"sampling_params must be SamplingParams or a list of them, got {type(params).__name__}")


class LLM:
    """LLM(model, **engine_args): model is a GGUF file or a Hugging Face folder; engine_args take
    vLLM's names (max_model_len, max_num_seqs, max_num_batched_tokens, seed, device, dtype="auto",
    tensor_parallel_size, enable_expert_parallel, gpu_memory_utilization, kv_cache_dtype,
    kv_cache_memory_bytes, enable_prefix_caching, block_size, speculative_config) plus n_threads
    (CPU)."""

    def __init__(self, model: str, **engine_args):
        self.engine = Engine(model, **engine_args)

    # ---- vLLM's helpers ----
    def get_tokenizer(self):
        return _Tokenizer(self.engine)

    def default_sampling_params(self) -> SamplingParams:
        """The model's generation_config.json values over SamplingParams' defaults."""
        from . import _lib
        s = _lib.Sampling()
        lib.kaon_engine_sampling_defaults(self.engine._need(), C.byref(s))
        return SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p,
                              repetition_penalty=s.repetition_penalty,
                              max_tokens=s.max_tokens if s.max_tokens > 0 else 16)

    # ---- generation ----
    def _submit_all(self, prompts, sampling_params) -> List[Tracker]:
        batch, _ = _as_list(prompts)
        params = _params_for(sampling_params, len(batch))
        params = [p if p is not None else self.default_sampling_params() for p in params]
        ts = []
        try:
            for p, sp in zip(batch, params):
                ts.append(self.engine.submit(p, sp))
        except BaseException:
            for t in ts:
                self.engine.release(t)
            raise
        return ts

    def _events(self, ts: List[Tracker]):
        """Waits on the requests of ts until all finished; yields a tracker whenever it drained
        something new. Freed as they finish; the rest aborted if this stops early."""
        ws = lib.kaon_waitset_create()
        if not ws:
            raise MemoryError("kaon: waitset")
        live = {}
        tags = (C.c_uint64 * 256)()
        try:
            for k, t in enumerate(ts):
                live[k] = t
                lib.kaon_waitset_add(ws, t.handle, k)
            while live:
                got = lib.kaon_waitset_wait(ws, tags, 256, _WAIT_MS)
                for j in range(got):
                    t = live.get(tags[j])
                    if t is None or not self.engine.drain(t):
                        continue
                    if t.finished:
                        lib.kaon_waitset_remove(ws, t.handle)
                        self.engine.release(t)
                        del live[tags[j]]
                        if t.error:
                            raise RuntimeError(f"kaon: request {t.request_id} failed: {t.error}")
                    yield t
        finally:
            # Interrupted (KeyboardInterrupt, an error, a closed generator): the rest are
            # aborted; freeing a running request aborts it and returns its KV blocks.
            for t in live.values():
                lib.kaon_waitset_remove(ws, t.handle)
                self.engine.release(t)
            lib.kaon_waitset_destroy(ws)

    def generate(self, prompts, sampling_params: Union[None, SamplingParams, Sequence[SamplingParams]] = None,
                 use_tqdm: bool = False) -> List[RequestOutput]:
        """Completions of prompts (a str, a list of str, a list of token ids, a list of such lists, or
        vLLM's {"prompt"} / {"prompt_token_ids"} dicts), in the order given."""
        ts = self._submit_all(prompts, sampling_params)
        for _ in self._events(ts):
            pass
        return [self.engine.result(t) for t in ts]

    def generate_stream(self, prompts, sampling_params=None) -> Iterator[RequestOutput]:
        """Like generate, but yields a RequestOutput (cumulative so far) whenever one of the
        requests produced something; a request's last one has finished=True. Closing the iterator
        early aborts what still runs."""
        ts = self._submit_all(prompts, sampling_params)
        for t in self._events(ts):
            yield self.engine.result(t)

    def chat(self, messages, sampling_params=None, chat_template: Optional[str] = None,
             add_generation_prompt: bool = True, chat_template_kwargs: Optional[dict] = None,
             use_tqdm: bool = False) -> List[RequestOutput]:
        """One conversation (a list of {"role", "content"} dicts) or a list of them, rendered with
        the model's chat template (or chat_template) as kaon serve and kaon chat render it."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = []
        for conv in convs:
            text = self.engine.apply_chat_template(conv, add_generation_prompt, chat_template, chat_template_kwargs)
            prompts.append((text, self.engine.tokenize(text, add_special_tokens=False)))
        outs = self.generate([ids for _, ids in prompts], sampling_params)
        for o, (text, _) in zip(outs, prompts):
            o.prompt = text
        return outs

    def close(self):
        self.engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Tokenizer:
    """The engine's tokenizer with the few methods callers of vLLM's get_tokenizer() use."""

    def __init__(self, engine: Engine):
        self._e = engine
        sp = engine.special_tokens()
        self.bos_token_id, self.eos_token_id = sp["bos_token_id"], sp["eos_token_id"]
        self.stop_token_ids = sp["stop_token_ids"]

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        return self._e.tokenize(text, add_special_tokens)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._e.detokenize(list(ids), skip_special_tokens)

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False, chat_template=None, **kwargs):
        text = self._e.apply_chat_template(messages, add_generation_prompt, chat_template, kwargs or None)
        return self._e.tokenize(text, add_special_tokens=False) if tokenize else text
