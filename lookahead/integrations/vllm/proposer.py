"""`LookupProposer`: the proposer vLLM builds (`custom_class`) and calls every step.

vLLM builds the class in each worker as `LookupProposer(vllm_config)`, calls
`load_model(target_model)` once, and after every step's bookkeeping
`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`:
row i of the persistent batch holds `token_ids_cpu[i, :num_tokens_no_spec[i]]` (prompt and
output, this step's `sampled_token_ids[i]` included); we return one chain per row, `[]` for
none. Nothing is called when a request finishes, and rows move (condensed, swapped,
reused by new requests), so state is keyed by request, never by row:

- request identity: the runner's persistent batch (`input_batch.req_ids[row]`,
  `num_prompt_tokens[row]`), the runner found on `load_model`'s call stack (find_runner); a
  request has finished once it left `runner.requests` (preempted ones stay there). Where no
  runner is found (another vLLM version), a row belongs to the drafter whose indexed tokens
  it still extends (`_match_rows`), and vLLM's log says so once.
- acceptance: a draft counts as vLLM counts it, over the tokens the step really verified
  (`input_batch.spec_token_ids`); one vLLM dropped (a preempted request, a step vLLM ran
  without us) is neither counted nor taught to the sizer, and one vLLM made itself (its
  placeholders, its zeros) is counted, as its metrics count it, and taught nothing (`_verified`).
- per request: its state (lookahead.request.Request: a LookupDrafter fed only the new
  tokens each step, its keep rate per anchor length, its last plan). All requests share one bounded TokenStore
  (memory: each finished request is added to it) and an optional DocumentLibrary.
- load: drafts are sized for the whole batch (lookahead.sizing.batch_draft_sizes), with
  the step's cost per verified token measured from the time between calls (StepCostFit).

vLLM is not imported here: it builds this class and hands it plain arrays.
"""

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from lookahead.documents import DocumentLibrary
from lookahead.drafter import LookupDrafter
from lookahead.integrations.vllm.options import LOGGER, OPTION_KEY, TESTED_VLLM, read_options
from lookahead.integrations.vllm.rows import RUNNER_SEARCH_FRAMES, find_runner
from lookahead.request import Request
from lookahead.sizing.cost import LineCost, StepCostFit
from lookahead.sizing.rules import batch_draft_sizes
from lookahead.store import TokenStore

PRIOR_FIXED_COST_TOKENS = 64.0  # F / p before any step is measured (a guess: a GPU verifies tens of tokens for about the price of one)


@dataclass
class ProposerStats:
    """Counters of one proposer (one worker); drafts/draft_tokens/accepted_* count as vLLM's metrics do."""

    steps: int = 0
    requests: int = 0  # requests seen
    finished: int = 0  # requests retired (their tokens filed into memory)
    drafts: int = 0  # non-empty drafts verified, vLLM's own included
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: list = field(default_factory=list)
    rows_by_content: int = 0  # rows identified by content (no runner)
    vllm_drafts: int = 0  # of those, drafts vLLM made itself (its placeholders or zeros, see _verified)
    discarded_drafts: int = 0  # drafts vLLM dropped unverified (a preempted request, a step without room or without us)
    cut_tokens: int = 0  # drafted tokens the load rule did not send
    memory_tokens: int = 0
    fixed_cost_tokens: float = 0.0  # the load rule's current F / p
    propose_s: float = 0.0  # time in propose, all rows


@dataclass
class _Request:
    state: Request  # the drafter, its keep rate and its last plan (state.position: where it was drafted)
    indexed: int = 0  # tokens of the row given to the drafter
    sent: list = field(default_factory=list)  # the token ids of the last plan returned to vLLM


