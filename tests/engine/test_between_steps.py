"""engine.between_steps.BetweenSteps: the calls handed to its thread run in order, their error raised at the next wait."""

import pytest

from lookahead.engine.between_steps import BetweenSteps


def test_between_steps_runs_the_calls_in_order_and_raises_their_error_at_the_next_wait():
    worker, seen = BetweenSteps(), []
    worker.submit(seen.append, 1)
    worker.submit(seen.append, 2)
    worker.wait()
    assert seen == [1, 2] and worker.seconds > 0
    worker.submit(divmod, 1, 0)
    worker.submit(seen.append, 3)
    with pytest.raises(ZeroDivisionError):
        worker.wait()
    assert seen == [1, 2, 3]  # the thread went on
    worker.wait()  # the error is raised once
