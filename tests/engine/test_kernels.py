"""engine.kernels.token_chances: a vLLM chain's per-token chances from its anchor's continuation counts."""

import numpy as np
import pytest

from lookahead.engine.kernels import LINE, token_chances


@pytest.mark.parametrize("rate", [0.0, 0.5, 0.99])
def test_token_chances_fall_with_depth_and_rise_with_evidence(rate):
    """Not rising along the chain; higher where more occurrences went on with it, and where the anchor is longer;
    each a logistic of the line's features."""
    out = np.zeros(4)
    token_chances(np.array([4, 4, 3, 1, 0]), 4, rate, 2, out)
    assert all(a >= b for a, b in zip(out, out[1:])) and 0.0 < out[-1] <= out[0] < 1.0
    bias, w_depth, w_freq, w_count, w_match = LINE
    freq = (4 + 2.0 * rate) / (4 + 2.0)
    assert out[0] == pytest.approx(1 / (1 + np.exp(-(bias + w_freq * np.log(freq / (1 - freq)) + w_count * np.log(5) + w_match * np.log(3)))))
    weaker, shorter = np.zeros(4), np.zeros(4)
    token_chances(np.array([4, 1, 1, 1, 0]), 4, rate, 2, weaker)
    token_chances(np.array([4, 4, 3, 1, 0]), 4, rate, 1, shorter)
    assert weaker[0] < out[0] and shorter[0] < out[0]
