"""`BatchDrafts`: the drafts of a batch in `lookahead.generate`, drafted for every row in one engine call a step.

Row r of the call is request r of an engine.Batch, the state the vLLM proposer drives: its tokens,
index and keep rate in a slot, its documents store, the drafter's memory shared by all; a tree step's
tries and lead and rank chances in an engine.trees.TreeRows. A step:

    drafts = batch_drafts.plan(rooms, cost, first=..., tree=...)  every row learnt, indexed, drafted, sized: one
                                                                  engine call (a tree step: one more, to grow them)
    ... the loop verifies the block ...
    batch_drafts.verified(r, written, kept)               per row: what the step wrote of it
    batch_drafts.learnt(inputs, predicted)                the rows' lead and rank chances, then the table's records
    batch_drafts.finish(r)                                a row that ended: filed into memory at once
    batch_drafts.keep(going)                              the rows still going, once some ended

What is per row in Python is what transformers' tensors need (a Draft for the block, the tokens a row wrote);
the drafting itself is the engine's (engine.kernels.advance; engine.trees for trees). The stats are logged per
step as arrays over the going rows and made into the call's DraftStats once, when the call ends (call_stats).
"""

from array import array

import numpy as np

from lookahead.draft import DEFAULT_MAX_TREE_NODES, EMPTY_DRAFT, MODEL, OTHER, Draft, DraftStats, no_draft_reasons
from lookahead.drafter import CARRY
from lookahead.engine import kernels
from lookahead.engine.batch import Batch
from lookahead.engine.trees import TreeRows
from lookahead.predictions import NO_TABLE
from lookahead.request import on_path
from lookahead.sizing.rules import static_batch_draft_sizes, tree_nodes

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
        self.drafter = drafter
        self.trees: TreeRows | None = None  # built at the first tree step
        self.rows = list(range(rows))  # the rows still going: row i of the arrays below is row rows[i] of the call
        # per step, what the stats count (call_stats): (the going rows' call rows, each one's drafted tokens, why none
        # (DRAFTED: some), its drafted tokens' sources (going, width) int8, its kept tokens' (None: a chain's, the first
        # of those), the kept tokens, the tokens written); the last two filled by `verified`
        self._log: list[tuple] = []
        self.call_rows = rows
        self._outputs: dict[int, np.ndarray] = {}  # call row -> the tokens it wrote, once it ended (finish)
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
        self._drafts: list = [EMPTY_DRAFT] * rows  # per going row, its draft (for the kept tokens' sources)
        self._slots: np.ndarray | None = None  # (going row,) its engine slot: a row keeps its slot for the call

    def plan(self, rooms: list[int], cost, *, first: bool, tree: bool = False,
             max_tree_nodes: int = DEFAULT_MAX_TREE_NODES) -> list[Draft]:
        """Each going row's draft for one step: its chain of at most rooms[i] tokens, sized under `cost` to finish
        the batch soonest (sizing.rules.static_batch_draft_sizes; unsized: whole). Sized, the prefill verifies none:
        B x L tokens are compute-bound, so drafts cost their share there for at most one step saved. With `tree`
        (not the prefill), each row's tree, from the candidates its hedged chain came from: sized, of the
        heaviest nodes lookup's first, as many as the widest chain's block pays for (sizing.rules.tree_nodes), for
        each row whose chain is sized above 0; unsized, the max_tree_nodes heaviest, blended."""
        engine, rows = self.engine, len(self.rows)
        if self._slots is None:
            self._slots, _ = engine.slots_of(self.rows, self.num_tokens, self.tokens, self.prompt_lens)
        slots = self._slots
        room = np.asarray(rooms, dtype=np.int64)
        engine.begin(slots, self.num_tokens, self.num_sampled, self.checked, self.theirs, self.tokens, room=room)
        table = self.drafter.predictions
        if tree:
            if self.trees is None:
                self.trees = self._tree_rows()
            engine.advance_trees(self.trees, NO_TABLE if table is None else table.ids)
        else:
            engine.advance(bar=0.0, force=True)
            if self.trees is not None:
                self.trees.read[:] = False  # a chain reads no table: what the rows write is not ranked
        lengths = engine.out_len[:rows]
        chances = self.chances[:rows]
        if self.sized:
            kernels.keep_chances(engine.slots.state(), slots, engine.out_match, chances)
        if not self.sized:
            sizes = np.zeros(rows, dtype=np.int64) if tree else lengths.copy()  # an unsized tree stands for no chain
        elif first:
            sizes = np.zeros(rows, dtype=np.int64)
        else:
            # each row's tokens per step so far (its stats' tau; >= 1: a step writes one or more)
            rates = (self.num_tokens[:rows] - self.prompt_lens[:rows]) / self.steps[:rows]
            sizes = np.asarray(static_batch_draft_sizes(chances, lengths, room + 1, rates, cost=cost),
                               dtype=np.int64)
        engine.commit(slots, self.num_tokens, sizes)
        self.checked[:rows] = sizes
        if tree:
            drafts = self._trees(sizes, cost, max_tree_nodes)
            drafted = np.array([len(draft) for draft in drafts], dtype=np.int64)
            origins = np.zeros((rows, int(drafted.max(initial=0))), dtype=np.int8)
            for i, draft in enumerate(drafts):
                origins[i, : len(draft)] = draft.source_codes()
            kept_sources = np.full((rows, self.engine.k), OTHER, dtype=np.int8)  # verified writes each row's (a tree's path)
        else:
            width = int(sizes.max(initial=0))  # one copy of the step's chains: each row's draft a view of it
            ids, origins, match = engine.out_ids[:rows, :width].copy(), engine.out_origin[:rows, :width].copy(), engine.out_match
            drafts = [Draft.chain(ids[i, :size], int(match[i]), origins[i, :size]) if size else EMPTY_DRAFT
                      for i, size in enumerate(sizes.tolist())]
            drafted, kept_sources = sizes, None
        self._log.append((np.array(self.rows), drafted, no_draft_reasons(drafted, lengths, room, chances), origins, kept_sources,
                          np.zeros(rows, dtype=np.int64), np.zeros(rows, dtype=np.int64)))
        self._drafts = drafts
        return drafts

    def _tree_rows(self) -> TreeRows:
        drafter = self.drafter
        table = drafter.predictions
        # every row starts from the drafter's lead and rank chances, as its next request would
        carry = ((CARRY * drafter.lead_chances.hits, CARRY * drafter.lead_chances.seen),
                 None if table is None else CARRY * drafter.rank_chances.counts)
        return TreeRows(self.call_rows, drafter.num_draft_tokens, drafter.max_ngram, sorted(drafter.eos_token_ids),
                        drafter.vocab_size, 0 if table is None else table.k, carry)

    def _trees(self, sizes: np.ndarray, cost, max_tree_nodes: int) -> list[Draft]:
        # each going row's tree (see plan): TreeRows.grow over the tries advance_trees filled
        rows = sizes.shape[0]
        if not self.sized:
            nodes = np.full(rows, max_tree_nodes, dtype=np.int64)
        else:
            widest = int(sizes.max()) if rows else 0
            nodes = np.where(sizes > 0, tree_nodes(widest, max_tree_nodes, cost, rows=rows) if widest else 0, 0)
        ids, parents, origins, lengths = self.trees.grow(nodes, max_tree_nodes, lookup_first=self.sized)
        match = self.engine.out_match
        return [Draft(ids[i, :n].copy(), parents[i, :n].copy(), int(match[i]), origins[i, :n].copy()) if n else EMPTY_DRAFT
                for i, n in enumerate(lengths.tolist())]

    def verified(self, i: int, written: list[int], kept: int) -> None:
        """Going row i wrote `written` this step (its `kept` drafted tokens, then its own; cut where it stopped)."""
        *_, kept_sources, kept_log, written_log = self._log[-1]
        kept_log[i], written_log[i] = kept, len(written)
        if kept_sources is not None and kept:  # a tree's kept nodes' sources: those on the path of the kept tokens
            draft = self._drafts[i]
            codes = draft.source_codes()[on_path(draft, written[:kept])]
            if codes.shape[0] == kept:  # (else it stopped among them: OTHER, as DraftStats.record_accepted counts them)
                kept_sources[i, :kept] = codes
        n = int(self.num_tokens[i])
        self.tokens[i, n : n + len(written)] = written
        self.num_tokens[i] = n + len(written)
        self.num_sampled[i] = len(written)
        self.steps[i] += 1

    def learnt(self, inputs: list, predicted) -> None:
        """After every going row's `verified`: what they wrote is counted into their lead and rank chances (against
        the table as it was), then the table records the step's predictions, row by row: inputs[i] the block entries'
        ids of going row i, predicted[i] (n, k) the model's top-k after each (the table's learning: LookupDrafter's)."""
        if self.trees is not None:
            table = self.drafter.predictions
            rows = len(self.rows)
            self.trees.observe(NO_TABLE if table is None else table.ids, self.tokens[:rows], self.num_tokens[:rows],
                               self.num_sampled[:rows])
        for row_inputs, row_predicted in zip(inputs, predicted):
            self.drafter._record_predictions(row_inputs, row_predicted)

    def finish(self, i: int) -> None:
        """Going row i ended: its prompt and whole output are filed into memory now (the rows going on copy from it)."""
        tokens = self.tokens[i, : self.num_tokens[i]].copy()
        self._outputs[self.rows[i]] = tokens[self.prompt_lens[i] :]
        self.engine.finish(self.rows[i], tokens)
        self.engine.flush()

    def keep(self, going: list[int]) -> None:
        """Only the going rows `going` (indexes into the rows going before) take further steps."""
        if len(going) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in going]
        self.tokens, self.num_tokens, self.prompt_lens = self.tokens[going], self.num_tokens[going], self.prompt_lens[going]
        self.num_sampled, self.checked = self.num_sampled[going], self.checked[going]
        self.steps = self.steps[going]
        self._drafts = [self._drafts[i] for i in going]
        if self._slots is not None:
            self._slots = self._slots[going]
        if self.trees is not None:
            self.trees.keep(going)

    def close(self) -> None:
        """Every ended row filed into memory."""
        self.engine.close()

    def call_stats(self) -> DraftStats:
        """The call's stats once every row has ended: every row's steps, row after row (each row's DraftStats as its own
        steps would have recorded them: DraftStats.record, then record_accepted with what it wrote)."""
        steps, rows = len(self._log), self.call_rows
        width = max([log[3].shape[1] for log in self._log] + [self.engine.k]) + 1  # a slot past the most kept: MODEL's
        step = np.repeat(np.arange(steps), [log[0].shape[0] for log in self._log])
        at = np.concatenate([log[0] for log in self._log] + [np.zeros(0, dtype=np.int64)])
        # (row, step) of the call; read where the row was going: row after row, each row's steps in order
        going = np.zeros((rows, steps), dtype=np.bool_)
        going[at, step] = True
        drafted, no_draft, kept, written = (np.zeros((rows, steps), dtype=dtype) for dtype in (np.int64, np.uint8, np.int64, np.int64))
        for column, into in ((1, drafted), (2, no_draft), (5, kept), (6, written)):
            into[at, step] = np.concatenate([log[column] for log in self._log] + [np.zeros(0, dtype=into.dtype)])
        sources, kept_sources = (np.full((rows, steps, width), OTHER, dtype=np.int8) for _ in range(2))
        for i, (rows_at, _, _, origins, kept_origins, _, _) in enumerate(self._log):
            sources[rows_at, i, : origins.shape[1]] = origins
            kept_origins = origins if kept_origins is None else kept_origins
            kept_sources[rows_at, i, : kept_origins.shape[1]] = kept_origins
        d, k, w, reasons, sources, kept_sources = (a[going] for a in (drafted, kept, written, no_draft, sources, kept_sources))
        slot = np.arange(width)
        # a written token's source: a kept one's, then the step's own (MODEL) where it wrote more than it kept
        token_codes = np.where(slot < k[:, None], kept_sources, MODEL)[slot < w[:, None]]
        ids = np.concatenate([self._outputs[row] for row in range(rows)] + [np.zeros(0, dtype=np.int64)])
        return DraftStats(
            drafted_per_step=d.tolist(), accepted_per_step=k.tolist(), no_draft_per_step=bytearray(reasons.tobytes()),
            source_codes=(bytearray(sources[slot < d[:, None]].tobytes()), bytearray(kept_sources[slot < k[:, None]].tobytes())),
            written=(array("q", ids.tolist()), bytearray(token_codes.tobytes()), array("l", np.repeat(np.arange(d.shape[0]), w).tolist())),
            rows=rows,
        )

