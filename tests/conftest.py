"""Fixtures every test module gets."""

import pytest
import torch

DEFAULT_THREADS = torch.get_num_threads()


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread(request):
    """One intra-op torch thread per module, torch's default restored after it.

    The models here are tiny (hidden size 32 to 64): a second thread has no work worth
    splitting, and every op then waits at a barrier for a thread the OS may not run. Measured
    on the 2-core machine while another job ran: 40 sampled stories260K runs of 50 tokens
    (tests/test_sampling_exact.py's loop) took 2.8 s at one thread, 79 s at two. What a test
    checks does not depend on it (tests/test_cli.py sets two threads where it checks that the
    bench's forward_cost drops to one and back). tests/test_vllm*.py keep torch's default: .ci/vllm
    runs them with vLLM's engines, which this was not measured with."""
    if request.module.__name__.rpartition(".")[2].startswith("test_vllm"):
        yield
        return
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(DEFAULT_THREADS)
