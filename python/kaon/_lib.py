"""ctypes mirror of include/kaon.h and the loaded libkaon.so.0.

ctypes releases the GIL for every foreign call, so other Python threads run while the engine
works. The mirrored structs are checked against the library's own sizes (kaon_struct_size) at
import: a library built from another kaon.h fails here, not with corrupt memory later.
"""
import ctypes as C
import os

SONAME = "libkaon.so.0"

c_int, c_int32, c_float, c_double, c_bool = C.c_int, C.c_int32, C.c_float, C.c_double, C.c_bool
c_char_p, c_size_t, c_uint64, c_void_p = C.c_char_p, C.c_size_t, C.c_uint64, C.c_void_p


class SpeculativeOptions(C.Structure):
    _fields_ = [("method", c_char_p), ("num_speculative_tokens", c_int),
                ("prompt_lookup_min", c_int), ("prompt_lookup_max", c_int),
                ("disable_by_batch_size", c_int), ("oracle_file", c_char_p), ("model", c_char_p),
                ("force_accept", c_bool)]


class EngineOptions(C.Structure):
    _fields_ = [("model", c_char_p), ("device", c_char_p), ("n_threads", c_int),
                ("tensor_parallel_size", c_int), ("max_num_seqs", c_int),
                ("max_num_batched_tokens", c_int), ("max_logit_rows", c_int),
                ("max_model_len", c_int), ("kv_cache_memory", c_size_t),
                ("gpu_memory_utilization", c_double), ("block_size", c_int),
                ("data_parallel_size", c_int),
                ("kv_cache_dtype", c_char_p), ("disable_prefix_caching", c_bool),
                ("load_tokenizer", c_bool), ("expert_stats", c_bool),
                ("enable_expert_parallel", c_bool),
                ("speculative", SpeculativeOptions)]


class LogitBias(C.Structure):
    _fields_ = [("token", c_int32), ("bias", c_float)]


class Sampling(C.Structure):
    _fields_ = [("n", c_int), ("temperature", c_float), ("top_k", c_int), ("top_p", c_float),
                ("min_p", c_float), ("repetition_penalty", c_float),
                ("presence_penalty", c_float), ("frequency_penalty", c_float),
                ("logit_bias", C.POINTER(LogitBias)), ("n_logit_bias", c_int),
                ("has_seed", c_bool), ("seed", c_uint64), ("max_tokens", c_int),
                ("min_tokens", c_int), ("ignore_eos", c_bool),
                ("stop", C.POINTER(c_char_p)), ("n_stop", c_int),
                ("include_stop_str_in_output", c_bool),
                ("stop_token_ids", C.POINTER(c_int32)), ("n_stop_token_ids", c_int),
                ("logprobs", c_int), ("prompt_logprobs", c_int), ("prompt_logits", c_bool),
                ("skip_special_tokens", c_bool), ("priority", c_int),
                ("constraint", c_void_p), ("constraint_state", c_void_p)]


class TopLogprob(C.Structure):
    _fields_ = [("token", c_int32), ("logprob", c_float)]


class TokenLogprob(C.Structure):
    _fields_ = [("token", c_int32), ("logprob", c_float), ("n_top", c_int),
                ("top", C.POINTER(TopLogprob))]


class Output(C.Structure):
    _fields_ = [("index", c_int), ("token_ids", C.POINTER(c_int32)), ("n_tokens", c_int),
                ("text", c_void_p), ("text_len", c_size_t),
                ("logprobs", C.POINTER(TokenLogprob)),
                ("prompt_logprobs", C.POINTER(TokenLogprob)), ("n_prompt_logprobs", c_int),
                ("prompt_logits", C.POINTER(c_float)), ("n_prompt_logits", c_int),
                ("finish", c_int), ("stop_reason", c_char_p), ("stop_token", c_int32),
                ("finished", c_bool), ("error", c_char_p), ("prompt_tokens", c_int),
                ("completion_tokens", c_int), ("cached_tokens", c_int),
                ("queue_time", c_double), ("first_token_time", c_double)]


class EngineInfo(C.Structure):
    _fields_ = [("model_path", c_char_p), ("arch", c_char_p), ("vocab_size", c_int),
                ("max_model_len", c_int), ("block_size", c_int), ("kv_blocks", c_int),
                ("kv_cache_dtype", c_char_p), ("kv_bytes_per_token", c_size_t)]


