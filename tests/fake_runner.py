"""What LookupProposer reads of vLLM's model runner and persistent batch, without vLLM: rows condensed,
swapped and reused as vLLM moves them, drafts verified as its scheduler verifies them.
"""

from types import SimpleNamespace

import numpy as np

from lookahead.integrations.vllm import LookupProposer


def fake_config(k=4, max_model_len=256, max_num_seqs=4, **options):
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(max_model_len=max_model_len, hf_config=SimpleNamespace(eos_token_id=2)),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        additional_config={"lookahead": options},
    )


class FakeBatch:
    """Rows of token ids as vLLM's persistent batch holds them (condensed, reordered)."""

    def __init__(self, max_rows=4, max_len=256):
        self.token_ids_cpu = np.zeros((max_rows, max_len), dtype=np.int32)  # (row, position)
        self.num_tokens_no_spec = np.zeros(max_rows, dtype=np.int32)  # (row,)
        self.num_prompt_tokens = np.zeros(max_rows, dtype=np.int32)  # (row,)
        self.req_ids = []
        self.spec_token_ids = []  # (row,) the drafted tokens this step verified

    def set_rows(self, rows, spec_token_ids):
        """rows: (request id, prompt, output so far) per row; spec_token_ids: per row, its verified draft."""
        self.req_ids = [req_id for req_id, _, _ in rows]
        self.spec_token_ids = [list(ids) for ids in spec_token_ids]
        for row, (_, prompt, output) in enumerate(rows):
            seq = list(prompt) + list(output)
            self.token_ids_cpu[row, : len(seq)] = seq
            self.num_tokens_no_spec[row] = len(seq)
            self.num_prompt_tokens[row] = len(prompt)


class WrappingProposer:
    """A class between the runner and ours, as one later vLLM revision's CustomClassProposer."""

    def __init__(self, proposer):
        self.user_proposer = proposer

    def load_model(self, *args, **kwargs):
        return self.user_proposer.load_model(*args, **kwargs)


def load_through_a_helper(drafter):
    drafter.load_model(object())


class FakeRunner:
    """What LookupProposer reads of vLLM's model runner: input_batch and the live requests.

    Like vLLM's scheduler, a step verifies a request's last draft only if the request ran in
    the step before (a preempted request's draft is dropped), cut to `budget[req_id]` tokens.
    """

    def __init__(self, proposer, *, wrapped=False, helper=False):
        self.input_batch = FakeBatch()
        self.requests = {}
        self.drafts = {}  # request id -> the draft returned for it at the last step
        self.drafts_verified = self.draft_tokens_verified = 0  # what vLLM's metrics would count
        drafter = WrappingProposer(proposer) if wrapped else proposer
        if helper:
            load_through_a_helper(drafter)  # the runner two frames up
        else:
            drafter.load_model(object())  # the runner one frame up (two when wrapped)

    def step(self, proposer, rows, sampled, budget=None):
        """rows: (request id, prompt, output) per row, this step's `sampled` tokens included in output."""
        self.requests = {req_id: None for req_id, _, _ in rows} | {r: None for r in self.requests if r in self.extra_live}
        spec = [self.drafts.get(req_id, [])[: (budget or {}).get(req_id)] for req_id, _, _ in rows]
        self.drafts_verified += sum(1 for ids in spec if ids)
        self.draft_tokens_verified += sum(map(len, spec))
        self.input_batch.set_rows(rows, spec)
        out = proposer.propose(sampled, self.input_batch.num_tokens_no_spec, self.input_batch.token_ids_cpu)
        self.drafts = {req_id: ids for (req_id, _, _), ids in zip(rows, out)}
        return out

    extra_live = ()  # preempted requests: live, not in the batch


def new_proposer(**options):
    options.setdefault("cost_aware", False)  # whole chains: what the bookkeeping tests check
    return LookupProposer(fake_config(**options))


A, B, C = [5, 6, 7, 8] * 3, [20, 21, 22, 23] * 3, [40, 41, 42, 43] * 3
