import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead import TokenIndex
from lookahead import trie as trie_module
from lookahead.trie import DraftTrie
from tests import reference
from tests.reference import likeliest_reference


def test_warm_up_compiles_every_kernel():
    assert trie_module.warm_up() == 4
    for kernel in (trie_module.add_paths, trie_module.add_suffix_candidates, trie_module.add_longest_match,
                   trie_module.heaviest_nodes, trie_module.heaviest_path):
        assert kernel.signatures, f"{kernel.__name__} was not compiled"


def node_weights(trie: DraftTrie) -> dict:
    """{path from the root: weight} of every node of the trie."""
    ids, parents, weights = trie.nodes()
    paths = []
    for token, parent in zip(ids.tolist(), parents.tolist()):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    return dict(zip(paths, weights.tolist()))


candidate_lists = st.lists(
    st.tuples(st.lists(st.integers(0, 3), min_size=0, max_size=6), st.sampled_from([0.25, 1.0, 2.0, 4.0])),
    min_size=0,
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(candidates=candidate_lists, depth=st.integers(1, 6), eos=st.sampled_from([(), (3,)]), max_tree_nodes=st.integers(1, 40),
       depth_decay=st.sampled_from([1.0, 0.9, 0.5]), vocab_limit=st.sampled_from([trie_module.NO_VOCAB_LIMIT, 3, 2]))
def test_trie_weights_tree_and_path_equal_brute_force(candidates, depth, eos, max_tree_nodes, depth_decay, vocab_limit):
    trie = DraftTrie()
    trie.eos = np.array(eos, dtype=np.int64)
    trie.vocab_limit = vocab_limit
    for tokens, weight in candidates:  # one at a time from its own source, as stores are added
        trie.add(np.array(tokens, dtype=np.int64), np.array([0]), np.array([weight]), depth)
    expected = reference.trie_weights([(tokens[:depth], w) for tokens, w in candidates], eos, vocab_limit)
    assert node_weights(trie) == pytest.approx(expected)
    assert trie.tree(len(trie) + 5)[0].shape[0] == len(expected)
    # tree(): the max_tree_nodes heaviest after the depth discount, closed under parent, parents first
    ids, parents = trie.tree(max_tree_nodes, depth_decay)
    assert ids.shape[0] == min(max_tree_nodes, len(expected))
    assert all(p < i for i, p in enumerate(parents.tolist()))
    paths = []
    for token, parent in zip(ids.tolist(), parents.tolist()):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    assert len(set(paths)) == len(paths) and all(path in expected for path in paths)
    score = {p: w * depth_decay ** len(p) for p, w in expected.items()}
    assert sorted((score[p] for p in paths), reverse=True) == pytest.approx(sorted(score.values(), reverse=True)[: len(paths)])
    # path(): the heaviest child at each level
    path = tuple(trie.path(depth).tolist())
    for i in range(len(path)):
        siblings = [p for p in expected if len(p) == i + 1 and p[:i] == path[:i]]
        assert expected[path[: i + 1]] == max(expected[p] for p in siblings)
    assert not [p for p in expected if len(p) == len(path) + 1 and p[:-1] == path]  # it ends at a leaf


def created(trie: DraftTrie) -> dict:
    """{path: the node's creation number (1: the first node after the root)}."""
    ids, parents, _ = trie.nodes()
    paths = []
    for token, parent in zip(ids.tolist(), parents.tolist()):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    return {path: i + 1 for i, path in enumerate(paths)}


@settings(max_examples=200, deadline=None)
@given(candidates=candidate_lists, depth=st.integers(1, 6), max_tree_nodes=st.integers(1, 40), keep_chance=st.sampled_from([0.3, 0.7, 0.99]),
       first_class=st.integers(1, 12), errors=st.lists(st.sampled_from([-0.3, -0.05, 0.0, 0.02, 0.2]), min_size=6, max_size=6))
def test_likeliest_nodes_come_likeliest_first_and_every_prefix_is_a_tree(candidates, depth, max_tree_nodes, keep_chance, first_class,
                                                                          errors):
    trie = DraftTrie()
    for tokens, weight in candidates:
        trie.add(np.array(tokens, dtype=np.int64), np.array([0]), np.array([weight]), depth)
    estimate = likeliest_reference(node_weights(trie), keep_chance)
    bands, errors = np.array([0.1, 0.5]), np.array(errors).reshape(2, 3)
    node = created(trie)
    # The band of the kernel's own estimate (equal to the reference's but for rounding, which at a band's edge
    # picks the other band): every node's, from a tree of all of them.
    ids, parents, _, all_estimates, _, _ = trie.likeliest(len(estimate), keep_chance, None)
    paths = []
    for token, parent in zip(ids.tolist(), parents.tolist()):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    banded = dict(zip(paths, all_estimates.tolist()))
    expected = {}  # the corrected chance: estimate + its (class, band) error, within [0, 1] and its parent's chance
    for path in sorted(estimate, key=len):
        corrected = estimate[path] + errors[int(node[path] >= first_class), np.searchsorted(bands, banded[path], side="right")]
        expected[path] = min(max(corrected, 0.0), expected.get(path[:-1], 1.0))
    for correction, want in ((None, estimate), ((first_class, bands, errors), expected)):
        ids, parents, chances, estimates, table, _ = trie.likeliest(max_tree_nodes, keep_chance, correction)
        assert ids.shape[0] == chances.shape[0] == estimates.shape[0] == table.shape[0] == min(max_tree_nodes, len(estimate))
        assert all(p < i for i, p in enumerate(parents.tolist()))  # parents first: every prefix is closed under parent
        paths = []
        for token, parent in zip(ids.tolist(), parents.tolist()):
            paths.append((paths[parent] if parent >= 0 else ()) + (token,))
        assert chances.tolist() == pytest.approx([want[p] for p in paths])
        assert estimates.tolist() == pytest.approx([estimate[p] for p in paths])
        assert table.tolist() == [correction is not None and node[p] >= first_class for p in paths]
        assert (np.diff(chances) <= 0).all()  # likeliest first
        assert sorted(chances.tolist(), reverse=True) == pytest.approx(sorted(want.values(), reverse=True)[: len(paths)])


def test_a_chains_likeliest_nodes_have_the_chain_rules_chances():
    trie = DraftTrie()
    trie.add(np.array([5, 6, 7], dtype=np.int64), np.array([0]), np.array([1.0]), 3)
    assert trie.likeliest(8, 0.5)[2].tolist() == pytest.approx([0.5, 0.25, 0.125])  # keep_chance ** j
    trie.add(np.array([9], dtype=np.int64), np.array([0]), np.array([1.0]), 1)  # an equal sibling: the two share the parent's whole chance
    ids, _, chances, _, _, _ = trie.likeliest(8, 0.9)
    assert ids.tolist()[:2] == [5, 9] and chances.tolist()[:2] == pytest.approx([0.5, 0.5])


@settings(max_examples=200, deadline=None)
@given(candidates=candidate_lists, later=candidate_lists, max_tree_nodes=st.integers(1, 40), depth_decay=st.sampled_from([1.0, 0.9, 0.5]))
def test_first_class_nodes_rank_before_later_ones(candidates, later, max_tree_nodes, depth_decay):
    """tree() and path() with first_class: the nodes created before it come first (a sized step's lookup nodes
    before the prediction table's), each class by its own score, the tree still closed under parent."""
    trie = DraftTrie()
    for tokens, weight in candidates:
        trie.add(np.array(tokens, dtype=np.int64), np.array([0]), np.array([weight]), 6)
    first_class = len(trie) + 1  # node i + 1 is entry i of nodes(); the root is node 0
    for tokens, weight in later:
        trie.add(np.array(tokens, dtype=np.int64), np.array([0]), np.array([weight]), 6)
    weights = node_weights(trie)
    creation = {path: i + 1 for i, path in enumerate(weights)}  # dicts keep nodes() order: creation order
    ids, parents = trie.tree(max_tree_nodes, depth_decay, first_class=first_class)
    paths = []
    for token, parent in zip(ids.tolist(), parents.tolist()):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    assert all(p < i for i, p in enumerate(parents.tolist())) and len(paths) == min(max_tree_nodes, len(weights))
    score = {p: w * depth_decay ** len(p) for p, w in weights.items()}
    early = sorted((p for p in weights if creation[p] < first_class), key=lambda p: -score[p])
    taken_early = [p for p in paths if creation[p] < first_class]
    assert len(taken_early) == min(len(paths), len(early))  # no later node while an earlier one is left out
    assert sorted(score[p] for p in taken_early) == pytest.approx(sorted(score[p] for p in early[: len(taken_early)]))
    path = tuple(trie.path_tokens(trie.path_nodes(6, first_class=first_class)).tolist())
    for i in range(len(path)):  # at each level: an earlier child if there is one, the heaviest of its class
        siblings = [p for p in weights if len(p) == i + 1 and p[:i] == path[:i]]
        cls = [p for p in siblings if creation[p] < first_class] or siblings
        assert path[: i + 1] in cls and weights[path[: i + 1]] == max(weights[p] for p in cls)


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), min_size=0, max_size=60),
    min_ngram=st.integers(1, 3),
    walk=st.sampled_from([1, 3, 100]),
    substitution_walk=st.sampled_from([0, 2, 100]),
    depth=st.integers(1, 5),
    skip_scale=st.sampled_from([0.0, 1.0]),
    vocab_limit=st.sampled_from([trie_module.NO_VOCAB_LIMIT, 3]),
    source_len=st.integers(0, 60),
    first_reach=st.sampled_from([0, 2, 100]),
    first_only=st.booleans(),
)
def test_suffix_candidates_equal_brute_force(tokens, min_ngram, walk, substitution_walk, depth, skip_scale, vocab_limit, source_len,
                                             first_reach, first_only):
    index = TokenIndex(min_ngram=min_ngram, max_ngram=4)
    index.extend(tokens)
    trie = DraftTrie()
    trie.vocab_limit = vocab_limit
    longest, substituted = trie.add_suffix_candidates(
        index.buffers(), depth, walk=walk, substitution_walk=substitution_walk, match_base=2.0, substitution_scale=0.25,
        skip_scale=skip_scale, source_len=source_len, first_reach=first_reach, first_only=first_only,
    )
    candidates = reference.suffix_candidates(tokens, min_ngram, 4, walk, substitution_walk, depth, 2.0, 0.25, skip_scale,
                                             source_len, first_reach, first_only)
    assert node_weights(trie) == pytest.approx(reference.trie_weights(candidates, vocab_limit=vocab_limit))
    assert longest == reference.longest_match(tokens, min_ngram, 4)[0]
    # the heaviest path's ties go to the earliest added candidate
    path = tuple(trie.path(depth).tolist())
    assert path == reference.heaviest_path(candidates, vocab_limit=vocab_limit)


