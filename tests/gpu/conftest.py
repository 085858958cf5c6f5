def pytest_addoption(parser):
    # tests/gpu/test_gemma3_hf.py: "--device cuda" adds the kaon-on-CUDA comparisons.
    parser.addoption("--device", choices=["cpu", "cuda"], default="cpu",
                     help="cpu: kaon's CPU backend only; cuda: also kaon on the GPU (test_gemma3_hf.py)")
