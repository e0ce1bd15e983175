"""References the fast code is tested against: brute force, plain Python, or the per-request classes that the
batched kernels follow."""

import itertools
import math

import numpy as np

from lookahead.draft import DOCUMENTS, MEMORY, OUTPUT, PROMPT
from lookahead.drafter import LookupDrafter
from lookahead.engine import kernels
from lookahead.index.kernels import MAX_NGRAM, count_continuations
from lookahead.integrations.vllm.proposer import LEARN_EVERY
from lookahead.policy import MATCH_BASE, SKIP_SCALE, STORE_SCALE, SUBSTITUTION_SCALE
from lookahead.request import Request
from lookahead.sizing.cost import LineCost
from lookahead.sizing.load import worth_sending
from lookahead.sizing.rules import MAX_CHANCE, MIN_GAIN, batch_draft_sizes
from lookahead.store import TokenStore


def longest_match(tokens, min_ngram, max_ngram):
    """(length, end) of the longest suffix of `tokens` that occurred earlier; most recent occurrence."""
    n = len(tokens)
    for ngram in range(min(max_ngram, n - 1), min_ngram - 1, -1):
        suffix = list(tokens[n - ngram :])
        for end in range(n - 2, ngram - 2, -1):
            if list(tokens[end - ngram + 1 : end + 1]) == suffix:
                return ngram, end
    return 0, -1


def store_continuation(sequences, query, min_ngram, max_ngram, num_draft_tokens):
    """(match_len, continuation) of the most recent occurrence of the longest suffix of `query`
    (min_ngram..max_ngram tokens) in any of `sequences`, cut at that sequence's end."""
    for g in range(min(max_ngram, len(query)), min_ngram - 1, -1):
        gram = list(query[-g:])
        for seq in reversed(sequences):
            seq = list(seq)
            for end in range(len(seq) - 1, g - 2, -1):
                if seq[end - g + 1 : end + 1] == gram:
                    return g, seq[end + 1 : end + 1 + num_draft_tokens]
    return 0, []


def trie_weights(candidates, eos=(), vocab_limit=2**31):
    """{path (tuple of tokens): summed weight} over candidates (token list, weight), each cut before an EOS
    or an id at or above vocab_limit."""
    weights = {}
    for tokens, weight in candidates:
        path = ()
        for token in _cut(tokens, eos, vocab_limit):
            path += (token,)
            weights[path] = weights.get(path, 0.0) + weight
    return weights


def _cut(tokens, eos, vocab_limit):
    """tokens up to the first EOS or id at or above vocab_limit."""
    kept = []
    for token in tokens:
        if token in eos or token >= vocab_limit:
            break
        kept.append(token)
    return kept


def heaviest_path(candidates, vocab_limit=2**31):
    """The path that follows the heaviest child at each level; among equals the child the earliest candidate created.

    Candidates are cut before an id at or above vocab_limit, as the trie cuts them."""
    candidates = [(_cut(tokens, (), vocab_limit), weight) for tokens, weight in candidates]
    path = ()
    while True:
        weights = {}  # next token -> summed weight, in order of the first candidate through it
        for tokens, weight in candidates:
            if len(tokens) > len(path) and tuple(tokens[: len(path)]) == path:
                weights[tokens[len(path)]] = weights.get(tokens[len(path)], 0.0) + weight
        if not weights:
            return path
        best = max(weights.values())
        path += (next(t for t, w in weights.items() if w == best),)


def suffix_candidates(tokens, min_ngram, max_ngram, walk, substitution_walk, depth, match_base, substitution_scale, skip_scale=0.0,
                      source_len=0, first_reach=0, first_only=False):
    """The candidates (continuation, weight) DraftTrie.add_suffix_candidates adds, found by brute force, in the order added."""
    starts, _, _ = suffix_search(tokens, min_ngram, max_ngram, walk, substitution_walk, depth, match_base, substitution_scale,
                                 skip_scale, source_len, first_reach, first_only)
    return [(list(tokens)[start : start + depth], weight) for start, weight in starts]


