"""SamplingParams with vLLM's field names, checked here and mapped onto kaon_sampling.

Every value kaon cannot honour raises ValueError naming the field, rather than being ignored.
"""
import ctypes as C
from dataclasses import dataclass, fields
from typing import Dict, List, Optional, Union

from . import _lib

_INT32_MAX = 2**31 - 1


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                      # 0 or -1: off
    min_p: float = 0.0
    seed: Optional[int] = None
    max_tokens: Optional[int] = 16      # None: until the context is full
    min_tokens: int = 0
    stop: Union[None, str, List[str]] = None
    stop_token_ids: Optional[List[int]] = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: Optional[int] = None      # k: the sampled token's logprob and the top k
    prompt_logprobs: Optional[int] = None
    logit_bias: Optional[Dict[int, float]] = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # vLLM fields kaon does not implement: only their neutral values are accepted.
    best_of: Optional[int] = None
    bad_words: Optional[List[str]] = None
    allowed_token_ids: Optional[List[int]] = None
    logits_processors: Optional[list] = None
    truncate_prompt_tokens: Optional[int] = None
    spaces_between_special_tokens: bool = True
    detokenize: bool = True

    def __post_init__(self):
        self._check()

    def _check(self):
        def bad(name, why):
            raise ValueError(f"SamplingParams.{name} {why}, got {getattr(self, name)!r}")

        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        if not is_int(self.n) or self.n < 1:
            bad("n", "must be an integer >= 1")
        if self.best_of not in (None, self.n):
            bad("best_of", "is not supported by kaon (only None or n)")
        for name, neutral in (("bad_words", None), ("allowed_token_ids", None),
                              ("logits_processors", None), ("truncate_prompt_tokens", None),
                              ("spaces_between_special_tokens", True), ("detokenize", True)):
            if getattr(self, name) not in (neutral, [] if neutral is None else neutral):
                bad(name, f"is not supported by kaon (only {neutral!r})")
        if not isinstance(self.temperature, (int, float)) or not 0 <= self.temperature <= 100:
            bad("temperature", "must be a number in [0, 100]")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            bad("top_p", "must be in (0, 1]")
        if not is_int(self.top_k) or self.top_k < -1:
            bad("top_k", "must be an integer: -1 or 0 (off) or >= 1")
        if not isinstance(self.min_p, (int, float)) or not 0 <= self.min_p <= 1:
            bad("min_p", "must be in [0, 1]")
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed < 2**64):
            bad("seed", "must be None or an integer in [0, 2**64)")
        if self.max_tokens is not None and (not is_int(self.max_tokens) or not 1 <= self.max_tokens <= _INT32_MAX):
            bad("max_tokens", "must be None or an integer >= 1")
        if not is_int(self.min_tokens) or self.min_tokens < 0:
            bad("min_tokens", "must be an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"must be at most max_tokens ({self.max_tokens})")
        if self.stop is not None and not isinstance(self.stop, str) and not (
                isinstance(self.stop, (list, tuple)) and all(isinstance(s, str) and s for s in self.stop)):
            bad("stop", "must be None, a string or a list of non-empty strings")
        if isinstance(self.stop, str) and not self.stop:
            bad("stop", "must not be empty")
        if self.stop_token_ids is not None and not (
                isinstance(self.stop_token_ids, (list, tuple)) and all(is_int(t) and 0 <= t <= _INT32_MAX for t in self.stop_token_ids)):
            bad("stop_token_ids", "must be a list of token ids")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not -2 <= v <= 2:
                bad(name, "must be in [-2, 2]")
        if not isinstance(self.repetition_penalty, (int, float)) or not 0 < self.repetition_penalty <= 100:
            bad("repetition_penalty", "must be in (0, 100]")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (not is_int(v) or not 0 <= v <= 20):
                bad(name, "must be None or an integer in [0, 20]")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict) or not all(
                    is_int(k) and 0 <= k <= _INT32_MAX and isinstance(v, (int, float)) and -100 <= v <= 100
                    for k, v in self.logit_bias.items()):
                bad("logit_bias", "must be a dict {token_id: bias in [-100, 100]}")
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                bad(name, "must be a bool")

    def stop_list(self) -> List[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def clone(self, **changes) -> "SamplingParams":
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d.update(changes)
        return SamplingParams(**d)


class CSampling:
    """A kaon_sampling and the arrays it points to (kept alive as long as this object)."""

    def __init__(self, p: SamplingParams, seed: Optional[int] = None):
        p._check()  # fields may have been changed since construction
        s = _lib.Sampling()
        _lib.lib.kaon_sampling_default(C.byref(s))
        s.n = p.n
        s.temperature = p.temperature
        s.top_p = p.top_p
        s.top_k = 0 if p.top_k in (-1, 0) else p.top_k
        s.min_p = p.min_p
        s.repetition_penalty = p.repetition_penalty
        s.presence_penalty = p.presence_penalty
        s.frequency_penalty = p.frequency_penalty
        seed = p.seed if p.seed is not None else seed
        if seed is not None:
            s.has_seed, s.seed = True, seed
        s.max_tokens = -1 if p.max_tokens is None else p.max_tokens
        s.min_tokens = p.min_tokens
        s.ignore_eos = p.ignore_eos
        stops = [x.encode() for x in p.stop_list()]
        self._stop = (C.c_char_p * max(1, len(stops)))(*stops)
        s.stop, s.n_stop = self._stop, len(stops)
        s.include_stop_str_in_output = p.include_stop_str_in_output
        ids = list(p.stop_token_ids or [])
        self._stop_ids = (C.c_int32 * max(1, len(ids)))(*ids)
        s.stop_token_ids, s.n_stop_token_ids = self._stop_ids, len(ids)
        bias = list((p.logit_bias or {}).items())
        self._bias = (_lib.LogitBias * max(1, len(bias)))(*[_lib.LogitBias(k, v) for k, v in bias])
        s.logit_bias, s.n_logit_bias = self._bias, len(bias)
        s.logprobs = -1 if p.logprobs is None else p.logprobs
        s.prompt_logprobs = -1 if p.prompt_logprobs is None else p.prompt_logprobs
        s.skip_special_tokens = p.skip_special_tokens
        self.struct = s
