import numpy as np
import pytest

from lookahead import Draft, DraftStats, LookupDrafter, TokenStore


def test_propose_copies_what_followed_the_longest_most_recent_match():
    drafter = LookupDrafter(num_draft_tokens=4, min_ngram=1, max_ngram=4)
    drafter.reset([7, 1, 2, 3, 8])
    drafter.extend([1, 2, 4, 9, 1, 2])  # the output repeats itself: [1, 2] most recently followed by 4
    draft = drafter.propose()
    assert draft.token_ids.tolist() == [4, 9, 1, 2]
    assert draft.parents.tolist() == [-1, 0, 1, 2]
    assert draft.match_len == 2
    drafter.extend([3])  # the suffix [1, 2, 3] occurred at the start, followed by 8
    assert drafter.propose().token_ids.tolist() == [8, 1, 2, 4]


def test_a_match_found_only_in_the_prompt_copies_its_first_occurrence():
    # [1, 2] is followed by 3 where the prompt introduced it, then twice by 4
    prompt = [1, 2, 3, 5, 1, 2, 4, 6, 1, 2, 4, 0, 1, 2]
    drafter = LookupDrafter(num_draft_tokens=4, memory=False)
    drafter.reset(prompt)
    assert drafter.propose().token_ids.tolist() == [3, 5, 1, 2]  # the chain copies the first occurrence
    tree = drafter.propose_tree()  # the tree hedges: both continuations, the first one's ahead
    assert tree.token_ids[tree.parents == -1].tolist() == [3, 4]
    # once the output holds the match too, the model is repeating itself: the most recent occurrence wins
    drafter.reset(prompt[:4])
    drafter.extend(prompt[4:])
    assert drafter.propose().token_ids.tolist() == [4, 0, 1, 2]


def test_propose_respects_num_draft_tokens_and_returns_the_empty_draft_without_a_match():
    drafter = LookupDrafter(num_draft_tokens=8, memory=False)
    drafter.reset([1, 2, 3, 1, 2])
    assert len(drafter.propose()) == 3  # one token left to copy after [1, 2]
    assert len(drafter.propose(num_draft_tokens=1)) == 1
    assert len(drafter.propose(num_draft_tokens=0)) == 0
    drafter.reset([1, 2, 3])
    empty = drafter.propose()
    assert len(empty) == 0 and empty.token_ids.dtype == np.int64


def test_draft_length_scales_with_the_match_length():
    drafter = LookupDrafter(num_draft_tokens=16, draft_factor=2)
    drafter.reset([5, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 7])
    assert drafter.propose().token_ids.tolist() == [8, 9]  # a 1-token match drafts 2
    drafter.extend([8])
    assert drafter.propose().token_ids.tolist() == [9, 10, 7, 8]  # a 2-token match drafts 4


def test_drafts_stop_before_eos():
    drafter = LookupDrafter(num_draft_tokens=8, eos_token_id=[9, 5])
    drafter.reset([1, 2, 3, 4, 5, 6, 1, 2])
    assert drafter.propose().token_ids.tolist() == [3, 4]


def test_drafts_stop_before_ids_outside_the_vocabulary_from_any_source():
    # A regression: document or memory ids >= the model's vocabulary reached the model and crashed it.
    memory = TokenStore()
    memory.add([60, 61, 62, 63, 700, 64])
    drafter = LookupDrafter(num_draft_tokens=8, memory=memory, vocab_size=300)
    drafter.documents.add([50, 51, 52, 999, 53])  # straight into the library: not checked there
    drafter.reset([1, 2, 3, 40, 301, 41, 5, 50, 51, 52])
    assert len(drafter.propose()) == 0  # the document continues with 999
    drafter.extend([7, 60, 61, 62])
    assert drafter.propose().token_ids.tolist() == [63]  # memory continues with 63, 700
    drafter.extend([9, 2, 3, 40])
    assert len(drafter.propose()) == 0  # its own prompt continues with 301 (a prompt the model could not take)
    assert len(drafter.propose_tree()) == 0
    drafter.vocab_size = None
    assert drafter.propose().token_ids.tolist() == [301, 41, 5, 50, 51, 52, 7, 60]


