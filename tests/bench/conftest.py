"""Shared pieces of the benchmark-tool tests: the repository paths and bench/ on sys.path."""
import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("KAON_BUILD", REPO / "build"))
MODEL = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
