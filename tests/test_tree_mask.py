"""Tree topology and the sliced tree-attention mask."""
import random

import networkx as nx
import pytest
import torch

from dynasd.tree import ROOT, TreeShape, additive, ancestor_mask, parse_branching, path_to


def random_shapes(count: int, seed: int = 0) -> list[TreeShape]:
    rng = random.Random(seed)
    shapes = []
    while len(shapes) < count:
        branching = tuple(rng.randint(1, 4) for _ in range(rng.randint(1, 5)))
        if TreeShape(branching).num_nodes <= 300:
            shapes.append(TreeShape(branching))
    return shapes


def oracle_mask(parents: tuple[int, ...]) -> torch.Tensor:
    """Row i attends to j iff j is i or one of i's ancestors, computed on an explicit graph."""
    graph = nx.DiGraph()
    graph.add_nodes_from(range(len(parents)))
    graph.add_edges_from((p, i) for i, p in enumerate(parents) if p != ROOT)
    mask = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for i in range(len(parents)):
        for j in nx.ancestors(graph, i) | {i}:
            mask[i, j] = True
    return mask


def test_paper_shape_has_44_nodes_in_level_major_order():
    shape = TreeShape((4, 2, 2, 1))
    assert shape.level_sizes == (4, 8, 16, 16)
    assert shape.num_nodes == 44 and shape.depth == 4
    assert shape.levels == tuple([1] * 4 + [2] * 8 + [3] * 16 + [4] * 16)
    # children of the i-th node of a level are contiguous in the next level (parent-major)
    assert shape.children[0] == [4, 5] and shape.children[1] == [6, 7] and shape.children[ROOT] == [0, 1, 2, 3]
    assert all(shape.parents[i] < i for i in range(shape.num_nodes))


@pytest.mark.parametrize("shape", random_shapes(25), ids=lambda s: ",".join(map(str, s.branching)))
def test_mask_equals_ancestor_oracle(shape):
    assert torch.equal(ancestor_mask(shape.parents), oracle_mask(shape.parents))


@pytest.mark.parametrize("shape", random_shapes(25, seed=1), ids=lambda s: ",".join(map(str, s.branching)))
def test_slices_of_the_max_mask_are_the_masks_of_shallower_trees(shape):
    big = ancestor_mask(shape.parents)
    for depth in range(1, shape.depth + 1):
        small = TreeShape(shape.branching[:depth])
        live = shape.level_starts[depth]
        assert live == small.num_nodes
        assert shape.parents[:live] == small.parents
        assert torch.equal(big[:live, :live], ancestor_mask(small.parents))


def test_row_sums_give_position_offsets():
    # A level-l node sits l positions after the root: its mask row holds exactly l ones (itself + l-1 ancestors).
    shape = TreeShape((3, 2, 2))
    mask = ancestor_mask(shape.parents)
    assert mask.sum(dim=1).tolist() == list(shape.levels)


def test_target_rooted_fork_layout():
    fork = TreeShape((3, 1, 1), target_roots=True)
    assert fork.num_nodes == 9
    # node (level l, chain j) has index (l-1)*w + j
    assert [path_to(i, fork.parents) for i in (6, 7, 8)] == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]


def test_additive_mask_is_zero_or_minus_infinity():
    mask = ancestor_mask(TreeShape((2, 2)).parents)
    add = additive(mask, torch.float32)
    assert torch.equal(add == 0, mask) and torch.isinf(add[~mask]).all()


@pytest.mark.parametrize("text", ["", "4,,", "a,b", "0,2", "-1", "2,x"])
def test_bad_shapes_are_refused_with_a_message(text):
    with pytest.raises(ValueError):
        parse_branching(text)


def test_shape_parsing():
    assert parse_branching(" 4, 2,2 ,1") == (4, 2, 2, 1)
    with pytest.raises(ValueError):
        TreeShape(())
