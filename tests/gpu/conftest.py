import pytest


def pytest_addoption(parser):
    # tests/gpu/test_gemma3_hf.py, test_deepseek_hf.py: "--device cuda" adds the kaon-on-CUDA comparisons.
    parser.addoption("--device", choices=["cpu", "cuda"], default="cpu",
                     help="cpu: kaon's CPU backend only; cuda: also kaon on the GPU "
                          "(test_gemma3_hf.py, test_deepseek_hf.py)")


@pytest.fixture
def needs_cuda(request):
    """For the kaon-on-CUDA comparisons (test_gemma3_hf.py, test_deepseek_hf.py): skipped
    unless pytest runs with --device cuda."""
    if request.config.getoption("--device") != "cuda":
        pytest.skip("kaon on CUDA: run with --device cuda")