def suffix_search(tokens, min_ngram, max_ngram, walk, substitution_walk, depth, match_base, substitution_scale, skip_scale=0.0,
                  source_len=0, first_reach=0, first_only=False):
    """What DraftTrie.add_suffix_candidates adds and returns, by brute force: ([(start, weight)] in the order added,
    candidate i being tokens[start : start + depth]; the longest match; the longest substitution match)."""
    tokens = list(tokens)
    n = len(tokens)
    if n < 2:
        return [], 0, 0

    def agree(end, query_end):  # trailing tokens equal at end and query_end, at most max_ngram
        m = 0
        while m < max_ngram and m <= end and tokens[end - m] == tokens[query_end - m]:
            m += 1
        return m

    def occurrences(query_end):  # earlier ends of the min_ngram-gram ending at query_end, most recent first
        gram = tokens[query_end - min_ngram + 1 : query_end + 1]
        if query_end < min_ngram - 1:
            return []
        return [e for e in range(query_end - 1, min_ngram - 2, -1) if tokens[e - min_ngram + 1 : e + 1] == gram]

    starts = []
    length, end = longest_match(tokens, min_ngram, max_ngram)
    if length and end < source_len:  # the longest match occurs in the source only: its first occurrence there
        reached = [e for e in occurrences(n - 1)[:first_reach] if agree(e, n - 1) >= length]
        if reached:
            starts.append((reached[-1] + 1, match_base**length))
            if first_only and reached[-1] + 1 + depth <= n:
                return starts, length, 0
    walked = [(e, agree(e, n - 1)) for e in occurrences(n - 1)[:walk]]
    starts += [(e + 1, match_base**m) for e, m in walked]
    if length and max((m for _, m in walked), default=0) < length:
        starts.append((end + 1, match_base**length))
    substituted = 0
    for e in occurrences(n - 2)[:substitution_walk]:
        m = agree(e, n - 2)
        if m >= 2 and skip_scale > 0 and e + 2 < n - 1 and tokens[e + 2] == tokens[n - 1]:  # a skipped token
            starts.append((e + 3, skip_scale * match_base**m))
        elif m >= 2:
            starts.append((e + 2, substitution_scale * match_base**m))
        if m >= 2:
            substituted = max(substituted, m)
    return starts, length, substituted


def chain_reference(tokens, prompt_len, documents, memory, *, min_ngram, max_ngram, num_draft_tokens, draft_factor, walk,
                    substitution_walk, first_reach, first_only=True, eos=(), vocab_limit=2**31):
    """(token ids, match_len, sources) of the chain LookupDrafter.propose drafts without a prediction table, by brute
    force: suffix_search's candidates, then, where the request's longest match is shorter than max_ngram - 1, the
    stores' (documents, then memory: lists of sequences) longest matches of its last max_ngram tokens weighing
    STORE_SCALE as much; every candidate cut before an eos id or an id >= vocab_limit; the heaviest path of them,
    at most ceil(draft_factor * anchor) tokens (the anchor: the longer of the matches, 0 where no candidate holds a
    token); a token's source that of the first candidate through its path (PROMPT or OUTPUT by where it was copied
    from, DOCUMENTS, MEMORY)."""
    tokens = list(tokens)
    starts, match_len, substituted = suffix_search(tokens, min_ngram, max_ngram, walk, substitution_walk, num_draft_tokens,
                                                   MATCH_BASE, SUBSTITUTION_SCALE, SKIP_SCALE, prompt_len, first_reach, first_only)
    candidates = [(tokens[start : start + num_draft_tokens], weight,
                   [PROMPT if pos < prompt_len else OUTPUT for pos in range(start, start + num_draft_tokens)])
                  for start, weight in starts]  # (tokens, weight, each token's source)
    if match_len < max_ngram - 1:
        for sequences, source in ((documents, DOCUMENTS), (memory, MEMORY)):
            length, continuation = store_continuation(sequences, tokens[-max_ngram:], min_ngram, max_ngram, num_draft_tokens)
            candidates.append((continuation, STORE_SCALE * MATCH_BASE**length, [source] * len(continuation)))
            match_len = max(match_len, length)
    candidates = [(_cut(ids, eos, vocab_limit), weight, sources) for ids, weight, sources in candidates]
    anchor = max(match_len, substituted) if any(ids for ids, _, _ in candidates) else 0
    path = heaviest_path([(ids, weight) for ids, weight, _ in candidates])[: min(num_draft_tokens, math.ceil(draft_factor * anchor))]
    sources = [next(src[d] for ids, _, src in candidates if tuple(ids[: d + 1]) == path[: d + 1]) for d in range(len(path))]
    return list(path), anchor if path else 0, sources