def test_add_document_refuses_ids_outside_a_known_vocabulary():
    drafter = LookupDrafter()
    drafter.add_document([50, 51, 52, 999])  # vocabulary unknown: accepted, and never drafted past 298 later
    drafter.vocab_size = 300
    with pytest.raises(ValueError, match=r"document token id 999 at position 3 .*vocab_size=300"):
        drafter.add_document([50, 51, 52, 999])
    drafter.add_document([50, 51, 52, 299])
    for bad in (0, -1, 1.5, True, "300"):
        with pytest.raises(ValueError, match="vocab_size"):
            LookupDrafter(vocab_size=bad)


def test_reset_forgets_the_previous_sequence_and_stats():
    drafter = LookupDrafter(memory=False)
    drafter.reset([1, 2, 3, 1, 2])
    drafter.stats.record(3, 2)
    drafter.reset([4, 5])
    assert drafter.stats.steps == 0
    assert len(drafter.propose()) == 0


def test_stats_arithmetic_and_bad_records():
    stats = DraftStats()
    stats.record(4, 4)
    stats.record(4)
    stats.record_accepted(1)
    assert (stats.steps, stats.drafted, stats.accepted, stats.tokens) == (2, 8, 5, 7)
    assert stats.tau == 3.5
    with pytest.raises(ValueError, match="drafted=4"):
        stats.record_accepted(5)


def test_draft_chain_parents():
    assert Draft.chain(np.array([5, 6, 7])).parents.tolist() == [-1, 0, 1]


def test_draft_is_chain():
    chain = Draft.chain(np.arange(5))
    assert chain.is_chain and chain.prefix(3).is_chain and chain.prefix(0).is_chain
    assert Draft.chain(np.arange(300)).is_chain  # past the shared parents: its own
    assert Draft(np.arange(3), np.array([-1, 0, 1])).is_chain  # a chain's parents, not the shared array's view
    assert not Draft(np.arange(3), np.array([-1, 0, 0])).is_chain
    assert not Draft(np.arange(3), np.array([-1, -1, 1])).is_chain
    shared = Draft.chain(np.arange(8)).parents.base
    assert not Draft(np.arange(3), shared[2:5]).is_chain  # a view of the shared parents not from its start: [1, 2, 3]
    assert not Draft(np.arange(3), shared[0:6:2]).is_chain  # nor at their stride: [-1, 1, 3]


def root_paths(draft):
    """Every root-to-node path of a draft tree, as tuples of token ids."""
    paths = []
    for token, parent in zip(draft.token_ids.tolist(), draft.parents.tolist()):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    return set(paths)


def test_a_much_longer_match_in_a_document_outweighs_the_prompts_first_occurrence():
    drafter = LookupDrafter(num_draft_tokens=2, memory=False)
    drafter.add_document([40, 41, 42, 43, 44, 45, 7, 50, 51])
    drafter.reset([7, 30, 31, 40, 41, 42, 43, 44, 45, 7])  # the prompt matches [7] only, the document 7 tokens
    assert drafter.propose().token_ids.tolist() == [50, 51]


def test_tree_holds_the_chain_and_branches_to_other_occurrences():
    drafter = LookupDrafter(num_draft_tokens=4, draft_factor=4, memory=False)
    drafter.reset([5, 1, 2, 6, 7])
    drafter.extend([1, 2, 8, 9, 1, 2])
    chain = drafter.propose()
    tree = drafter.propose_tree()
    assert chain.token_ids.tolist() == [8, 9, 1, 2]
    assert tuple(chain.token_ids.tolist()) in root_paths(tree)
    # other occurrences of [1, 2] continue with 6 and with 8: both are children of the root
    roots = sorted(tree.token_ids[tree.parents == -1].tolist())
    assert roots == [6, 8]
    assert all(p < i for i, p in enumerate(tree.parents.tolist()))


