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
  extends (Batch.match_rows), and vLLM's log says so once.
- acceptance: a draft counts as vLLM counts it, over the tokens the step really verified
  (`input_batch.spec_token_ids`, handed to Batch.verified); one vLLM dropped (a preempted request,
  a step vLLM ran without us: it skips a custom proposer for the whole batch when one row nears
  max_model_len, and verifies K zeros per row instead) is neither counted nor taught to the sizer,
  and one vLLM made itself (those zeros, or the K placeholders (-1) that pad a resumed request's
  one-token step) is counted, as its metrics count it, and taught nothing.
- per request: its drafting state in the engine (lookahead.engine.batch.Batch, keyed by vLLM's
  request id: a slot with its tokens, index, keep rate and last plan, the documents store it consults),
  walked for all rows at once by the kernels lookahead.request.Request runs for one. All requests
  share one bounded TokenStore (memory: each finished request is added to it).
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
from lookahead.index.token_index import MIN_SLOTS, MIN_TOKENS  # a new slot's capacities (tests set them here, smaller, to grow)
from lookahead.integrations.vllm.options import LOGGER, OPTION_KEY, TESTED_VLLM, read_options
from lookahead.integrations.vllm.rows import RUNNER_SEARCH_FRAMES, find_runner
from lookahead.integrations.vllm.stats import ProposerStats, stats_dict
from lookahead.sizing.load import DraftStepCost, FixedStepCost, KeptShare, worth_sending
from lookahead.sizing.rules import batch_sizes
from lookahead.stats_file import StatsFile
from lookahead.store import TokenStore

LEARN_EVERY = 8  # while no drafted token can pay, every 8th step still drafts (unsent) so that keep rates keep learning
PRIOR_FIXED_COST_TOKENS = 64.0  # F / p before any step is measured (a guess: a GPU verifies tens of tokens for about the price of one)


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
        self._last_step = None  # (decode row keys, tokens verified, drafted?, time returned) of the last step
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
        keys, prompt_lens, checked = self._row_keys(num_rows, num_tokens, token_ids)
        slots, joined = batch.slots_of(keys, num_tokens, token_ids, prompt_lens)  # (row,)
        verified, theirs = batch.verified(slots, num_tokens, lengths, checked)
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
            trust = self.kept_share.trust(decode) if decode else 1.0  # the sizer reads what the last drafts kept
        self.stats.skipped_steps += decode > 0 and not drafting

        chains, sizes = batch.out_len[:num_rows], batch.sizes[:num_rows]  # (row,) each chain's length, its tokens sent
        sent_tokens, promised = 0, 0.0  # drafted tokens sent, and how many of them the sizer expects kept
        if drafting and self.options["cost_aware"]:
            # each decode row verifies and yields its own token; once a draft is sent, D is paid: the fixed part is h + d
            taken, expected = batch_sizes(batch.out_chance[:num_rows], chains, decode, h + d, sizes, trust)
            if taken:
                if self.cost.wants_plain_step() or not worth_sending(decode, expected, taken, h, d):
                    sizes[:] = 0  # drafting does not pay at this load (or a plain step is measured): chains watched, not sent
                    self.stats.withheld_steps += 1
                else:
                    promised = expected
        elif drafting:
            sizes[:] = chains
        if drafting:
            out, drafted, sent_tokens = batch.commit(slots, num_tokens, sizes)
            self.stats.cut_tokens += drafted - sent_tokens
        else:
            out = [[] for _ in range(num_rows)]
        batch.end_step(slots)
        self.stats.steps += 1
        self.stats.requests, self.stats.finished = batch.started, batch.finished
        self.stats.fixed_cost_tokens = self.cost.fixed_cost_tokens
        self.stats.draft_cost_tokens = self.cost.draft_cost_tokens
        self.stats.memory_tokens = len(self.memory) if self.memory is not None else 0
        room = batch.room[:num_rows]
        decoded = keys if decode == num_rows else [key for key, n in zip(keys, room.tolist()) if n]  # rows with room for a chain
        self._last_step = (decoded, len(decoded) + sent_tokens, sent_tokens > 0, self.clock())
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

    def _row_keys(self, num_rows, num_tokens, token_ids):
        """(request id of each row, prompt lengths, the drafted tokens each row's step verified), the last two None
        where the runner does not name the rows; finishes the requests that left."""
        input_batch = getattr(self.runner, "input_batch", None)
        req_ids = getattr(input_batch, "req_ids", None)
        keys = list(req_ids[:num_rows]) if req_ids is not None and len(req_ids) >= num_rows else [None]
        if None not in keys:
            self.batch.finish_absent(keys, getattr(self.runner, "requests", {}).keys())  # preempted requests stay there
            spec = getattr(input_batch, "spec_token_ids", None)  # (vLLM 0.32/0.33)
            return keys, input_batch.num_prompt_tokens, spec if spec is not None and len(spec) >= num_rows else None
        if self.runner is not None:
            self._warn_content_matching("the runner's input_batch.req_ids do not name this step's rows")
        self.stats.rows_by_content += num_rows
        return self.batch.match_rows(num_rows, num_tokens, token_ids), None, None

    def _count_step(self) -> None:
        """Adds the step's counts (kernels.count_drafts, run by advance) to the stats: the drafts the step
        verified as vLLM's metrics count them, ours (learnt from) and vLLM's own."""
        s, per_pos = self.stats, self.batch.per_pos
        drafts, draft_tokens, accepted, vllm_drafts, discarded = self.batch.counts.tolist()
        s.drafts, s.draft_tokens, s.accepted_tokens = s.drafts + drafts, s.draft_tokens + draft_tokens, s.accepted_tokens + accepted
        s.vllm_drafts, s.discarded_drafts = s.vllm_drafts + vllm_drafts, s.discarded_drafts + discarded
        if drafts:
            s.accepted_per_pos[:] = [a + b for a, b in zip(s.accepted_per_pos, per_pos.tolist())]

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