def likeliest_reference(expected: dict, keep_chance: float) -> dict:
    """{path: estimate} of every node: its parent's estimate times keep_chance for the heaviest of its siblings, the
    others in proportion to their weight, the siblings together at most 1."""
    chance = {(): 1.0}
    for path in sorted(expected, key=len):
        siblings = [w for p, w in expected.items() if len(p) == len(path) and p[:-1] == path[:-1]]
        total, heaviest = sum(siblings), max(siblings)
        chance[path] = chance[path[:-1]] * expected[path] / total * min(1.0, keep_chance * total / heaviest)
    del chance[()]
    return chance


def told_reference(parents, token_ids, nodes: int, written: list[int], kept: int, estimates, table, bands):
    """TreeChances.observe's learning in Python: (told nodes' (source, band) -> [count, summed written - estimate], each
    node on the path of written[:kept + 1]). Told: the first `nodes`, and where written holds the model's own token
    after the kept ones, every later node whose parent is one of them or the root."""
    on = []
    for i, p in enumerate(parents):
        depth = 1 if p < 0 else on[p] + 1 if on[p] else 0
        on.append(depth if 0 < depth <= min(kept + 1, len(written)) and token_ids[i] == written[depth - 1] else 0)
    cells = {}
    for i, p in enumerate(parents):
        if i < nodes or (len(written) > kept and p < nodes):
            cell = cells.setdefault((int(bool(table[i])), sum(edge <= estimates[i] for edge in bands)), [0, 0.0])
            cell[0] += 1
            cell[1] += (1.0 if on[i] else 0.0) - estimates[i]
    return cells, [d > 0 for d in on]


def reference_record(rows: dict, inputs, predicted, k):
    """{input id: its k predicted ids}, the last input of an id winning."""
    for t, ids in zip(inputs, predicted):
        rows[t] = list(ids[:k])
    return rows


def reference_ranks(rows: dict, tokens, start, k):
    counts = [0] * (k + 1)
    for i in range(max(start, 1), len(tokens)):
        row = rows.get(tokens[i - 1])
        if row is None:
            continue
        counts[row.index(tokens[i]) if tokens[i] in row else k] += 1
    return counts


def reference_expansion(rows: dict, root, chances, budget, max_depth, eos, vocab_limit):
    """Probabilities of the `budget` likeliest table paths from root (at most max_depth tokens, none through an
    eos id or an id >= vocab_limit), likeliest first: {path: probability}."""
    paths = {}

    def visit(token, path, p):
        if len(path) == max_depth:
            return
        for r, t in enumerate(rows.get(token, [])):
            if t < 0 or chances[r] <= 0 or t in eos or t >= vocab_limit:
                continue
            paths[path + (t,)] = p * chances[r]
            visit(t, path + (t,), p * chances[r])

    visit(root, (), 1.0)
    return paths


