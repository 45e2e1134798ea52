"""The pruning methods side by side (pruning/methods.py): each keeps exactly its documented count, q = 0 keeps
everything, EVS and uniform keep the first group whole, VidCom2 keeps a token in every frame, uniform keeps whole
groups evenly spaced; a bad method name is one sentence. VidCom2 against its definition: tests/test_vidcom2.py."""

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pruning
from engine.config import GenerationParams
from pruning.uniform import uniform_group_count

FAST = settings(max_examples=100, deadline=None)
METHODS = pruning.PRUNING_METHODS


def exact_share(total: int, q: float) -> int:
    return math.floor(total * (1 - Fraction(repr(q))))


# The counts as the docs write them (docs/architecture.md, "Pruning methods"), in exact arithmetic.
DOCUMENTED_COUNT = {
    "evs": lambda m, t, q: max(m, exact_share(t * m, q)),
    "vidcom2": lambda m, t, q: max(m, t, exact_share(t * m, q)),
    "uniform": lambda m, t, q: max(1, exact_share(t, q)) * m,
}


def per_group(mask: torch.Tensor, grid) -> list[int]:
    return pruning.tokens_kept_per_group(mask, grid).tolist()


def test_the_methods_are_evs_vidcom2_and_uniform_evs_first():
    assert METHODS == ("evs", "vidcom2", "uniform")
    assert GenerationParams().pruning_method == "evs"  # the engine's default


@FAST
@given(
    method=st.sampled_from(METHODS),
    seed=st.integers(0, 2**31 - 1),
    t=st.integers(1, 9),
    h=st.integers(1, 4),
    w=st.integers(1, 4),
    dim=st.integers(1, 6),
    q=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
    coarse=st.booleans(),
)
def test_each_method_keeps_exactly_its_documented_count(method, seed, t, h, w, dim, q, coarse):
    generator = torch.Generator().manual_seed(seed)
    if coarse:  # few distinct values: exact ties and zero vectors
        features = torch.randint(-1, 2, (t * h * w, dim), generator=generator).float()
    else:
        features = torch.randn(t * h * w, dim, generator=generator)
    mask = pruning.retention_mask(features, (t, h, w), q, method)
    expected = DOCUMENTED_COUNT[method](h * w, t, q)

    assert mask.dtype == torch.bool and mask.shape == (t * h * w,)
    assert int(mask.sum()) == pruning.kept_token_count(method, h * w, t, q) == expected
    kept = per_group(mask, (t, h, w))
    if method in ("evs", "uniform"):  # the first group rule
        assert kept[0] == h * w
    if method == "vidcom2":  # at least one token a frame, at most all of them
        assert min(kept) >= 1
    if method == "uniform":  # whole groups or nothing
        assert set(kept) <= {0, h * w}


@pytest.mark.parametrize("method", METHODS)
def test_q0_keeps_every_token(method):
    features = torch.randn(5 * 3 * 4, 8)
    assert pruning.retention_mask(features, (5, 3, 4), 0.0, method).all()
    assert pruning.kept_token_count(method, 12, 5, 0) == 60


def test_the_counts_agree_with_evs_where_each_method_allows():
    """Real grids (T <= h*w): VidCom2 keeps EVS's count; uniform keeps it whenever it is whole groups."""
    for t, m in [(64, 196), (16, 49), (8, 64)]:
        for q in (0.3, 0.5, 0.7, 0.9):
            evs = pruning.retained_token_count(m, t, q)
            assert pruning.kept_token_count("vidcom2", m, t, q) == evs
            assert pruning.kept_token_count("uniform", m, t, q) == evs // m * m
    # tiny-trained's grid, 8 groups of 2x2: at q = 0.9 EVS keeps one group (4), VidCom2 a token a frame (8)
    assert [pruning.kept_token_count(method, 4, 8, 0.9) for method in METHODS] == [4, 8, 4]


@pytest.mark.parametrize("t", [8, 6, 4])
def test_uniform_at_half_keeps_every_other_temporal_group_whole(t):
    mask = pruning.retention_mask(torch.randn(t * 6, 3), (t, 2, 3), 0.5, "uniform")
    assert per_group(mask, (t, 2, 3)) == [6, 0] * (t // 2)


def test_uniform_spreads_its_groups_over_the_video():
    assert uniform_group_count(8, 0.7) == 2
    mask = pruning.retention_mask(torch.randn(8 * 4, 3), (8, 2, 2), 0.7, "uniform")
    assert per_group(mask, (8, 2, 2)) == [4, 0, 0, 0, 4, 0, 0, 0]


def test_evs_reuses_a_dissimilarity_it_is_given():
    features = torch.randn(4 * 6, 5)
    dissimilarity = pruning.frame_dissimilarity(features, (4, 2, 3))
    assert torch.equal(
        pruning.retention_mask(features, (4, 2, 3), 0.6, "evs", dissimilarity),
        pruning.compute_retention_mask(features, (4, 2, 3), 0.6),
    )


@pytest.mark.parametrize("method", ["EVS", "fastvid", "", None, 3, ["evs"]])
def test_a_bad_method_name_is_one_sentence(method):
    with pytest.raises(ValueError) as caught:
        pruning.retention_mask(torch.randn(8, 2), (2, 2, 2), 0.5, method)
    message = str(caught.value)
    assert message == f"The pruning method must be evs, vidcom2 or uniform; got {method!r}."
    with pytest.raises(ValueError, match="^The pruning method must be"):
        pruning.kept_token_count(method, 4, 2, 0.5)


@pytest.mark.parametrize("method", METHODS)
def test_every_method_refuses_a_bad_rate_and_a_wrong_shape(method):
    with pytest.raises(ValueError, match="pruning rate"):
        pruning.retention_mask(torch.randn(8, 2), (2, 2, 2), 1.0, method)
    with pytest.raises(ValueError, match="shape"):
        pruning.retention_mask(torch.randn(7, 2), (2, 2, 2), 0.5, method)
