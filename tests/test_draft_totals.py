"""DraftStats' running totals: drafted, accepted, tokens and tau equal the sums over its steps, in O(1) a call."""

from hypothesis import given
from hypothesis import strategies as st

from lookahead.draft import DraftStats

# One row's steps: (drafted, accepted at record, accepted set after, or None), as the loops record them.
steps = st.lists(st.integers(0, 8).flatmap(lambda d: st.tuples(st.just(d), st.integers(0, d), st.none() | st.integers(0, d))),
                 max_size=30)


def recorded(row) -> DraftStats:
    stats = DraftStats()
    for drafted, accepted, later in row:
        stats.record(drafted, accepted)
        if later is not None:
            stats.record_accepted(later)  # sets the step's count: the total follows, not adds
    return stats


def assert_sums(stats: DraftStats) -> None:
    drafted, accepted = sum(stats.drafted_per_step), sum(stats.accepted_per_step)
    assert (stats.drafted, stats.accepted, stats.tokens) == (drafted, accepted, accepted + stats.steps)
    assert stats.tau == ((accepted + stats.steps) / stats.steps if stats.steps else 0.0)


@given(steps, steps)
def test_totals_are_the_sums_over_the_steps(first, second):
    stats, other = recorded(first), recorded(second)
    assert_sums(stats)
    stats.add(other)
    assert_sums(stats)
    assert_sums(DraftStats(drafted_per_step=list(stats.drafted_per_step), accepted_per_step=list(stats.accepted_per_step)))