class LookupProposer:
    """A vLLM `custom_class` proposer: one LookupDrafter per running request, sized for the batch.

    Args:
        vllm_config: vLLM's VllmConfig (read: speculative_config.num_speculative_tokens,
            model_config.max_model_len and hf_config.eos_token_id, additional_config["lookahead"]).
    Raises:
        ValueError, TypeError: bad options (see read_options).
    """

    def __init__(self, vllm_config):
        self.num_draft_tokens = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        extra = getattr(vllm_config, "additional_config", None) or {}
        self.options = options = read_options(extra.get(OPTION_KEY) if isinstance(extra, dict) else None)
        self.memory: TokenStore | None = None
        if options["memory_path"]:
            self.memory = TokenStore.load(options["memory_path"])
        elif options["memory"]:
            self.memory = TokenStore(max_tokens=options["memory_tokens"], min_ngram=options["min_ngram"], max_ngram=options["max_ngram"])
        self.documents = DocumentLibrary.load(options["documents_path"]) if options["documents_path"] else DocumentLibrary()
        hf_config = getattr(vllm_config.model_config, "hf_config", None)
        self.eos_token_id = getattr(hf_config, "eos_token_id", None) if options["stop_at_eos"] else None
        fixed = options["fixed_cost_tokens"]
        # the step's cost: learnt from the time between calls, or the fixed line the option gives
        self.cost = StepCostFit(PRIOR_FIXED_COST_TOKENS) if fixed is None else LineCost(float(fixed))
        self.runner = None  # vLLM's model runner, when load_model finds it
        self._warned_content = False  # the content-matching warning is given once
        self.requests: dict = {}  # request id (or content key) -> _Request
        self._free: list[LookupDrafter] = []  # drafters of finished requests, reused (at most max_num_seqs kept)
        self._max_free = int(getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", 256) or 256)
        self._row_keys: list = []  # content mode: key of each row at the last step
        self._next_key = 0
        self._last_step = None  # (decode row keys, tokens verified, time returned) of the last step
        self._last_keys: set = set()  # request keys of the last step's rows
        self.stats = ProposerStats(accepted_per_pos=[0] * self.num_draft_tokens)

    # -- vLLM's hooks ------------------------------------------------------------------------

    def load_model(self, target_model=None, *args, **kwargs) -> None:
        """Called once by the model runner: we keep the runner (found on the stack) and compile our kernels."""
        if self.options["row_identity"] == "auto":
            self.runner = find_runner(sys._getframe(1))
            if self.runner is None:
                self._warn_content_matching(f"no model runner (an object with input_batch and requests) "
                                            f"within {RUNNER_SEARCH_FRAMES} frames of load_model")
        self._warm_up()

    def _warn_content_matching(self, reason: str) -> None:
        """Says once, in vLLM's log, that rows are matched to requests by their tokens."""
        if not self._warned_content:
            self._warned_content = True
            LOGGER.warning("lookahead: %s; rows are matched to requests by content (slower; stats.rows_by_content "
                           "counts them). Tested with vLLM %s.", reason, TESTED_VLLM)

    def _warm_up(self) -> None:
        """Compiles our numba kernels (or loads them from numba's cache) before the first serving step."""
        o = self.options
        probe = TokenStore(min_ngram=o["min_ngram"], max_ngram=o["max_ngram"])  # not the shared memory
        drafter = LookupDrafter(num_draft_tokens=4, min_ngram=o["min_ngram"], max_ngram=o["max_ngram"], memory=probe)
        drafter.reset([1, 2, 3, 1, 2])
        drafter.propose()  # the request's own index
        drafter.reset([9, 2])  # files [1, 2, 3, 1, 2] into the probe store
        drafter.propose()  # the store's continuation

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None, **kwargs) -> list[list[int]]:
        """One chain per row (`[]`: none), at most num_speculative_tokens long and within max_model_len."""
        start = time.perf_counter()
        num_rows = len(sampled_token_ids)
        keys, prompt_lens = self._batch_keys(num_rows, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        verified, theirs = self._verified(keys, sampled_token_ids, num_tokens_no_spec, by_runner=prompt_lens is not None)
        new_keys = {key for key in keys if key not in self.requests}
        self._measure_step(keys, sampled_token_ids, new_keys, start)

        chains: list = [None] * num_rows  # per row, (its request, its chain) or None
        for row in range(num_rows):
            if theirs[row]:  # counted as vLLM's metrics count it; nothing learnt from it
                self._count(theirs[row], len(sampled_token_ids[row]) - 1)
                self.stats.vllm_drafts += 1
            n = int(num_tokens_no_spec[row])
            request = self._follow(keys[row], sampled_token_ids[row], n, token_ids_cpu[row], prompt_lens, row, verified[row])
            limit = min(self.num_draft_tokens, self.max_model_len - n)
            if not sampled_token_ids[row] or limit <= 0:  # a prefill chunk, a discarded step, or no room
                continue
            chains[row] = (request, request.state.propose(limit))

        decode = [row for row in range(num_rows) if chains[row] is not None]
        sizes = self._sizes([chains[row] for row in decode])
        out: list[list[int]] = [[] for _ in range(num_rows)]
        for row, size in zip(decode, sizes):
            request, chain = chains[row]
            request.state.commit(chain, size)
            request.sent = out[row] = chain.token_ids[:size].tolist()
            self.stats.cut_tokens += len(chain) - size

        self.stats.steps += 1
        self.stats.fixed_cost_tokens = self.cost.fixed_cost_tokens
        self.stats.memory_tokens = len(self.memory) if self.memory is not None else 0
        if self.options["stats_path"]:
            self.write_stats()
        now = time.perf_counter()
        self.stats.propose_s += now - start
        self._last_step = ([keys[row] for row in decode], len(decode) + sum(sizes), now)
        self._last_keys = set(keys)
        return out

    # -- the load rule -------------------------------------------------------------------------

    def _sizes(self, chains) -> list[int]:
        """How much of each row's chain to send: batch_draft_sizes over the requests' keep chances."""
        lengths = [len(chain) for _, chain in chains]
        if not self.options["cost_aware"]:
            return lengths
        chances = [request.state.keep_chance(chain) for request, chain in chains]
        return batch_draft_sizes(chances, lengths, cost=self.cost)

    def _measure_step(self, keys, sampled, new_keys, now) -> None:
        """Adds the step that just ran to the cost fit: (tokens it verified, seconds since we returned).

        Only steps that ran exactly the rows we drafted for: no request joined (its prefill ran
        in the step), left, or sat in a prefill chunk.
        """
        last, self._last_step = self._last_step, None
        if not isinstance(self.cost, StepCostFit) or last is None or new_keys:
            return
        decode_keys, tokens, returned = last
        if any(not s for s in sampled) or list(keys) != decode_keys:
            return
        self.cost.observe(1, tokens, now - returned)

    # -- rows -> requests ----------------------------------------------------------------------

    def _batch_keys(self, num_rows, sampled, num_tokens, token_ids):
        """(request key of each row, prompt lengths or None); retires finished requests."""
        batch = getattr(self.runner, "input_batch", None)
        req_ids = getattr(batch, "req_ids", None)
        if req_ids is not None and len(req_ids) >= num_rows and all(r is not None for r in req_ids[:num_rows]):
            keys = list(req_ids[:num_rows])
            live = getattr(self.runner, "requests", {})
            for key in [k for k in self.requests if k not in live and k not in keys]:
                self._retire(key)  # finished (preempted requests stay in runner.requests)
            return keys, batch.num_prompt_tokens
        if self.runner is not None:
            self._warn_content_matching("the runner's input_batch.req_ids do not name this step's rows")
        return self._match_rows(num_rows, num_tokens, token_ids), None

    def _verified(self, keys, sampled, num_tokens, *, by_runner: bool) -> tuple[list[int], list[int]]:
        """Per row: how many tokens of its request's last draft vLLM verified in the step that just
        ran, and how many of a draft vLLM made itself (which its metrics count as drafts too).

        A draft is verified in the step right after we returned it, which moves its row from
        `position` to position + len(sampled) tokens. Otherwise vLLM verified none of it:
        - a step ran without calling us: vLLM skips a custom proposer for the whole batch when one
          row nears max_model_len (and verifies K zero tokens per row instead);
        - vLLM preempted the request (and dropped its draft; the recomputed prefill then samples
          one token, as a verified step would), or trimmed the draft to the step's token budget.
        The persistent batch holds the drafted tokens each row's step verified
        (input_batch.spec_token_ids, vLLM 0.32/0.33): a prefix of what we sent is ours; anything
        else is vLLM's own (those zeros, or the K placeholders (-1) that pad the one-token step of
        a resumed request whose prefix was cached). Without it, a draft counts only if its request
        ran in the step before (a preempted request sits out at least one step).
        """
        spec = getattr(getattr(self.runner, "input_batch", None), "spec_token_ids", None)
        by_runner = by_runner and spec is not None and len(spec) >= len(keys)
        ours, theirs = [], []
        for row, key in enumerate(keys):
            request = self.requests.get(key)
            sent = request.sent if request is not None else []
            moved = request is not None and int(num_tokens[row]) == request.state.position + len(sampled[row])
            if not by_runner:
                ours.append(len(sent) if sent and moved and key in self._last_keys else 0)
                theirs.append(0)
                continue
            checked = len(spec[row])  # vLLM's list of this step's drafted tokens, read in place
            mine = checked > 0 and moved and spec[row] == sent[:checked]
            ours.append(checked if mine else 0)
            theirs.append(checked if checked and not mine and sampled[row] else 0)
        return ours, theirs

    def _match_rows(self, num_rows, num_tokens, token_ids) -> list:
        """Without a runner: each row belongs to the request whose indexed tokens it still extends."""
        self.stats.rows_by_content += num_rows
        previous = self._row_keys + [None] * max(0, num_rows - len(self._row_keys))
        taken: set = set()
        keys: list = []
        for row in range(num_rows):
            n = int(num_tokens[row])
            key = next((k for k in [previous[row], *self.requests]  # the row's last holder first
                        if k is not None and k not in taken and k in self.requests
                        and self._extends(self.requests[k], token_ids[row], n)), None)
            if key is None:
                key, self._next_key = f"row-content-{self._next_key}", self._next_key + 1
            taken.add(key)
            keys.append(key)
        for key in [k for k in self.requests if k not in taken]:
            self._retire(key)  # finished, or preempted (re-indexed when it returns)
        self._row_keys = keys
        return keys

    @staticmethod
    def _extends(request: _Request, row: np.ndarray, n: int, window: int = 32) -> bool:
        """Whether row[:n] extends what `request` indexed (checked on its first and last `window` tokens)."""
        m = request.indexed
        if m == 0 or m > n:
            return False
        seen = request.state.drafter.index.tokens
        head = min(window, m)
        return np.array_equal(seen[:head], row[:head]) and np.array_equal(seen[m - head : m], row[m - head : m])

    def _follow(self, key, sampled: list, n: int, row: np.ndarray, prompt_lens, row_index: int, verified: int) -> _Request:
        """The request of `key`, its drafter extended to row[:n] and its sizer taught by this step's tokens
        (`verified`: how many tokens of its last draft the step verified)."""
        request = self.requests.get(key)
        if request is not None and not (request.indexed <= n and self._extends(request, row, n, window=1)):
            self._retire(key)  # the row no longer extends what we indexed: the id was reused
            request = None
        if request is None:
            request = _Request(Request(self._new_drafter(), sized=True))  # learnt in either mode; cost_aware decides whether the load rule reads it
            prompt_len = n if prompt_lens is None else min(int(prompt_lens[row_index]), n)
            request.state.start(row[:prompt_len])
            request.indexed = prompt_len
            self.requests[key] = request
            self.stats.requests += 1
        state = request.state
        if state.last is not None:
            moved = bool(sampled) and n == state.position + len(sampled)  # the row ran the step we drafted for
            if moved and not (request.sent and not verified):
                if verified:  # what the model wrote after our last draft: vLLM's acceptance
                    self._count(verified, len(sampled) - 1)
                state.verified(sampled, checked=verified)
                request.indexed += len(sampled)
            else:  # vLLM dropped the draft (preempted, trimmed, skipped): neither counted nor learnt from
                self.stats.discarded_drafts += bool(request.sent)
                state.discard()
        request.sent = []
        if n > request.indexed:
            state.extend(row[request.indexed : n])
            request.indexed = n
        return request

    def _retire(self, key) -> None:
        """Files a finished request into memory and keeps its drafter for reuse."""
        request = self.requests.pop(key)
        request.state.drafter.reset(())  # adds the request's tokens to the shared memory
        if len(self._free) < self._max_free:
            self._free.append(request.state.drafter)
        self.stats.finished += 1

    def _new_drafter(self) -> LookupDrafter:
        if self._free:
            return self._free.pop()
        o = self.options
        return LookupDrafter(
            num_draft_tokens=self.num_draft_tokens, min_ngram=o["min_ngram"], max_ngram=o["max_ngram"],
            draft_factor=float(o["draft_factor"]), memory=self.memory if self.memory is not None else False,
            documents=self.documents, eos_token_id=self.eos_token_id, cost_aware=False,
        )

    # -- counters ------------------------------------------------------------------------------

    def _count(self, drafted: int, accepted: int) -> None:
        s = self.stats
        s.drafts += 1
        s.draft_tokens += drafted
        s.accepted_tokens += accepted
        for pos in range(min(accepted, len(s.accepted_per_pos))):
            s.accepted_per_pos[pos] += 1

    def write_stats(self) -> None:
        """Writes the counters as JSON to options["stats_path"] (atomically: a reader never sees half a file)."""
        path = self.options["stats_path"]
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w") as f:
            json.dump(dict(asdict(self.stats), runner=type(self.runner).__name__ if self.runner is not None else None), f)
        os.replace(temporary, path)
