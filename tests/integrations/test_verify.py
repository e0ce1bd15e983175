"""verify's top_ids: the model's top-k ids at a step's block entries (the prediction table's input)."""

import numpy as np
import pytest
import torch

from lookahead.integrations.verify import top_ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [3, 30, 4099])
def test_top_ids_rank_as_torch_topk_does(dtype, vocab):
    generator = torch.Generator().manual_seed(vocab)
    logits = (torch.randn(3, 9, vocab, generator=generator) * 4).to(dtype)
    entries = [range(2, 7), [0, 8, 3], []]
    got = top_ids(logits, entries, 8)
    k = min(8, vocab)
    for r, rows in enumerate(entries):
        want = logits[r, list(rows)].float().topk(k, dim=-1)
        assert got[r].shape == (len(rows), k) and got[r].dtype == np.int32
        picked = logits[r, list(rows)].float().gather(1, torch.from_numpy(got[r]).long())  # equal scores may rank in any order
        assert torch.equal(picked, want.values)
        assert all(len(set(row)) == k for row in got[r].tolist())
    one = top_ids(logits[:1], [range(2, 7)], 4)
    assert len(one) == 1 and np.array_equal(one[0], top_ids(logits[:1], [list(range(2, 7))], 4)[0])


def test_top_ids_on_a_cpu_rank_equal_scores_lower_id_first_and_skip_nans():
    logits = torch.tensor([[[1.0, 3.0, 3.0, float("nan"), 2.0, 3.0], [float("nan")] * 4 + [0.0, float("-inf")]]])
    assert top_ids(logits, [[0, 1]], 4)[0].tolist() == [[1, 2, 5, 4], [4, 5, -1, -1]]


class _Cache:
    """What build_block reads of a RowCache: its length, and which slots hold each row's real tokens."""

    def __init__(self, real: torch.Tensor | None, length: int):
        self.real, self.length, self.rows = real, length, 1 if real is None else real.shape[0]

    def __len__(self):
        return self.length

    def real_tokens(self):
        return [self.length] * self.rows if self.real is None else self.real.sum(dim=1).tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_tree_blocks_mask_is_zero_where_a_query_sees_a_key_and_the_dtypes_lowest_elsewhere(dtype):
    from lookahead.draft import Draft
    from lookahead.integrations.verify import build_block

    rng = np.random.default_rng(3)
    for trial in range(60):
        rows, slots = int(rng.integers(1, 4)), int(rng.integers(0, 7))
        drafts = [Draft(rng.integers(0, 50, n), np.array([-1, -1] + [int(rng.integers(-1, i)) for i in range(2, n)], dtype=np.int64))
                  for n in rng.integers(2, 7, rows)]  # (two roots: trees)
        real = torch.from_numpy(rng.random((rows, slots)) < 0.7) if trial % 2 and slots else None
        block = build_block([[1, 2, 3]] * rows, drafts, [0] * rows, _Cache(real, slots), uncached=1, dtype=dtype)
        assert block.is_tree and block.attention.dtype == dtype and block.attention.shape == (rows, 1, block.tokens.shape[1], slots + block.tokens.shape[1])
        for r, draft in enumerate(drafts):
            width, n = block.tokens.shape[1], len(draft)
            sees = np.zeros((width, slots + width), dtype=bool)
            sees[:, :slots] = True if real is None else real[r].numpy()
            for i in range(width):  # the uncached token, a node's ancestors and itself; fill: of the block, itself alone
                sees[i, slots + i] = True
                node = i - 1
                while 0 <= node < n:
                    node = int(draft.parents[node])
                    sees[i, slots + 1 + node] = True  # its parent's entry (the uncached token at -1)
            want = torch.where(torch.from_numpy(sees), 0.0, torch.finfo(dtype).min).to(dtype)
            assert torch.equal(block.attention[r, 0], want), (trial, r)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_greedy_choices_pick_torchs_argmax_of_the_widened_logits(dtype):
    from lookahead.integrations.verify import greedy_choices

    generator = torch.Generator().manual_seed(7)
    logits = (torch.randn(2, 5, 300, generator=generator) * 3).to(dtype)
    logits[0, 0, :] = 0.0  # ties everywhere: the first id
    logits[0, 1, 17], logits[0, 1, 40] = float("inf"), float("inf")
    logits[0, 2, 9] = float("nan")  # a NaN: torch's argmax takes it
    logits[0, 3, :] = -0.0
    logits[0, 3, 5] = 0.0  # -0.0 equals 0.0: still the first id
    logits[1, 0, :] = float("-inf")
    assert greedy_choices(logits, [], False, None) == logits.float().argmax(dim=-1).tolist()
    assert greedy_choices(logits, [], False, None)[0][:4] == [0, 17, 9, 0]
