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