def test_a_hedged_chain_and_its_grown_tree_equal_propose_tree_from_one_search():
    rng = np.random.default_rng(1)
    drafter = LookupDrafter(memory=False)
    drafter.reset(rng.integers(0, 6, 300))
    for step in range(20):
        room = int(rng.integers(1, 40))
        for nodes in (1, 7, 64):
            tree = drafter.propose_tree(room, max_tree_nodes=nodes)
            chain = drafter.propose(room, hedged=True)
            grown = drafter._grow_tree(nodes)
            assert grown.token_ids.tolist() == tree.token_ids.tolist() and grown.parents.tolist() == tree.parents.tolist()
            assert grown.match_len == tree.match_len == chain.match_len
            assert not len(chain) or int(chain.token_ids[0]) in tree.token_ids[tree.parents == -1].tolist()  # the heaviest first node
        drafter.extend(rng.integers(0, 6, int(rng.integers(1, 4))))
        with pytest.raises(RuntimeError, match="_grow_tree drafts from the last propose"):
            drafter._grow_tree(8)  # the sequence changed: the candidates are stale
    drafter.propose(8)
    with pytest.raises(RuntimeError, match="_grow_tree"):
        drafter._grow_tree(8)  # a plain chain's candidates are not a tree's


def test_chain_follows_the_continuation_most_occurrences_agree_on():
    drafter = LookupDrafter(num_draft_tokens=2, draft_factor=2, memory=False)
    # [3] is followed by 4 twice and, most recently, by 9 once (in the output: no first occurrence decides)
    drafter.reset([3, 4, 0])
    drafter.extend([3, 4, 1, 3, 9, 2, 3])
    assert drafter.propose().token_ids.tolist() == [4, 1]
    # a longer match outweighs frequency: [2, 3] occurred once, followed by 7
    drafter.reset([3, 4, 0])
    drafter.extend([3, 4, 1, 2, 3, 7, 5, 2, 3])
    assert drafter.propose().token_ids.tolist()[0] == 7


def test_after_a_replaced_token_the_draft_resumes_copying():
    # the model wrote 9 where the source has 3 (never seen before: no suffix match)
    drafter = LookupDrafter(num_draft_tokens=4, memory=False)
    drafter.reset([1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 9])
    draft = drafter.propose()
    assert draft.token_ids.tolist() == [4, 5, 6, 7]
    assert draft.match_len == 2  # the two tokens before the replaced one
    assert tuple(draft.token_ids.tolist()) in root_paths(drafter.propose_tree())


def test_after_a_skipped_token_the_draft_resumes_copying_after_it():
    # the source breaks a line (8) between 3 and 4; the model wrote 1 2 3 4 without it.
    # A 1-token match of 4 elsewhere (4 0) must not win, nor re-drafting 4 as a substitution.
    drafter = LookupDrafter(num_draft_tokens=4, memory=False)
    drafter.reset([1, 2, 3, 8, 4, 5, 6, 7, 4, 0, 1, 2, 3, 4])
    assert drafter.propose().token_ids.tolist() == [5, 6, 7, 4]


def test_tree_respects_max_tree_nodes_and_keeps_siblings_distinct():
    rng = np.random.default_rng(0)
    drafter = LookupDrafter(memory=False)
    drafter.reset(rng.integers(0, 4, 500))
    for max_tree_nodes in (1, 5, 64):
        tree = drafter.propose_tree(max_tree_nodes=max_tree_nodes)
        assert 1 <= len(tree) <= max_tree_nodes
        pairs = list(zip(tree.parents.tolist(), tree.token_ids.tolist()))
        assert len(pairs) == len(set(pairs))


