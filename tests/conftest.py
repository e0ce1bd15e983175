"""Fixtures every test module gets."""

from pathlib import Path

import pytest
import torch

DEFAULT_THREADS = torch.get_num_threads()
VLLM_TESTS = Path(__file__).resolve().parent / "integrations" / "vllm"


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread(request):
    """One intra-op torch thread per module, torch's default restored after it.

    The models here are tiny (hidden size 32 to 64): a second thread has no work worth
    splitting, and every op then waits at a barrier for a thread the OS may not run. Measured
    on the 2-core machine while another job ran: 40 sampled stories260K runs of 50 tokens
    (tests/integrations/test_sampling_exact.py's loop) took 2.8 s at one thread, 79 s at two. What a
    test checks does not depend on it (tests/bench/test_cli.py sets two threads where it checks that
    the bench's forward_cost drops to one and back). tests/integrations/vllm/ keeps torch's default:
    .ci/vllm runs it with vLLM's engines, which this was not measured with."""
    if VLLM_TESTS in Path(request.module.__file__).resolve().parents:
        yield
        return
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(DEFAULT_THREADS)
