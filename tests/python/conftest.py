"""The Python package's tests. kaon comes from the environment when installed (scripts/test_python.sh
installs it with pip into a fresh venv); else from python/ in this tree with the library of
$KAON_BUILD. The CLI they compare against is $KAON_BUILD/kaon."""
import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("KAON_BUILD", os.path.join(ROOT, "build"))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
KAON = os.path.join(BUILD, "kaon")

try:
    import kaon  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(ROOT, "python"))
    os.environ.setdefault("KAON_LIBRARY", os.path.join(BUILD, "libkaon.so.0"))
    import kaon  # noqa: F401

# Small KV pools: several engines live in one test process.
ENGINE_ARGS = dict(max_model_len=1024, kv_cache_memory_bytes=96 << 20)


@pytest.fixture(scope="session")
def llm():
    from kaon import LLM
    e = LLM(MODEL, **ENGINE_ARGS)
    yield e
    e.close()
