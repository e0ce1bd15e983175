"""`KeepRate`: a request's running estimate of the chance that a drafted token is kept."""


class KeepRate:
    """The per-token keep chance of one request's drafts, per anchor match length.

    Estimated from counts of kept tokens and failures (a failure: the first drafted token
    the model did not write), with old counts fading. A match length seen rarely leans on
    the rate over all of them (PRIOR_WEIGHT pseudo-counts of it), so a request's first
    steps, each anchored on a longer match than the last, learn from one another. Verified
    tokens count at once; the unverified rest of a cut draft counts token by token as the
    model writes it (`settle`), so drafts keep teaching the estimate while few or none of
    their tokens are verified.

    Args:
        max_ngram: the drafter's longest anchor.
        fade: factor applied to old counts at each update.
    """

    PRIOR_WEIGHT = 2.0  # pseudo-counts of the overall rate in each match length's estimate

    def __init__(self, max_ngram: int, *, fade: float = 0.9):
        # Python floats, not arrays: a handful of scalar updates per step, where numpy's per-call cost would dominate.
        self.kept = [0.0] * (max_ngram + 1)  # per anchor length: faded count of kept tokens
        self.failed = [0.0] * (max_ngram + 1)  # and of failures
        self.overall = [1.0, 1.0]  # faded (kept, failed) over all lengths, prior 1 each: 0.5 at first
        self.fade = fade
        self.watched: list[list] = []  # [match_len, unverified draft ids, position, how many counted]

    def keep_chance(self, match_len: int) -> float:
        m = min(match_len, len(self.kept) - 1)
        prior = self.overall[0] / (self.overall[0] + self.overall[1])
        return (self.kept[m] + self.PRIOR_WEIGHT * prior) / (self.kept[m] + self.failed[m] + self.PRIOR_WEIGHT)

    def _count(self, match_len: int, kept: int, failed: bool) -> None:
        if not kept and not failed:
            return  # nothing learnt: old counts keep their weight
        m = min(match_len, len(self.kept) - 1)
        self.kept[m] = self.fade * self.kept[m] + kept
        self.failed[m] = self.fade * self.failed[m] + failed
        self.overall = [self.fade * self.overall[0] + kept, self.fade * self.overall[1] + failed]

    def observe(self, match_len: int, draft_ids: list[int], verified: int, written: list[int], position: int) -> None:
        """Learns from a step whose chain draft `draft_ids` (drafted at sequence[position:]) had
        its first `verified` tokens checked, after which the model wrote `written`.

        Tokens the model wrote show whether the chain agreed even where the step verified
        a tree; the chain's rest past the verified tokens is watched (see settle).
        """
        checked = min(verified, len(written), len(draft_ids))
        agree = 0
        while agree < checked and draft_ids[agree] == written[agree]:
            agree += 1
        self._count(match_len, agree, agree < checked)
        if agree == checked and agree < len(draft_ids):
            self.watched.append([match_len, draft_ids[agree:], position + agree, 0])

    def settle(self, sequence) -> None:
        """Counts the tokens of each watched rest that `sequence` now shows kept, and its
        failure once written; a rest is dropped when it fails or is wholly written."""
        still = []
        for watched in self.watched:
            match_len, ids, position, counted = watched
            agree = counted
            while agree < len(ids) and position + agree < len(sequence) and sequence[position + agree] == ids[agree]:
                agree += 1
            failed = agree < len(ids) and position + agree < len(sequence)
            self._count(match_len, agree - counted, failed)
            watched[3] = agree
            if not failed and agree < len(ids):
                still.append(watched)
        self.watched = still
