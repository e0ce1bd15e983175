"""vLLM's `suffix` drafter (SuffixDecoding) offline: vLLM 0.32's calls to arctic-inference's SuffixDecodingCache.

vllm/v1/spec_decode/suffix_decoding.py (SuffixDecodingProposer) keeps one SuffixDecodingCache
per engine: a suffix tree of each running request's prompt, and one global tree of responses
(the running requests' so far, and up to max_cached_requests finished ones, evicted first in
first out). Each engine step, for each request in the batch: start it on first sight (its
prompt's tree), add the tokens the step wrote, speculate from the last max_tree_depth tokens;
at the end of the call, stop the requests no longer in the batch (their responses stay in the
global tree). `VllmSuffix` makes those calls, for the replay here and for
benchmarks/vllm_proposer.py's batch.
"""

import time

import numpy as np
from tqdm import tqdm

from lookahead.bench.replay import kept_prefix

# vLLM 0.32's SpeculativeConfig defaults for method="suffix" (suffix_decoding_*); an unset
# num_speculative_tokens defaults to the tree depth.
MAX_TREE_DEPTH = 24
MAX_CACHED_REQUESTS = 10_000  # 0: no global tree (no memory of earlier responses)
MAX_SPEC_FACTOR = 1.0  # draft at most max_spec_factor x match_len tokens
MIN_TOKEN_PROB = 0.1  # stop drafting below this estimated probability
INSTALL = "pip install --no-deps arctic-inference==0.1.1"  # the version vLLM 0.32 asks for; an sdist, about 2 minutes to build


class SuffixUnavailableError(ImportError):
    """arctic_inference (vLLM's `suffix`) does not import here; the message says how to install it."""


def cache_class():
    """arctic-inference's SuffixDecodingCache.

    Raises:
        SuffixUnavailableError: arctic_inference does not import.
    """
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as e:
        raise SuffixUnavailableError(f"vLLM's suffix drafter needs arctic-inference, which does not import here ({e}): "
                                     f"{INSTALL} (the version vLLM 0.32 calls; an sdist, built in about 2 minutes)") from None
    return SuffixDecodingCache


class VllmSuffix:
    """One engine's SuffixDecodingCache, called as vLLM 0.32's SuffixDecodingProposer calls it.

    Args (keyword-only, vLLM's defaults): num_speculative_tokens (most tokens a draft holds),
    max_tree_depth, max_cached_requests, max_spec_factor, min_token_prob (SpeculativeConfig's
    suffix_decoding_* options).

    Raises:
        SuffixUnavailableError: arctic_inference does not import.

    Example (it needs arctic-inference; the doctest skips without it):
        >>> import pytest; _ = pytest.importorskip("arctic_inference")
        >>> suffix = VllmSuffix(num_speculative_tokens=4)
        >>> prompt = np.array([1, 2, 3, 4, 5, 1, 2], dtype=np.int32)
        >>> suffix.propose("a", prompt, [], prompt).tolist()  # [1, 2] occurred, followed by 3 4 5 1
        [3, 4]
    """

    def __init__(self, *, num_speculative_tokens: int = MAX_TREE_DEPTH, max_tree_depth: int = MAX_TREE_DEPTH,
                 max_cached_requests: int = MAX_CACHED_REQUESTS, max_spec_factor: float = MAX_SPEC_FACTOR,
                 min_token_prob: float = MIN_TOKEN_PROB):
        if num_speculative_tokens < 1 or max_tree_depth < 1:
            raise ValueError(f"num_speculative_tokens and max_tree_depth must be >= 1, got {num_speculative_tokens} and {max_tree_depth}")
        if max_cached_requests < 0 or max_spec_factor < 0 or not 0 <= min_token_prob <= 1:  # vLLM's checks
            raise ValueError(f"max_cached_requests and max_spec_factor must be >= 0 and min_token_prob in [0, 1], got "
                             f"{max_cached_requests}, {max_spec_factor} and {min_token_prob}")
        self.cache = cache_class()(max_tree_depth=max_tree_depth, max_cached_requests=max_cached_requests)
        self.num_speculative_tokens, self.max_tree_depth = num_speculative_tokens, max_tree_depth
        self.max_spec_factor, self.min_token_prob = max_spec_factor, min_token_prob

    def start(self, req_id, prompt) -> None:
        """Starts a request (its prompt's tree; `prompt` a (prompt_len,) int32 array); a cached response of a
        finished request of that id is evicted first, as vLLM does. `propose` calls it on a request's first sight."""
        if req_id in self.cache.cached_requests:
            self.cache.evict_cached_response(req_id)
        self.cache.start_request(req_id, prompt)

    def propose(self, req_id, prompt, sampled, tokens) -> np.ndarray:
        """A request's draft after an engine step: the body of vLLM's per-request loop.

        Args:
            req_id: the request's id (hashable); on first sight the request starts with `prompt` (`start`).
            prompt: (prompt_len,) int32 array, the request's prompt.
            sampled: the tokens this step wrote (int32 array or list; empty: none yet).
            tokens: (n,) int32 array, the request's tokens so far (prompt, then output); its last
                max_tree_depth are the pattern matched.

        Returns:
            (draft_len,) int64 array, at most num_speculative_tokens ids; empty: no draft.
        """
        cache = self.cache
        if req_id not in cache.active_requests:
            self.start(req_id, prompt)
        if len(sampled):
            cache.add_active_response(req_id, sampled)
        pattern = tokens[max(0, len(tokens) - self.max_tree_depth) :]
        draft = cache.speculate(req_id, pattern, max_spec_tokens=self.num_speculative_tokens,
                                max_spec_factor=self.max_spec_factor, min_token_prob=self.min_token_prob)
        return np.asarray(draft.token_ids, dtype=np.int64)

    def stop_absent(self, live) -> None:
        """Stops the started requests not in `live` (vLLM: those no longer in the batch, at the end of its call);
        their responses stay in the global tree for later requests."""
        for req_id in self.cache.active_requests - set(live):
            self.cache.stop_request(req_id)