class KeepRate:
    """The per-token keep chance of one request's drafts, per anchor match length: a plain-Python mirror of
    lookahead.engine.kernels' keep rate (learn_row, settle_row, keep_chance), what they are tested against.

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

    def __init__(self, max_ngram: int, *, fade: float = 0.9, max_watched: int = 8):
        # Python floats, not arrays: a handful of scalar updates per step, where numpy's per-call cost would dominate.
        self.kept = [0.0] * (max_ngram + 1)  # per anchor length: faded count of kept tokens
        self.failed = [0.0] * (max_ngram + 1)  # and of failures
        self.overall = [1.0, 1.0]  # faded (kept, failed) over all lengths, prior 1 each: 0.5 at first
        self.fade = fade
        self.watched: list[list] = []  # [match_len, unverified draft ids, position, how many counted]
        self.max_watched = max_watched  # the oldest rest is dropped past this

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
            self.watched = self.watched[-(self.max_watched - 1) :] + [[match_len, draft_ids[agree:], position + agree, 0]]

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


class ReferenceProposer:
    """The proposer's rules row by row with the core's classes (a Request per request: LookupDrafter and its
    keep rate, itself tested against a plain-Python mirror in tests/test_request.py; one TokenStore as memory;
    batch_draft_sizes; worth_sending under the cost's h and d):
    what kernels.advance, batch_sizes and commit must reproduce for all rows at once."""

    def __init__(self, k, max_model_len, cost, eos_token_id):  # cost: fixed_cost_tokens (h), draft_cost_tokens (d)
        self.k, self.max_model_len, self.cost, self.eos = k, max_model_len, cost, eos_token_id
        self.memory = TokenStore()
        self.requests, self.sent, self.steps = {}, {}, 0
        self.last_chance = {}  # request key -> its last chain's first token's chance, in parts of kernels.CHANCE_SCALE

    def step(self, rows, sampled):
        for key in [k for k in self.requests if k not in {r for r, _, _ in rows}]:
            self.memory_later.append(self.requests.pop(key).drafter.index.tokens.copy())
            self.last_chance.pop(key, None)
        chains, keys = [], []
        for (key, prompt, output), written in zip(rows, sampled):
            request = self.requests.get(key)
            if request is None:
                request = self.requests[key] = Request(LookupDrafter(num_draft_tokens=self.k, memory=self.memory,
                                                                     eos_token_id=self.eos, cost_aware=False), sized=True)
                request.start(prompt)
            n = len(prompt) + len(output)
            if request.last is not None:
                sent = self.sent.get(key, [])
                if n == request.position + len(written) and written:
                    request.verified(written, checked=len(sent))
                else:
                    request.discard()
            if n > len(request.drafter.index):
                request.extend((list(prompt) + list(output))[len(request.drafter.index):n])
            room = min(self.k, self.max_model_len - n)
            keys.append((key, request, room if written else 0))
        decode = [(key, request, room) for key, request, room in keys if room > 0]
        h, d, n_decode = self.cost.fixed_cost_tokens, self.cost.draft_cost_tokens, len(decode)
        line = LineCost(h + d)  # once a draft is sent, D is paid: the sizer's fixed part

        def worth(chances):  # the sizes the sizer takes, or none where they would not gain load.MIN_GAIN
            sizes = batch_draft_sizes(chances, cost=line)
            expected = sum(min(p, MAX_CHANCE) for row, size in zip(chances, sizes) for p in row[:size])
            return sizes if worth_sending(n_decode, expected, sum(sizes), h, d) else [0] * len(sizes)

        def chances_of(request, chain):  # its tokens' chances: the anchor's continuations in the request and memory
            counts, ends, grams = np.zeros(len(chain) + 1, dtype=np.int64), np.zeros(MAX_NGRAM + 1, dtype=np.int64), request.drafter.max_ngram
            index = request.drafter.index.buffers()
            m, path = min(max(chain.match_len, 1), grams), chain.token_ids.astype(np.int64)
            count_continuations(index, index.tokens[: index.n], m, path, len(chain), kernels.REACH, ends, counts)
            with self.memory.reading() as memory:
                count_continuations(memory, index.tokens[max(0, index.n - grams) : index.n], m, path, len(chain),
                                            kernels.REACH, ends, counts)
            out = np.zeros(len(chain))
            kernels.token_chances(counts, len(chain), request.keep_chance(chain), chain.match_len, out)
            return out.tolist()

        bar = n_decode / (h + d + n_decode)  # a row whose last chain's first token was below bar / GATE: not drafted
        drafting = [(key, request, room) for key, request, room in decode if self.steps % LEARN_EVERY == 0 or (
            bar < MAX_CHANCE and kernels.GATE * self.last_chance.get(key, kernels.CHANCE_SCALE) > bar * kernels.CHANCE_SCALE)]
        out = {}
        if drafting:
            chains = {key: (request, request.propose(room)) for key, request, room in drafting}
            chances = {key: chances_of(request, chain) for key, (request, chain) in chains.items() if len(chain)}
            self.last_chance.update({key: int(row[0] * kernels.CHANCE_SCALE) for key, row in chances.items()})
            sizes = worth([chances.get(key, []) for key, _, _ in decode])
            for (key, _, _), size in zip(decode, sizes):
                if key in chains:
                    request, chain = chains[key]
                    if len(chain):
                        request.commit(chain, size)
                    out[key] = chain.token_ids[:size].tolist()
        self.sent = {key: ids for key, ids in out.items() if ids}
        self.steps += 1
        for tokens in self.memory_later:
            self.memory.add(tokens)
        self.memory_later = []
        return [out.get(key, []) for key, _, _ in rows]

    memory_later: list = []


def greedy_batch_sizes(chances, fixed_cost_tokens, trust=1.0):
    """batch_draft_sizes' rule written plainly: every drafted token, likeliest first (ties: row, then
    place), taken while its chance (times `trust`) clears G / (fixed_cost_tokens + T)."""
    tokens = sorted((-trust * min(p, MAX_CHANCE), r, j) for r, row in enumerate(chances) for j, p in enumerate(row))
    sizes, expected, verified = [0] * len(chances), float(len(chances)), float(len(chances))
    for gain, r, _ in tokens:
        if -gain <= expected / (fixed_cost_tokens + verified):
            break
        sizes[r], expected, verified = sizes[r] + 1, expected - gain, verified + 1
    return sizes


def kept_distribution(a: float, m: int) -> list[float]:
    """P(a row keeps k of m verified drafted tokens), k = 0..m: each kept with chance a after the ones before."""
    return [a**k * (1 - a) for k in range(m)] + [a**m]


def brute_static_sizes(chances, lengths, remaining, rates, h):
    """Every block width tried, the rows behind's least gain by enumerating their joint outcomes."""
    steps = [r / e for r, e in zip(remaining, rates)]
    behind = [i for i, n in enumerate(steps) if n >= max(steps) - 1]
    best, best_worth = 0, -1.0
    for drafted in range(max(lengths) + 1):
        depth = [min(n, drafted) for n in lengths]
        expected = sum(sum(k * p for k, p in enumerate(kept_distribution(a, m))) + 1 for a, m in zip(chances, depth))
        least = 0.0
        for outcome in itertools.product(*(range(depth[i] + 1) for i in behind)):
            chance = math.prod(kept_distribution(chances[i], depth[i])[k] for i, k in zip(behind, outcome))
            least += chance * min(outcome)
        worth = (h * (1 + least) + expected) / (h + len(chances) * (drafted + 1))
        if drafted == 0 and len(chances) == 1:
            worth *= 1 + MIN_GAIN  # one row: chain_size's rule, a draft beats a plain step by MIN_GAIN
        if worth > best_worth + 1e-12:
            best, best_worth = drafted, worth
    return [min(n, best) for n in lengths]