def test_the_first_occurrence_of_a_source_only_match_leads_the_chain():
    index = TokenIndex(min_ngram=1, max_ngram=4)
    index.extend([1, 2, 3, 0, 1, 2, 4, 5, 1, 2, 4, 6, 1, 2])  # [1, 2]: followed by 3 first, then twice by 4
    trie = DraftTrie()
    trie.add_suffix_candidates(index.buffers(), 3, walk=8, substitution_walk=4, match_base=2.0, substitution_scale=0.25,
                               source_len=len(index), first_reach=64, first_only=True)
    assert trie.path(3).tolist() == [3, 0, 1]
    trie.clear()  # with a source of 5 tokens [1, 2] occurs after it too: no first occurrence
    trie.add_suffix_candidates(index.buffers(), 3, walk=8, substitution_walk=4, match_base=2.0, substitution_scale=0.25,
                               source_len=5, first_reach=64, first_only=True)
    assert trie.path(3).tolist()[0] == 4
    trie.clear()  # out of reach (the third most recent): the oldest of two reached is followed by 4
    trie.add_suffix_candidates(index.buffers(), 3, walk=8, substitution_walk=4, match_base=2.0, substitution_scale=0.25,
                               source_len=len(index), first_reach=2, first_only=True)
    assert trie.path(3).tolist()[0] == 4


def test_depth_decay_buys_a_branch_before_a_long_chain_ends():
    trie = DraftTrie()
    trie.add(np.arange(10, 30, dtype=np.int64), np.array([0]), np.array([1.0]), 20)  # one long candidate
    trie.add(np.array([10, 11, 99], dtype=np.int64), np.array([0]), np.array([0.8]), 20)  # a branch after two tokens
    assert 99 not in trie.tree(20)[0].tolist()  # undiscounted: the 20 nodes of the long candidate (weight 1.8 and 1)
    ids, parents = trie.tree(20, 0.9)
    assert 99 in ids.tolist() and ids.tolist()[:3] == [10, 11, 12]


def test_tree_rejects_a_depth_decay_outside_0_1():
    with pytest.raises(ValueError, match="depth_decay"):
        DraftTrie().tree(4, 1.5)
