"""kaon for Python: vLLM-style offline and asyncio APIs over libkaon (the C engine).

    from kaon import LLM, SamplingParams
    llm = LLM("SmolLM2-135M-Instruct.Q4_1.gguf", max_model_len=2048)
    out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=16))
    print(out[0].outputs[0].text)
"""
from ._lib import lib as _lib_handle
from .async_llm import AsyncLLM
from .llm import LLM
from .outputs import CompletionOutput, Logprob, RequestOutput
from .plugins import load_plugin
from .sampling_params import SamplingParams

__version__ = "0.1.0"
library_version = _lib_handle.kaon_version().decode()

__all__ = ["LLM", "AsyncLLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob",
           "load_plugin", "__version__", "library_version"]
