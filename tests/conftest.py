"""Settings for the whole test process."""

import torch

# One intra-op thread. The models here are tiny (hidden size 32 to 64): a second thread has no
# work worth splitting, and every op then waits at a barrier for a thread the OS may not run.
# Measured on the 2-core machine while another job ran: 40 sampled stories260K runs of 50
# tokens (tests/test_sampling_exact.py's loop) took 2.8 s at one thread, 79 s at two. What a
# test checks does not depend on it; tests/test_cli.py sets two threads where it checks that
# the bench's forward_cost drops to one and back.
torch.set_num_threads(1)
