"""`Request`: one request's drafting state, driven alike by every loop and by replay (numpy and numba).

A request is its drafter (a draft.DraftSource: the tokens seen, `stats`) and one slot of the
engine's state (engine.slots.Slots: its keep rate and the plan of its last step, learnt and
planned by the same kernels the vLLM proposer runs for all its rows: engine.kernels.learn_row,
plan_row). Each step a loop calls

    plan = request.plan(room, cost)                  one row: draft, size and commit
    (or request.propose(room), a rule over many rows' keep chances, request.commit(chain, size))
    ... verify plan.draft ...
    request.verified(written)                        the tokens the model wrote this step

and `request.finish()` once it has ended (the drafter files it into memory), so the
bookkeeping (what was drafted, what the keep rate learns, what the drafter indexes) is
written once.
"""

import numpy as np

from lookahead.draft import (
    DEFAULT_MAX_TREE_NODES, DRAFTED, Draft, DraftSource, StepPlan, no_draft_reason,
)
from lookahead.engine import kernels
from lookahead.engine.slots import Slots
from lookahead.sizing.rules import chain_size, tree_gain, tree_size


class Request:
    """One request's drafter, keep rate and last plan.

    Args:
        drafter: the request's drafter, a DraftSource such as LookupDrafter (already reset to its prompt, or reset by `start`).
        sized: learn a keep rate, so that rules can cut drafts to what verifying them pays.
            Without it every draft is verified whole.

    Example:
        >>> from lookahead import LookupDrafter
        >>> from lookahead.sizing.cost import LineCost
        >>> request = Request(LookupDrafter(num_draft_tokens=4), sized=True)
        >>> request.start([1, 2, 3, 4, 1, 2])
        >>> plan = request.plan(8, LineCost(1000.0))  # verifying is nearly free: the whole chain
        >>> plan.draft.token_ids.tolist()
        [3, 4, 1, 2]
        >>> request.verified([3, 4, 9])  # the model kept two and wrote 9
        >>> request.stats.accepted, request.drafter.num_tokens, request.slots.keep[0].sum(axis=0).tolist()
        (2, 9, [2.0, 1.0])
        >>> request.finish()  # filed into the drafter's memory; the stats still describe it
        >>> request.stats.accepted, request.drafter.num_tokens
        (2, 0)
    """

    def __init__(self, drafter: DraftSource, *, sized: bool):
        self.drafter = drafter
        self.sized = sized
        self.slots: Slots | None = None  # sized: slot 0 holds the keep rate and the pending chain
        self._new_slot()
        self.last: StepPlan | None = None  # the plan of the step being verified
        self.estimates = None  # its likeliest tree, nodes verified, estimated chances, which are the table's (commit_tree): learnt from once verified
        self.position = 0  # tokens the drafter had seen when `last` was drafted
        self.room = -1  # the room the last propose had (0: none left; the stats' NO_ROOM)

    def _new_slot(self) -> None:
        if self.sized:
            self.slots = Slots(1, 16, 1, self.drafter.max_ngram, indexes=False)  # (chains wider than 16: widened at commit)
            self.slots.allocate(0, -1, -1)

    @property
    def stats(self):
        """The request's DraftStats: what each step drafted and kept; still readable after `finish`."""
        return self.drafter.stats

    def start(self, prompt_ids) -> None:
        """A new request on this state: the drafter reset to `prompt_ids` (the old one filed into memory)."""
        self.drafter.reset(prompt_ids)
        self._new_slot()
        self.last = None

    def finish(self) -> None:
        """The request ended: the drafter files it into memory and drops its tokens; `stats` still describe it."""
        self.drafter.finish()
        self.last = None

    def propose(self, room: int, *, hedged: bool = False) -> Draft:
        """The drafter's chain of at most `room` tokens (`hedged`: from a tree's candidates, see DraftSource.propose)."""
        self.room = room
        return self.drafter.propose(room, hedged=hedged)

    def keep_chance(self, chain: Draft) -> float:
        """The chance that a token of `chain` is kept (0.5 before anything is learnt); 1.0 unsized."""
        return kernels.keep_chance(self.slots.keep, self.slots.overall, 0, chain.match_len) if self.slots is not None else 1.0

    def commit(self, chain: Draft, size: int, draft: Draft | None = None, gain: float = 1.0, *, no_draft: int = DRAFTED) -> StepPlan:
        """The step verifies `draft` (default: the chain's first `size` tokens), sized as `size` tokens of `chain`
        (`gain`: StepPlan's). An empty draft's reason (draft.NO_DRAFT_REASONS) is `no_draft`, if the caller
        knows it, else read here: none found, no room, or the sizer's width 0 (rarely kept, or it did not pay)."""
        plan = StepPlan(chain, chain.prefix(size) if draft is None else draft, size, gain)
        self.last, self.position = plan, self.drafter.num_tokens
        if not len(plan.draft) and no_draft == DRAFTED:
            no_draft = no_draft_reason(len(chain), self.room, lambda: self.keep_chance(chain))
        self.drafter.stats.record(len(plan.draft), sources=plan.draft.source_codes(), no_draft=no_draft)
        if self.slots is not None and len(chain):
            if len(chain) > self.slots.k:
                self.slots.widen(max(len(chain), 2 * self.slots.k))
            kernels.plan_row(self.slots.state(), 0, chain.token_ids, len(chain), size, chain.match_len, self.position)
        return plan

    def plan(self, room: int, cost=None, *, tree: bool = False, max_tree_nodes: int = DEFAULT_MAX_TREE_NODES,
             promise: bool = False) -> StepPlan:
        """One row's step: the chain cut to what verifying it pays under `cost` (sizing.cost; None or unsized:
        whole), or with `tree` the tree of the nodes that cost as much (unsized: the drafter's whole tree);
        `promise`: a sized tree's plan carries its gain (commit_tree)."""
        drafter = self.drafter
        self.room = room
        if tree and (cost is None or self.slots is None):
            whole = drafter.propose_tree(room, max_tree_nodes=max_tree_nodes)
            return self.commit(whole.prefix(0), 0, whole)
        chain = drafter.propose(room, hedged=tree)
        if tree:
            return self.commit_tree(chain, cost, max_tree_nodes, promise=promise)
        size = len(chain) if cost is None or self.slots is None or not len(chain) else chain_size(self.keep_chance(chain), len(chain), cost)
        return self.commit(chain, size)

    def commit_tree(self, chain: Draft, cost, max_tree_nodes: int = DEFAULT_MAX_TREE_NODES, *, promise: bool = False) -> StepPlan:
        """A one-row tree step, sized: of the candidates `chain` was drawn from (propose(..., hedged=True)), the
        likeliest nodes, as many as pay under `cost` (sizing.rules.tree_size); the keep rate learns from `chain`.
        `promise`: the plan's gain is the tree's over its chain's (sizing.rules.tree_gain), else 1.0 (only the
        tree trial reads it: LoopCosts.observe). Once verified, the drafter's tree chances learn from the nodes the
        step tells the truth of (TreeChances.observe)."""
        chance = self.keep_chance(chain)
        tree, chances, (estimates, table) = self.drafter._likeliest_tree(max_tree_nodes, chance)
        nodes = tree_size(chances, cost)
        size = chain_size(chance, len(chain), cost) if len(chain) else 0
        plan = self.commit(chain, size, tree.prefix(nodes), tree_gain(chances[:nodes], chance, size, cost) if promise else 1.0)
        self.estimates = (tree, nodes, estimates, table)
        return plan

    def verified(self, written, accepted: int | None = None, checked: int | None = None, predicted=None) -> None:
        """After the step: the model wrote `written` (its kept drafted tokens, then its own; cut where
        generation stopped). `accepted`: the drafted tokens it kept, if not len(written) - 1;
        `checked`: the chain tokens the step verified, if not the plan's size (a server may trim a draft);
        `predicted`: (block entries, the model's top-k ids after each) for the drafter's prediction table."""
        plan, written = self.last, written.tolist() if hasattr(written, "tolist") else list(written)
        if plan is not None:
            kept = min(max(len(written) - 1 if accepted is None else accepted, 0), len(plan.draft))
            sources = plan.draft.source_codes()
            # the kept nodes' sources: a chain's first `kept`; a tree's on the path of the kept tokens (parents first)
            if self.estimates is not None:  # a sized tree step: what it told of its likeliest tree is learnt (TreeChances)
                tree, nodes, estimates, table = self.estimates
                on = on_path(tree, written[: kept + 1])  # (the draft, its first `nodes`, holds none past the kept ones)
                self.drafter.tree_chances.observe(tree.parents, nodes, len(written) > kept, on, estimates, table)
                sources = sources[on[:nodes]]
            elif kept and not plan.draft.is_chain:
                sources = sources[on_path(plan.draft, written[:kept])]
            else:
                sources = sources[:kept]
            self.drafter.stats.record_accepted(kept, written=written, sources=sources)
        self.last, self.estimates = None, None
        self.drafter.extend(written)
        if self.slots is not None:  # the plan (if any, and of a chain) resolved against the tokens as written
            verified = 0 if plan is None else plan.size if checked is None else checked
            tokens = self.drafter.tokens
            kernels.learn_row(self.slots.state(), 0, tokens, tokens.shape[0], len(written), verified)
        if predicted is not None:
            self.drafter._record_predictions(*predicted)  # after extend: the written tokens were ranked against the table before

    def discard(self) -> None:
        """The last plan was not verified (a server dropped it): nothing is learnt from it."""
        self.last, self.estimates = None, None
        if self.slots is not None:
            self.slots.cols[0, kernels.PLAN_LEN] = -1

    def extend(self, token_ids) -> None:
        """Tokens of the request the drafter has not seen, outside any plan (a prompt's next chunk, a resumed request)."""
        self.drafter.extend(token_ids)
        if self.slots is not None:
            tokens = self.drafter.tokens
            kernels.settle_row(self.slots.state(), 0, tokens, tokens.shape[0])


def on_path(draft: Draft, kept: list[int]) -> np.ndarray:
    """(len(draft),) bool: which nodes lie on the path of the `kept` tokens (what a step kept of the draft)."""
    depth = np.empty(len(draft), dtype=np.int64)
    kernels.tree_kept(draft.parents, draft.token_ids, np.asarray(kept, dtype=np.int64), depth)
    return depth > 0
