"""`BatchDrafts`: the chains of a batch in `lookahead.generate`, drafted for every row in one engine call a step.

Row r of the call is request r of an engine.Batch, the state the vLLM proposer drives: its tokens,
index and keep rate in a slot, its documents store, the drafter's memory shared by all. A step:

    drafts = batch_drafts.plan(rooms, cost, first=...)    every row learnt, indexed, drafted, sized: one advance
    ... the loop verifies the block ...
    batch_drafts.verified(r, written, kept)               per row: what the step wrote of it
    batch_drafts.finish(r)                                a row that ended: filed into memory at once
    batch_drafts.keep(going)                              the rows still going, once some ended

What is per row in Python is what transformers' tensors and the stats need (a Draft for the block, a
DraftStats record); the drafting itself is the engine's (engine.kernels.advance).
"""

import numpy as np

from lookahead.draft import EMPTY_DRAFT, Draft, DraftStats, no_draft_reason
from lookahead.engine import kernels
from lookahead.engine.batch import Batch
from lookahead.sizing.rules import static_batch_draft_sizes


class BatchDrafts:
    """Every row's chain of one left-padded batch, from one engine.Batch; the rows' stats.

    Args:
        drafter: the call's LookupDrafter: its options, memory and documents (shared by the rows), EOS ids
            and vocabulary size, and whether drafts are sized (cost_aware).
        prompts: per row, its prompt without padding.
        max_len: a row's most tokens (its padding excluded: no row holds more).
    """

    def __init__(self, drafter, prompts: list[list[int]], max_len: int):
        rows = len(prompts)
        self.sized = drafter.cost_aware
        self.engine = Batch(rows=rows, num_draft_tokens=drafter.num_draft_tokens, max_model_len=max_len,
                            min_ngram=drafter.min_ngram, max_ngram=drafter.max_ngram, draft_factor=drafter.draft_factor,
                            memory=drafter.memory, documents=drafter.documents, eos_token_id=sorted(drafter.eos_token_ids),
                            vocab_size=drafter.vocab_size, token_chances=False, thread=False)
        self.stats = [DraftStats() for _ in prompts]  # per row of the call, in its order
        self.rows = list(range(rows))  # the rows still going: row i of the arrays below is row rows[i] of the call
        self.tokens = np.zeros((rows, max_len), dtype=np.int64)  # (row, max_len) its tokens, tokens[r, :num_tokens[r]]
        for r, prompt in enumerate(prompts):
            self.tokens[r, : len(prompt)] = prompt
        self.num_tokens = np.array([len(p) for p in prompts], dtype=np.int64)
        self.prompt_lens = self.num_tokens.copy()
        self.num_sampled = np.ones(rows, dtype=np.int64)  # tokens the last step wrote (the prefill's rows draft too: 1)
        self.checked = np.zeros(rows, dtype=np.int64)  # drafted tokens the last step verified
        self.theirs = np.zeros(rows, dtype=np.int64)  # another drafter's tokens verified: none here
        self.chances = np.zeros(rows, dtype=np.float64)  # each row's keep chance at its chain's anchor
        self.steps = np.zeros(rows, dtype=np.int64)  # (row,) steps taken
        self._sources: list = [None] * rows  # per row, its draft's tokens' sources (for the kept ones' count)

    def plan(self, rooms: list[int], cost, *, first: bool) -> list[Draft]:
        """Each going row's draft for one step: its chain of at most rooms[i] tokens, sized under `cost` to finish
        the batch soonest (sizing.rules.static_batch_draft_sizes; unsized: whole). Sized, the prefill verifies none:
        B x L tokens are compute-bound, so drafts cost their share there for at most one step saved."""
        engine, rows = self.engine, len(self.rows)
        slots, _ = engine.slots_of(self.rows, self.num_tokens, self.tokens, self.prompt_lens)
        room = np.asarray(rooms, dtype=np.int64)
        engine.begin(slots, self.num_tokens, self.num_sampled, self.checked, self.theirs, self.tokens, room=room)
        engine.advance(bar=0.0, force=True)
        lengths = engine.out_len[:rows]
        chances = self.chances[:rows]
        if self.sized:
            kernels.keep_chances(engine.slots.state(), slots, engine.out_match, chances)
        if not self.sized:
            sizes = lengths.copy()
        elif first:
            sizes = np.zeros(rows, dtype=np.int64)
        else:
            # each row's tokens per step so far (its stats' tau; >= 1: a step writes one or more)
            rates = (self.num_tokens[:rows] - self.prompt_lens[:rows]) / self.steps[:rows]
            sizes = np.asarray(static_batch_draft_sizes(chances, lengths, room + 1, rates, cost=cost),
                               dtype=np.int64)
        engine.commit(slots, self.num_tokens, sizes)
        self.checked[:rows] = sizes
        drafts = []
        ids, origins, match = engine.out_ids, engine.out_origin, engine.out_match
        for i, (row, size, length, room) in enumerate(zip(self.rows, sizes.tolist(), lengths.tolist(), rooms)):
            if size:
                sources = origins[i, :size].copy()
                drafts.append(Draft.chain(ids[i, :size].copy(), int(match[i]), sources))
                self.stats[row].record(size, sources=sources)
            else:
                sources = None
                drafts.append(EMPTY_DRAFT)
                self.stats[row].record(0, no_draft=no_draft_reason(length, room, lambda: chances[i]))
            self._sources[i] = sources
        return drafts

    def verified(self, i: int, written: list[int], kept: int) -> None:
        """Going row i wrote `written` this step (its `kept` drafted tokens, then its own; cut where it stopped)."""
        sources = self._sources[i]
        self.stats[self.rows[i]].record_accepted(kept, written=written, sources=None if sources is None else sources[:kept])
        n = int(self.num_tokens[i])
        self.tokens[i, n : n + len(written)] = written
        self.num_tokens[i] = n + len(written)
        self.num_sampled[i] = len(written)
        self.steps[i] += 1

    def finish(self, i: int) -> None:
        """Going row i ended: its prompt and whole output are filed into memory now (the rows going on copy from it)."""
        self.engine.finish(self.rows[i], self.tokens[i, : self.num_tokens[i]].copy())
        self.engine.flush()

    def keep(self, going: list[int]) -> None:
        """Only the going rows `going` (indexes into the rows going before) take further steps."""
        if len(going) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in going]
        self.tokens, self.num_tokens, self.prompt_lens = self.tokens[going], self.num_tokens[going], self.prompt_lens[going]
        self.num_sampled, self.checked = self.num_sampled[going], self.checked[going]
        self.steps = self.steps[going]
        self._sources = [self._sources[i] for i in going]

    def close(self) -> None:
        """Every ended row filed into memory."""
        self.engine.close()

    def call_stats(self) -> DraftStats:
        """The call's stats: every row's steps, row after row."""
        stats = DraftStats(rows=len(self.stats))
        for row in self.stats:
            stats.add(row)
        return stats
