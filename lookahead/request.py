"""`Request`: one request's drafting state, driven alike by every loop and by replay (numpy only).

A request is its drafter (a draft.DraftSource: the tokens seen, `stats`), its keep rate
(sizing.keep_rate) and the plan of its last step. Each step a loop calls

    plan = request.plan(room, cost)                  one row: draft, size and commit
    (or request.propose(room), a rule over many rows' keep chances, request.commit(chain, size))
    ... verify plan.draft ...
    request.verified(written)                        the tokens the model wrote this step

and `request.finish()` once it has ended (the drafter files it into memory), so the
bookkeeping (what was drafted, what the keep rate learns, what the drafter indexes) is
written once.
"""

from lookahead.draft import DEFAULT_MAX_TREE_NODES, Draft, DraftSource, StepPlan
from lookahead.sizing.keep_rate import KeepRate
from lookahead.sizing.rules import chain_size, tree_nodes


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
        >>> request.stats.accepted, request.drafter.num_tokens
        (2, 9)
        >>> request.finish()  # filed into the drafter's memory; the stats still describe it
        >>> request.stats.accepted, request.drafter.num_tokens
        (2, 0)
    """

    def __init__(self, drafter: DraftSource, *, sized: bool):
        self.drafter = drafter
        self.sized = sized
        self.keep_rate = KeepRate(drafter.max_ngram) if sized else None
        self.last: StepPlan | None = None  # the plan of the step being verified
        self.position = 0  # tokens the drafter had seen when `last` was drafted

    @property
    def stats(self):
        """The request's DraftStats: what each step drafted and kept; still readable after `finish`."""
        return self.drafter.stats

    def start(self, prompt_ids) -> None:
        """A new request on this state: the drafter reset to `prompt_ids` (the old one filed into memory)."""
        self.drafter.reset(prompt_ids)
        self.keep_rate = KeepRate(self.drafter.max_ngram) if self.sized else None
        self.last = None

    def finish(self) -> None:
        """The request ended: the drafter files it into memory and drops its tokens; `stats` still describe it."""
        self.drafter.finish()
        self.last = None

    def propose(self, room: int, *, hedged: bool = False) -> Draft:
        """The drafter's chain of at most `room` tokens (`hedged`: from a tree's candidates, see DraftSource.propose)."""
        return self.drafter.propose(room, hedged=hedged)

    def keep_chance(self, chain: Draft) -> float:
        """The chance that a token of `chain` is kept (0.5 before anything is learnt); 1.0 unsized."""
        return self.keep_rate.keep_chance(chain.match_len) if self.keep_rate is not None else 1.0

    def commit(self, chain: Draft, size: int, draft: Draft | None = None) -> StepPlan:
        """The step verifies `draft` (default: the chain's first `size` tokens), sized as `size` tokens of `chain`."""
        plan = StepPlan(chain, chain.prefix(size) if draft is None else draft, size)
        self.last, self.position = plan, self.drafter.num_tokens
        self.drafter.stats.record(len(plan.draft))
        return plan

    def plan(self, room: int, cost=None, *, tree: bool = False, max_tree_nodes: int = DEFAULT_MAX_TREE_NODES) -> StepPlan:
        """One row's step: the chain cut to what verifying it pays under `cost` (sizing.cost; None or unsized:
        whole), or with `tree` the tree of the nodes that cost as much (unsized: the drafter's whole tree)."""
        drafter = self.drafter
        if tree and (cost is None or self.keep_rate is None):
            whole = drafter.propose_tree(room, max_tree_nodes=max_tree_nodes)
            return self.commit(whole.prefix(0), 0, whole)
        chain = drafter.propose(room, hedged=tree)
        size = len(chain) if cost is None or self.keep_rate is None or not len(chain) else chain_size(self.keep_chance(chain), len(chain), cost)
        if not tree or not size:
            return self.commit(chain, size)
        return self.commit(chain, size, drafter.grow_tree(tree_nodes(size, max_tree_nodes, cost)))

    def verified(self, written, accepted: int | None = None, checked: int | None = None, predicted=None) -> None:
        """After the step: the model wrote `written` (its kept drafted tokens, then its own; cut where
        generation stopped). `accepted`: the drafted tokens it kept, if not len(written) - 1;
        `checked`: the chain tokens the step verified, if not the plan's size (a server may trim a draft);
        `predicted`: (block entries, the model's top-k ids after each) for the drafter's prediction table."""
        plan, written = self.last, written.tolist() if hasattr(written, "tolist") else list(written)
        if plan is not None:
            kept = len(written) - 1 if accepted is None else accepted
            self.drafter.stats.record_accepted(min(max(kept, 0), len(plan.draft)))
            if self.keep_rate is not None and len(plan.chain):
                size = plan.size if checked is None else checked
                self.keep_rate.observe(plan.chain.match_len, plan.chain.token_ids.tolist(), size, written, self.position)
        self.last = None
        self.extend(written)
        if predicted is not None:
            self.drafter.record_predictions(*predicted)  # after extend: the written tokens were ranked against the table before

    def discard(self) -> None:
        """The last plan was not verified (a server dropped it): nothing is learnt from it."""
        self.last = None

    def extend(self, token_ids) -> None:
        """Tokens of the request the drafter has not seen, outside any plan (a prompt's next chunk, a resumed request)."""
        self.drafter.extend(token_ids)
        if self.keep_rate is not None and self.keep_rate.watched:
            self.keep_rate.settle(self.drafter.tokens)