def replay_suffix(requests, *, num_draft_tokens: int = MAX_TREE_DEPTH, max_spec_factor: float = MAX_SPEC_FACTOR,
                  memory: bool = True, costs: np.ndarray | None = None, progress: str | None = None) -> dict:
    """Replays `requests` (lookahead.bench.replay's TraceRequest) in order through one VllmSuffix, served one at a
    time as by an engine: each finished response joins the global tree before the next request starts.

    As lookahead.bench.replay's other replays: a step drafts (also before the first output token), keeps the
    prefix the recorded output follows, writes one token more; a draft is cut where the output ends. `memory`
    False: no global tree (max_cached_requests=0). `costs` prices the drafts (unsized) as replay_hf does.
    Returns the summed counts and drafting time (the per-request start not counted: a step's cost only).

    Raises:
        SuffixUnavailableError: arctic_inference does not import.
    """
    suffix = VllmSuffix(num_speculative_tokens=num_draft_tokens, max_spec_factor=max_spec_factor,
                        max_cached_requests=MAX_CACHED_REQUESTS if memory else 0)
    steps = drafted = accepted = tokens = 0
    seconds = cost = 0.0
    for serial, request in enumerate(tqdm(requests, desc=progress, disable=progress is None, leave=False)):
        output, prompt_len = request.output, request.prompt.shape[0]
        sequence = np.concatenate([request.prompt, output]).astype(np.int32)  # (prompt_len + output_len,)
        prompt = sequence[:prompt_len]
        suffix.stop_absent([])  # the previous request finished: its response stays in the global tree
        suffix.start(serial, prompt)  # per-request setup: not a step's cost
        pos = step = 0
        while pos < output.shape[0]:
            end = prompt_len + pos
            start = time.perf_counter()
            draft = suffix.propose(serial, prompt, sequence[end - step : end], sequence[:end])
            seconds += time.perf_counter() - start
            draft = draft[: output.shape[0] - pos - 1]  # the step's own token takes the last place
            kept = kept_prefix(draft, output, pos)
            step = kept + 1
            cost += costs[draft.shape[0] + 1] if costs is not None else 0.0
            steps, drafted, accepted, tokens, pos = steps + 1, drafted + draft.shape[0], accepted + kept, tokens + step, pos + step
        # vLLM proposes after the step that wrote the last tokens too (it learns the request finished later),
        # which adds them to the response; that draft is never verified
        suffix.propose(serial, prompt, sequence[prompt_len + pos - step : prompt_len + pos], sequence)
    return dict(steps=steps, drafted=drafted, accepted=accepted, tokens=tokens, seconds=seconds, cost=cost)
