"""`LookupProposer`: the proposer vLLM builds (`custom_class`) and calls every step.

vLLM builds the class in each worker as `LookupProposer(vllm_config)`, calls
`load_model(target_model)` once, and after every step's bookkeeping
`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)` (0.32,
0.33: positionally; a later revision's CustomClassProposer by keyword): row i of the
persistent batch holds `token_ids_cpu[i, :num_tokens_no_spec[i]]` (prompt and output, this
step's `sampled_token_ids[i]` included); we return one chain per row, `[]` for none. Nothing
is called when a request finishes, and rows move (condensed, swapped, reused by new
requests), so state is keyed by request, never by row:

- request identity: the runner's persistent batch (`input_batch.req_ids[row]`,
  `num_prompt_tokens[row]`), the runner found on `load_model`'s call stack (rows.find_runner);
  a request has finished once it left `runner.requests` (preempted ones stay there). Where no
  runner is found (another vLLM version), a row belongs to the request whose tokens it still
  extends (`_match_rows`), and vLLM's log says so once.
- acceptance: a draft counts as vLLM counts it, over the tokens the step really verified
  (`input_batch.spec_token_ids`); one vLLM dropped (a preempted request, a step vLLM ran
  without us) is neither counted nor taught to the sizer, and one vLLM made itself (its
  placeholders, its zeros) is counted, as its metrics count it, and taught nothing (`_verified`).
- per request: its drafting state in the engine (lookahead.engine.batch.Batch: a slot with its
  tokens, index, keep rate and last plan, the documents store it consults), walked for all rows
  at once by the kernels lookahead.request.Request runs for one (LookupDrafter's chains, the same
  keep rate). All requests share one bounded TokenStore (memory: each finished request is added to it).
- load: drafts are sized for the whole batch (sizing.rules.batch_sizes, batch_draft_sizes' kernel),
  with the step's cost measured from the time between calls (sizing.load.DraftStepCost: a step's fixed
  part, and what verifying any draft adds to it) and each chance trusted as far as the load's
  sent drafts kept what the sizer expected (sizing.load.KeptShare); drafts that would not raise tokens per
  second by sizing.load.MIN_GAIN are not sent (worth_sending), and where no drafted token could
  clear the bar nothing is drafted at all: the step costs a copy of its new tokens.

vLLM is not imported here: it builds this class and hands it plain arrays.
"""

import sys
import threading
import time
from types import SimpleNamespace

import numpy as np

from lookahead.documents import DocumentLibrary
from lookahead.engine import kernels
from lookahead.engine.batch import Batch
from lookahead.integrations.vllm.options import LOGGER, OPTION_KEY, TESTED_VLLM, read_options
from lookahead.integrations.vllm.rows import RUNNER_SEARCH_FRAMES, find_runner
from lookahead.integrations.vllm.stats import ProposerStats, stats_dict
from lookahead.sizing.load import DraftStepCost, FixedStepCost, KeptShare, worth_sending
from lookahead.sizing.rules import batch_sizes
from lookahead.stats_file import StatsFile
from lookahead.store import TokenStore

LEARN_EVERY = 8  # while no drafted token can pay, every 8th step still drafts (unsent) so that keep rates keep learning
PRIOR_FIXED_COST_TOKENS = 64.0  # F / p before any step is measured (a guess: a GPU verifies tens of tokens for about the price of one)
MIN_TOKENS, MIN_SLOTS = 256, 1024  # a new slot's token and table capacities (TokenIndex's; tests start smaller to grow)