def random_case(rng):
    """A drafter with random options, documents and memory, and what a brute-force reference needs of them:
    (drafter, prompt, documents' sequences, memory's sequences, options). Small vocabularies and copied spans make
    matches of every length, in the prompt, the output, the documents and memory."""
    vocab = rng.choice([3, 6, 12, 40])
    min_ngram = rng.randint(1, 3)
    max_ngram = rng.choice([min_ngram, min_ngram + 1, rng.randint(min_ngram, 8), 16])

    def text(length, source=()):  # random tokens, with spans of `source` (or of itself) copied in
        out = []
        while len(out) < length:
            pool = list(source) or out
            if pool and rng.random() < 0.5:
                start = rng.randrange(len(pool))
                out += pool[start : start + rng.randint(1, 12)]
            else:
                out.append(rng.randrange(vocab))
        return out[:length]

    prompt = text(rng.randint(0, 60))
    documents = [text(rng.randint(1, 30), prompt) for _ in range(rng.choice([0, 0, 1, 2]))]
    memory_sequences = [text(rng.randint(1, 30), prompt) for _ in range(rng.choice([0, 1, 3]))]
    memory = TokenStore(min_ngram=min_ngram, max_ngram=max_ngram) if rng.random() < 0.8 else None
    for sequence in memory_sequences if memory is not None else ():
        memory.add(sequence)
    eos = rng.choice([None, [rng.randrange(vocab)], [rng.randrange(vocab), rng.randrange(vocab)]])
    options = dict(min_ngram=min_ngram, max_ngram=max_ngram, num_draft_tokens=rng.randint(1, 24),
                   draft_factor=rng.choice([0.5, 1.0, 2.5, 16.0]))
    drafter = LookupDrafter(**options, memory=memory if memory is not None else False, eos_token_id=eos, predictions=False)
    for document in documents:
        drafter.documents.add(document)  # straight into the library: ids past vocab_size are the drafter's to cut
    drafter.vocab_size = rng.choice([None, None, max(1, vocab - rng.randint(0, 2))])
    drafter.chain_walk = rng.choice([(8, 4), (1, 0), (0, 2), (3, 1)])  # measurement code sets these: propose reads them
    drafter.first_reach = rng.choice([64, 0, 1, 3])
    options.update(eos=tuple(eos or ()), vocab_limit=drafter.vocab_size or 2**31, first_reach=drafter.first_reach)
    return drafter, prompt, documents, memory_sequences if memory is not None else [], options, text


@pytest.mark.parametrize("seed", range(8))
def test_chains_equal_a_brute_force_reference(seed):
    """propose's chains (one engine.chain.draft_chain call, the kernel the engine's rows call too) and hedged chains
    (a tree's candidates) equal tests/reference.py's brute force, token, match_len and source, over random
    prompts, outputs, documents, memory, n-gram bounds, draft factors, room, EOS ids, vocabulary sizes and walks."""
    import random

    from tests.reference import chain_reference

    rng = random.Random(seed)
    for case in range(40):
        drafter, prompt, documents, memory, options, text = random_case(rng)
        drafter.reset(prompt)
        tokens = list(prompt)
        for step in range(rng.randint(1, 5)):
            room = rng.choice([None, rng.randint(0, options["num_draft_tokens"] + 2)])
            limit = options["num_draft_tokens"] if room is None else min(room, options["num_draft_tokens"])
            for hedged, walk, first_only in ((False, drafter.chain_walk, True), (True, drafter.tree_walk, False)):
                draft = drafter.propose(room, hedged=hedged)
                expected = ([], 0, []) if limit == 0 else chain_reference(
                    tokens, len(prompt), documents, memory, **{**options, "num_draft_tokens": limit}, walk=walk[0],
                    substitution_walk=walk[1], first_only=first_only)
                got = (draft.token_ids.tolist(), draft.match_len, draft.sources.tolist())
                assert got == expected, (seed, case, step, hedged)
                assert draft.is_chain and draft.token_ids.dtype == np.int64
            drafter.propose(room)  # a plain chain searched no tree: nothing grows from it, and it read no table
            if limit:
                with pytest.raises(RuntimeError, match="_grow_tree"):
                    drafter._grow_tree(8)
                assert not drafter._read_table and drafter._lookup_nodes == len(drafter._trie) + 1
            new = text(rng.randint(1, 8), rng.choice([tokens, *documents, *memory]))  # the output copies from any source
            drafter.extend(new)
            tokens += new