class SpecialTokens(C.Structure):
    _fields_ = [("bos", c_int32), ("eos", c_int32), ("n_stop", c_int)]


FINISH = {0: None, 1: "stop", 2: "length", 3: "abort", 4: "error"}

_MIRRORED = {"kaon_engine_options": EngineOptions, "kaon_speculative_options": SpeculativeOptions,
             "kaon_sampling": Sampling, "kaon_logit_bias": LogitBias, "kaon_output": Output,
             "kaon_token_logprob": TokenLogprob, "kaon_top_logprob": TopLogprob,
             "kaon_engine_info": EngineInfo, "kaon_special_tokens": SpecialTokens}

P = C.POINTER
_SIGNATURES = {
    "kaon_last_error": (c_char_p, []),
    "kaon_version": (c_char_p, []),
    "kaon_struct_size": (c_size_t, [c_char_p]),
    "kaon_free": (None, [c_void_p]),
    "kaon_engine_options_default": (None, [P(EngineOptions)]),
    "kaon_engine_create": (c_void_p, [P(EngineOptions)]),
    "kaon_engine_destroy": (None, [c_void_p]),
    "kaon_engine_get_info": (None, [c_void_p, P(EngineInfo)]),
    "kaon_engine_sampling_defaults": (None, [c_void_p, P(Sampling)]),
    "kaon_sampling_default": (None, [P(Sampling)]),
    "kaon_engine_submit": (c_void_p, [c_void_p, P(c_int32), c_int, P(Sampling)]),
    "kaon_request_id": (c_uint64, [c_void_p]),
    "kaon_request_next": (c_int, [c_void_p, P(Output), c_int]),
    "kaon_request_abort": (None, [c_void_p]),
    "kaon_request_free": (None, [c_void_p]),
    "kaon_engine_tokenize": (c_int, [c_void_p, c_char_p, c_size_t, c_bool, P(P(c_int32)), P(c_size_t)]),
    "kaon_engine_detokenize": (c_int, [c_void_p, P(c_int32), c_size_t, c_bool, P(c_void_p), P(c_size_t)]),
    "kaon_engine_special_tokens": (c_int, [c_void_p, P(SpecialTokens), P(c_int32), c_int]),
    "kaon_engine_apply_chat_template": (c_int, [c_void_p, c_char_p, c_char_p, c_char_p, c_bool,
                                                P(c_void_p), P(c_size_t)]),
    "kaon_plugin_load": (c_int, [c_char_p]),
    "kaon_waitset_create": (c_void_p, []),
    "kaon_waitset_add": (c_int, [c_void_p, c_void_p, c_uint64]),
    "kaon_waitset_remove": (None, [c_void_p, c_void_p]),
    "kaon_waitset_wait": (c_int, [c_void_p, P(c_uint64), c_int, c_int]),
    "kaon_waitset_wake": (None, [c_void_p]),
    "kaon_waitset_destroy": (None, [c_void_p]),
}


def library_path():
    """KAON_LIBRARY when set, else the copy installed beside this module."""
    env = os.environ.get("KAON_LIBRARY")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), SONAME)


def _load():
    path = library_path()
    if not os.path.exists(path):
        raise ImportError(f"kaon: {path} not found (install the package with pip, or set "
                          f"KAON_LIBRARY to a built {SONAME})")
    lib = C.CDLL(path)
    for name, (res, args) in _SIGNATURES.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    for name, cls in _MIRRORED.items():
        want, got = lib.kaon_struct_size(name.encode()), C.sizeof(cls)
        if want != got:
            raise ImportError(f"kaon: {path} has {name} of {want} bytes, this package expects "
                              f"{got}: the library and the Python package come from different "
                              f"versions of kaon.h")
    return lib


lib = _load()


def last_error():
    msg = lib.kaon_last_error()
    return msg.decode("utf-8", "replace") if msg else "unknown error"


def take_bytes(ptr, n):
    """Copies n bytes the library malloc'd and frees them."""
    try:
        return C.string_at(ptr, n) if n else b""
    finally:
        lib.kaon_free(ptr)