class LookupProposer:
    """A vLLM `custom_class` proposer: our drafter for every running request, sized for the batch.

    Args:
        vllm_config: vLLM's VllmConfig (read: speculative_config.num_speculative_tokens,
            model_config.max_model_len and hf_config.eos_token_id, scheduler_config.max_num_seqs,
            additional_config["lookahead"]).
        thread: file finished requests and index new tokens between steps on a thread (False: in the step).
    Raises:
        ValueError, TypeError: bad options (see read_options).
    """

    def __init__(self, vllm_config, *, thread: bool = True):
        self.num_draft_tokens = k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        extra = getattr(vllm_config, "additional_config", None) or {}
        self.options = options = read_options(extra.get(OPTION_KEY) if isinstance(extra, dict) else None)
        min_ngram, max_ngram = options["min_ngram"], options["max_ngram"]
        self.memory: TokenStore | None = None
        if options["memory_path"]:
            self.memory = TokenStore.load(options["memory_path"])
        elif options["memory"]:
            self.memory = TokenStore(max_tokens=options["memory_tokens"], min_ngram=min_ngram, max_ngram=max_ngram)
        documents = DocumentLibrary.load(options["documents_path"]) if options["documents_path"] else DocumentLibrary()
        hf_config = getattr(vllm_config.model_config, "hf_config", None)
        self.eos_token_id = getattr(hf_config, "eos_token_id", None) if options["stop_at_eos"] else None
        fixed = options["fixed_cost_tokens"]
        # the step's cost: learnt from the time between calls (sizing.load), or the fixed line the option gives
        self.cost = DraftStepCost(PRIOR_FIXED_COST_TOKENS) if fixed is None else FixedStepCost(float(fixed))
        # what the sizer's promises kept, per load: its trust in them (none where nothing is sized or measured)
        self.kept_share = KeptShare() if fixed is None and options["cost_aware"] else None
        self._sent_promise = (0, 0.0)  # (decode rows, expected kept tokens) of the drafts the last step sent
        self.runner = None  # vLLM's model runner, when load_model finds it
        self._warned_content = False  # the content-matching warning is given once
        max_num_seqs = int(getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", 256) or 256)
        # every live request's drafting state: the engine (lookahead.engine.batch)
        self.batch = Batch(rows=max_num_seqs, num_draft_tokens=k, max_model_len=self.max_model_len, min_ngram=min_ngram,
                           max_ngram=max_ngram, draft_factor=options["draft_factor"], memory=self.memory, documents=documents,
                           eos_token_id=self.eos_token_id, min_tokens=MIN_TOKENS, min_table=MIN_SLOTS, thread=thread)
        self.requests: dict = {}  # request id (or content key) -> slot
        self._sent: dict = {}  # slot -> the token ids returned for it at the last step (only where any)
        # (row,) tokens of our last draft, and of vLLM's own, that the step verified (_verified; grown with the rows)
        self._ours, self._theirs = np.zeros(max_num_seqs, dtype=np.int64), np.zeros(max_num_seqs, dtype=np.int64)
        self._keys_seen, self._slots_seen = None, None  # the last step's keys and their slots
        self._retired = False  # whether a request was retired since _slots_seen
        self._row_keys: list = []  # content mode: key of each row at the last step
        self._next_key = 0
        self._last_step = None  # (decode row keys, tokens verified, drafted?, time returned) of the last step
        self._last_keys: list = []  # request keys of the last step's rows
        self.clock = time.perf_counter  # what step times are measured with
        self.stats = ProposerStats(accepted_per_pos=[0] * k)
        self._lock = threading.Lock()  # held by a step and by the counters file's writer
        self._closed = False
        self._stats_file = StatsFile(options["stats_path"], self._stats_snapshot, self._lock) if options["stats_path"] else None

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
        """Compiles our kernels (or loads them from numba's cache) on a throwaway proposer's real steps."""
        options = dict(self.options, memory=True, memory_path=None, documents_path=None, row_identity="content", stats_path=None)
        probe = LookupProposer(SimpleNamespace(
            speculative_config=SimpleNamespace(num_speculative_tokens=self.num_draft_tokens),
            model_config=SimpleNamespace(max_model_len=self.max_model_len, hf_config=SimpleNamespace(eos_token_id=None)),
            scheduler_config=SimpleNamespace(max_num_seqs=1), additional_config={OPTION_KEY: options}),
            thread=False)  # its calls at once, so that they compile here
        probe._warned_content = True
        probe.memory.add([1, 2, 3, 1, 2])
        tokens = np.array([[1, 2, 3, 1, 2, 0, 0], [5, 2, 3, 0, 0, 0, 0]], dtype=np.int32)
        probe.propose([[2], [3]], np.array([5, 3], dtype=np.int32), tokens)
        tokens[0, 5] = 3
        probe.propose([[3]], np.array([6], dtype=np.int32), tokens[:1])
        row = np.zeros(1, dtype=np.int64)  # (a row without room: nothing indexed)
        probe.batch.slots.index_rows(row, row)  # the thread's kernel, compiled here and not mid-serving
        probe.close()
        if not (kernels.advance.signatures and kernels.commit.signatures and kernels.index_rows.signatures):
            raise RuntimeError("lookahead: the proposer's warm-up compiled no kernel")

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None, **kwargs) -> list[list[int]]:
        """One chain per row (`[]`: none), at most num_speculative_tokens long and within max_model_len.

        vLLM 0.32/0.33 call it positionally, a later revision's CustomClassProposer by keyword
        (sampled_token_ids=, num_tokens_no_spec=, token_ids_cpu=, slot_mappings=); token_ids_cpu
        may be a numpy array or a CPU tensor.
        """
        start = self.clock()
        if hasattr(token_ids_cpu, "numpy"):  # a CPU tensor: its numpy view
            token_ids_cpu = token_ids_cpu.numpy()
        rows = len(sampled_token_ids)
        if getattr(token_ids_cpu, "ndim", 0) != 2 or token_ids_cpu.shape[0] < rows or len(num_tokens_no_spec) < rows:
            raise ValueError(f"lookahead: propose got {rows} rows of sampled_token_ids but token_ids_cpu of shape "
                             f"{getattr(token_ids_cpu, 'shape', None)} and {len(num_tokens_no_spec)} num_tokens_no_spec "
                             f"(expected (rows or more, max_model_len) and rows or more)")
        with self._lock:
            if self._closed:
                raise RuntimeError("lookahead: propose on a closed LookupProposer")
            out = self._step(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, start)
            self.stats.propose_s += self.clock() - start
        if self._stats_file is not None:
            self._stats_file.changed()
        return out

    def _step(self, sampled, num_tokens_no_spec, token_ids, start) -> list[list[int]]:
        batch = self.batch
        batch.wait()  # the last step's calls have run: the memory and the slots are the step's own again
        num_rows = len(sampled)
        num_tokens = np.asarray(num_tokens_no_spec[:num_rows], dtype=np.int64)  # (row,)
        lengths = [len(ids) for ids in sampled]  # (row,) a list: the step's Python reads it without numpy's per-call cost
        num_sampled = np.array(lengths, dtype=np.int64)  # (row,)
        keys, prompt_lens = self._batch_keys(num_rows, num_tokens, token_ids)
        slots, joined = self._slots_of(keys, num_tokens, token_ids, prompt_lens)  # (row,)
        verified, theirs = self._verified(keys, slots, sampled, num_tokens, by_runner=prompt_lens is not None)
        self._measure_step(keys, lengths, joined, start)

        # the load rule's first bar (below it batch_draft_sizes takes nothing); every LEARN_EVERY-th step drafts anyway
        decode = batch.begin(slots, num_tokens, num_sampled, verified, theirs, token_ids)
        h, d = self.cost.fixed_cost_tokens, self.cost.draft_cost_tokens
        trust = self.kept_share.trust(decode) if self.kept_share is not None and decode else 1.0
        bar = decode / (h + d + decode) / trust if self.options["cost_aware"] and decode else -1.0
        drafting, counted = batch.advance(bar=bar, force=self.stats.steps % LEARN_EVERY == 0)
        accepted = self.stats.accepted_tokens
        if counted:
            self._count_step()
        if self.kept_share is not None and self._sent_promise[1] > 0.0:
            self.kept_share.observe(*self._sent_promise, self.stats.accepted_tokens - accepted)
        self.stats.skipped_steps += decode > 0 and not drafting

        chains, sizes = batch.out_len[:num_rows], batch.sizes[:num_rows]  # (row,) each chain's length, its tokens sent
        sent_tokens, promised = 0, 0.0  # drafted tokens sent, and how many of them the sizer expects kept
        if drafting and self.options["cost_aware"]:
            # each decode row verifies and yields its own token; once a draft is sent, D is paid: the fixed part is h + d
            taken, expected = batch_sizes(batch.out_chance[:num_rows], batch.out_share[:num_rows], chains, decode, h + d,
                                           sizes, trust)
            if taken:
                if self.cost.wants_plain_step() or not worth_sending(decode, expected, taken, h, d):
                    sizes[:] = 0  # drafting does not pay at this load (or a plain step is measured): chains watched, not sent
                    self.stats.withheld_steps += 1
                else:
                    promised = expected
        elif drafting:
            sizes[:] = chains
        out: list[list[int]] = [[] for _ in range(num_rows)]
        self._sent = {}
        if drafting:
            drafted, sent_tokens = batch.commit(slots, num_tokens, sizes)
            if sent_tokens:  # a loop over Python lists, numpy called once per row sent: numpy's per-call cost is what a step saves on
                ids, slot_of = batch.out_ids, slots.tolist()
                for row, size in enumerate(sizes.tolist()):
                    if size:
                        out[row] = self._sent[slot_of[row]] = ids[row, :size].tolist()
            self.stats.cut_tokens += drafted - sent_tokens
        batch.end_step(slots)
        self.stats.steps += 1
        self.stats.fixed_cost_tokens = self.cost.fixed_cost_tokens
        self.stats.draft_cost_tokens = self.cost.draft_cost_tokens
        self.stats.memory_tokens = len(self.memory) if self.memory is not None else 0
        room = batch.room[:num_rows]
        decoded = keys if decode == num_rows else [key for key, n in zip(keys, room.tolist()) if n]  # rows with room for a chain
        self._last_step = (decoded, len(decoded) + sent_tokens, sent_tokens > 0, self.clock())
        self._last_keys = keys
        self._sent_promise = (decode, promised)
        return out

    # -- the load rule -------------------------------------------------------------------------

    def _measure_step(self, keys, lengths, joined, now) -> None:
        """Adds the step that just ran to the cost fit: (tokens it verified, seconds since we returned).

        Only steps that ran exactly the rows we returned for: no request joined (its prefill ran
        in the step), left, or sat in a prefill chunk.
        """
        last, self._last_step = self._last_step, None
        if not isinstance(self.cost, DraftStepCost) or last is None or joined:
            return
        decode_keys, tokens, drafted, returned = last
        if 0 in lengths or keys != decode_keys or now <= returned:
            return
        self.cost.observe(tokens, drafted, now - returned)

    # -- rows -> requests ----------------------------------------------------------------------

    def _batch_keys(self, num_rows, num_tokens, token_ids):
        """(request key of each row, prompt lengths or None); retires finished requests."""
        batch = getattr(self.runner, "input_batch", None)
        req_ids = getattr(batch, "req_ids", None)
        keys = list(req_ids[:num_rows]) if req_ids is not None and len(req_ids) >= num_rows else [None]
        if None not in keys:
            if keys == self._keys_seen and len(self.requests) == num_rows:
                return keys, batch.num_prompt_tokens  # the last step's rows, and no request of ours outside them: none finished
            gone = self.requests.keys() - getattr(self.runner, "requests", {}).keys()
            if gone:
                gone -= set(keys)
                for key in [k for k in self.requests if k in gone]:  # in arrival order: the memory's order is deterministic
                    self._retire(key)  # finished (preempted requests stay in runner.requests)
            return keys, batch.num_prompt_tokens
        if self.runner is not None:
            self._warn_content_matching("the runner's input_batch.req_ids do not name this step's rows")
        return self._match_rows(num_rows, num_tokens, token_ids), None

    def _slots_of(self, keys, num_tokens, token_ids, prompt_lens) -> tuple[np.ndarray, bool]:
        """(the slot of each row's request, whether a request joined: a key not seen before); new requests
        are started, and a request id reused for other tokens is a new request (not counted as joined)."""
        requests = self.requests
        if keys == self._keys_seen and not self._retired:  # the same rows as the last step, none of them retired since
            slots, joined = self._slots_seen.copy(), False
        else:
            slot_of = [requests.get(key, -1) for key in keys]
            slots, joined = np.array(slot_of, dtype=np.int64), -1 in slot_of
        stale = self.batch.stale(slots, num_tokens, token_ids)
        unslotted = joined  # whether any row has no slot (-1): a new request, or one retired as stale just below
        if stale is not None:
            for row in np.flatnonzero(stale).tolist():
                self._retire(keys[row])
                slots[row] = -1
            unslotted = True
        for row in (np.flatnonzero(slots < 0).tolist() if unslotted else ()):
            n = int(num_tokens[row])
            prompt_len = n if prompt_lens is None else min(int(prompt_lens[row]), n)
            first = int(token_ids[row, 0]) if n else -1
            slots[row] = requests[keys[row]] = self.batch.start(token_ids[row, :prompt_len], first, n)
            self.stats.requests += 1
        self._keys_seen, self._slots_seen, self._retired = keys, slots, False
        return slots, joined

    def _verified(self, keys, slots, sampled, num_tokens, *, by_runner: bool) -> tuple[np.ndarray, np.ndarray]:
        """Per row: how many tokens of its request's last draft vLLM verified in the step that just
        ran, and how many of a draft vLLM made itself (which its metrics count as drafts too).

        A draft is verified in the step right after we returned it, which moves its row from
        `plan_pos` to plan_pos + len(sampled) tokens. Otherwise vLLM verified none of it:
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
        num_rows = len(keys)
        if self._ours.shape[0] < num_rows:
            self._ours, self._theirs = np.zeros(2 * num_rows, dtype=np.int64), np.zeros(2 * num_rows, dtype=np.int64)
        ours, theirs = self._ours[:num_rows], self._theirs[:num_rows]
        spec = getattr(getattr(self.runner, "input_batch", None), "spec_token_ids", None)
        by_runner = by_runner and spec is not None and len(spec) >= num_rows
        sent_of = self._sent
        if by_runner:  # the rows whose step verified any drafted token (vLLM's lists, read in place)
            rows = [row for row, ids in enumerate(spec[:num_rows]) if ids]
        elif sent_of:
            rows = [row for row, s in enumerate(slots.tolist()) if s in sent_of]
            last_keys = set(self._last_keys)
        else:
            rows = []
        if not rows:
            ours[:] = 0
            theirs[:] = 0
            return ours, theirs
        # Python lists in the loop, numpy once on each side of it (a numpy scalar read or write is ~0.2 µs, a list's ~0.03)
        slot_of, n_of, pos_of = slots.tolist(), num_tokens.tolist(), self.batch.slots.cols[slots, kernels.PLAN_POS].tolist()
        ours_of, theirs_of = [0] * num_rows, [0] * num_rows
        for row in rows:
            sent = sent_of.get(slot_of[row], ())
            moved = bool(sent) and n_of[row] == pos_of[row] + len(sampled[row])
            if not by_runner:
                ours_of[row] = len(sent) if moved and keys[row] in last_keys else 0
                continue
            checked = len(spec[row])
            if moved and spec[row] == sent[:checked]:
                ours_of[row] = checked
            elif sampled[row]:
                theirs_of[row] = checked
        ours[:] = ours_of
        theirs[:] = theirs_of
        return ours, theirs

    def _count_step(self) -> None:
        """Adds the step's counts (kernels.count_drafts, run by advance) to the stats: the drafts the step
        verified as vLLM's metrics count them, ours (learnt from) and vLLM's own."""
        s, per_pos = self.stats, self.batch.per_pos
        drafts, draft_tokens, accepted, vllm_drafts, discarded = self.batch.counts.tolist()
        s.drafts, s.draft_tokens, s.accepted_tokens = s.drafts + drafts, s.draft_tokens + draft_tokens, s.accepted_tokens + accepted
        s.vllm_drafts, s.discarded_drafts = s.vllm_drafts + vllm_drafts, s.discarded_drafts + discarded
        if drafts:
            s.accepted_per_pos[:] = [a + b for a, b in zip(s.accepted_per_pos, per_pos.tolist())]

    def _match_rows(self, num_rows, num_tokens, token_ids) -> list:
        """Without a runner: each row belongs to the request whose copied tokens it still extends."""
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

    def _extends(self, slot: int, row: np.ndarray, n: int, window: int = 32) -> bool:
        """Whether row[:n] extends what `slot` copied (checked on its first and last `window` tokens)."""
        seen = self.batch.slots.tokens_of(slot)
        m = seen.shape[0]
        if m == 0 or m > n:
            return False
        head = min(window, m)
        return np.array_equal(seen[:head], row[:head]) and np.array_equal(seen[m - head :], row[m - head : m])

    def _retire(self, key) -> None:
        """Files a finished request into memory and frees its slot."""
        s = self.requests.pop(key)
        self._retired = True
        self._sent.pop(s, None)
        self.batch.finish(s)  # filed into memory after this step's drafts
        self.stats.finished += 1

    # -- counters ------------------------------------------------------------------------------

    def flush(self) -> None:
        """Waits until every finished request is in memory (a step does so itself before reading it)."""
        with self._lock:
            self.batch.flush()

    def _stats_snapshot(self) -> dict:
        return stats_dict(self.stats, self.runner)

    def close(self) -> None:
        """Ends the proposer: finished requests are filed into memory, the thread runs what is queued and is
        joined, the counters file is written a last time and its thread joined. Also `with LookupProposer(...)`;
        the thread is joined too when the proposer is collected and at interpreter exit. propose then raises."""
        with self._lock:
            self._closed = True
            self.batch.close()
        if self._stats_file is not None:
            self._stats_file.close()

    def __enter__(self) -> "LookupProposer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def write_stats(self) -> None:
        """Writes the counters as JSON to options["stats_path"] now (atomically: a reader never sees half a file)."""
        if self._stats_file is not None:
            self._stats_file.write()
