"""EVS math: exact kept-token counts, dissimilarity, and the global top-K retention mask."""

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pruning

FAST = settings(max_examples=100, deadline=None)


def unit_rows(*rows):
    return torch.tensor(rows, dtype=torch.float32)


E1, E2 = [1.0, 0.0], [0.0, 1.0]


# --- counts ---------------------------------------------------------------------------------------


def test_count_is_exact_where_float_arithmetic_is_one_short():
    assert math.floor(10 * 100 * (1 - 0.8)) == 199  # the trap
    assert pruning.retained_token_count(100, 10, 0.8) == 200


def test_count_q_zero_keeps_all():
    assert pruning.retained_token_count(64, 7, 0.0) == 448
    assert pruning.retained_token_count(64, 7, 0) == 448


def test_count_never_below_one_group():
    assert pruning.retained_token_count(10, 3, 0.99) == 10
    assert pruning.retained_token_count(10, 1, 0.5) == 10


@FAST
@given(
    q=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
    tokens_per_frame=st.integers(1, 5000),
    num_frames=st.integers(1, 400),
)
def test_count_equals_exact_rational_floor(q, tokens_per_frame, num_frames):
    exact = math.floor(tokens_per_frame * num_frames * (1 - Fraction(repr(q))))
    assert pruning.retained_token_count(tokens_per_frame, num_frames, q) == max(tokens_per_frame, exact)


@FAST
@given(percent=st.integers(0, 99), tokens_per_frame=st.integers(1, 5000), num_frames=st.integers(1, 400))
def test_count_on_slider_percentages_matches_integer_arithmetic(percent, tokens_per_frame, num_frames):
    total = tokens_per_frame * num_frames
    expected = max(tokens_per_frame, total * (100 - percent) // 100)
    assert pruning.retained_token_count(tokens_per_frame, num_frames, percent / 100) == expected


# --- pruning rate validation ----------------------------------------------------------------------


BAD_RATES = [-0.1, 1.0, 1.5, math.nan, math.inf, -math.inf, "0.5", True, None, 10**400]
BAD_RATE_IDS = [repr(q)[:12] for q in BAD_RATES]


@pytest.mark.parametrize("q", BAD_RATES, ids=BAD_RATE_IDS)
def test_bad_rate_raises_one_clear_sentence(q):
    with pytest.raises(ValueError) as caught:
        pruning.validate_pruning_rate(q)
    message = str(caught.value)
    assert message.startswith("The pruning rate must be") and message.endswith(".")
    assert message.count(". ") == 0


@pytest.mark.parametrize("q", BAD_RATES, ids=BAD_RATE_IDS)
def test_bad_rate_rejected_by_count_and_mask(q):
    with pytest.raises(ValueError, match="pruning rate"):
        pruning.retained_token_count(4, 2, q)
    with pytest.raises(ValueError, match="pruning rate"):
        pruning.compute_retention_mask(torch.randn(8, 3), (2, 2, 2), q)


def test_good_rate_returns_float():
    assert pruning.validate_pruning_rate(0) == 0.0 and isinstance(pruning.validate_pruning_rate(0), float)
    assert pruning.validate_pruning_rate(0.999) == 0.999


# --- dissimilarity --------------------------------------------------------------------------------


def test_dissimilarity_known_vectors():
    # Group 0 = [e1, e1, e1]; group 1 = [e1 (same), -e1 (opposite), e2 (orthogonal)].
    features = unit_rows(E1, E1, E1, E1, [-1.0, 0.0], E2) * 3.0
    dissimilarity = pruning.frame_dissimilarity(features, (2, 1, 3))
    assert dissimilarity.shape == (2, 1, 3) and dissimilarity.dtype == torch.float32
    assert torch.isposinf(dissimilarity[0]).all()
    torch.testing.assert_close(dissimilarity[1, 0], torch.tensor([0.0, 2.0, 1.0]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("grid", [(3, 2, 2), [3, 2, 2], torch.tensor([3, 2, 2])], ids=["tuple", "list", "tensor"])
def test_dissimilarity_accepts_grid_forms(grid):
    dissimilarity = pruning.frame_dissimilarity(torch.randn(12, 5), grid)
    assert dissimilarity.shape == (3, 2, 2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dissimilarity_is_float32_for_any_input_dtype(dtype):
    # 300**2 overflows float16, so this also checks the norms are taken after the float32 cast.
    features = torch.full((8, 4), 300.0, dtype=dtype)
    dissimilarity = pruning.frame_dissimilarity(features, (2, 2, 2))
    assert dissimilarity.dtype == torch.float32
    torch.testing.assert_close(dissimilarity[1], torch.zeros(2, 2), atol=1e-6, rtol=0)


def test_dissimilarity_zero_vectors_are_finite():
    features = torch.zeros(6, 4)
    features[1] = 1.0  # group 0 mixes zero and non-zero; group 1 is all zero
    dissimilarity = pruning.frame_dissimilarity(features, (2, 1, 3))
    assert torch.isfinite(dissimilarity[1]).all()
    assert dissimilarity[1, 0].tolist() == [0.0, 0.5, 0.0]  # zero->zero is "no change"


def test_dissimilarity_of_identical_random_tokens_is_exactly_zero():
    torch.manual_seed(2)
    features = torch.randn(16, 33).repeat(3, 1)
    assert (pruning.frame_dissimilarity(features, (3, 4, 4))[1:] == 0).all()


def test_dissimilarity_rejects_wrong_row_count():
    with pytest.raises(ValueError, match="shape"):
        pruning.frame_dissimilarity(torch.randn(7, 3), (2, 2, 2))


# --- retention mask -------------------------------------------------------------------------------


def test_mask_exactly_k_and_group_zero_kept():
    torch.manual_seed(0)
    mask = pruning.compute_retention_mask(torch.randn(5 * 3 * 4, 8), (5, 3, 4), 0.55)
    assert mask.dtype == torch.bool and mask.shape == (60,)
    assert int(mask.sum()) == pruning.retained_token_count(12, 5, 0.55)
    assert mask[:12].all()


def test_mask_ties_go_to_earlier_raster_index():
    # hw=4, T=3. Group 1 vs 0: [0, 1, 0, 1]; group 2 vs 1: [1, 0, 1, 0] (all exact: unit vectors).
    features = unit_rows(E1, E1, E1, E1, E1, E2, E1, E2, E2, E2, E2, E2)
    dissimilarity = pruning.frame_dissimilarity(features, (3, 2, 2)).reshape(-1)
    assert dissimilarity[4:].tolist() == [0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    # K = floor(12 * 0.6) = 7: group 0, then 3 of the 4 tied ones at raster 5, 7, 8, 10.
    mask = pruning.compute_retention_mask(features, (3, 2, 2), 0.4)
    assert mask.nonzero().flatten().tolist() == [0, 1, 2, 3, 5, 7, 8]


def test_mask_identical_frames_keep_group_zero_and_earliest_tokens():
    frame = torch.randn(6, 5)
    features = frame.repeat(4, 1)  # T=4, hw=6, every later group identical to group 0
    q = 0.6
    k = pruning.retained_token_count(6, 4, q)
    assert k == 9
    mask = pruning.compute_retention_mask(features, (4, 2, 3), q)
    assert mask.nonzero().flatten().tolist() == list(range(k))


def test_mask_single_group_keeps_all():
    assert pruning.compute_retention_mask(torch.randn(6, 3), (1, 2, 3), 0.9).all()


def test_mask_q_zero_keeps_all():
    features = torch.randn(4, 3).repeat(3, 1)
    assert pruning.compute_retention_mask(features, (3, 2, 2), 0.0).all()


def test_mask_is_global_not_per_group():
    # Group 1 repeats group 0; group 2 changes everything. K = floor(12 * 0.7) = 8 = group 0 + group 2.
    group0 = unit_rows(E1, E1, E1, E1)
    group2 = unit_rows(E2, E2, E2, E2)
    features = torch.cat([group0, group0, group2])
    mask = pruning.compute_retention_mask(features, (3, 2, 2), 0.3)
    assert pruning.tokens_kept_per_group(mask, (3, 2, 2)).tolist() == [4, 0, 4]


def test_mask_accepts_half_precision():
    features = torch.randn(2 * 2 * 2, 4).to(torch.bfloat16)
    mask = pruning.compute_retention_mask(features, torch.tensor([2, 2, 2]), 0.5)
    assert int(mask.sum()) == 4


@FAST
@given(
    seed=st.integers(0, 2**31 - 1),
    t=st.integers(1, 5),
    h=st.integers(1, 4),
    w=st.integers(1, 4),
    dim=st.integers(1, 4),
    q=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
    coarse=st.booleans(),
)
def test_mask_properties(seed, t, h, w, dim, q, coarse):
    generator = torch.Generator().manual_seed(seed)
    if coarse:  # few distinct values: many exact ties and zero vectors
        features = torch.randint(-1, 2, (t * h * w, dim), generator=generator).float()
    else:
        features = torch.randn(t * h * w, dim, generator=generator)
    mask = pruning.compute_retention_mask(features, (t, h, w), q)
    dissimilarity = pruning.frame_dissimilarity(features, (t, h, w)).reshape(-1)

    assert int(mask.sum()) == pruning.retained_token_count(h * w, t, q)
    assert mask[: h * w].all()
    kept, dropped = dissimilarity[mask], dissimilarity[~mask]
    if dropped.numel():
        assert kept.min() >= dropped.max()
        # Among equal values, every kept token comes before every dropped one.
        kept_index = mask.nonzero().flatten()
        dropped_index = (~mask).nonzero().flatten()
        tied = kept[:, None] == dropped[None, :]
        assert (kept_index[:, None] < dropped_index[None, :])[tied].all()


def test_mask_from_precomputed_dissimilarity_matches():
    torch.manual_seed(3)
    features = torch.randn(4 * 3 * 5, 8)
    for q in (0.0, 0.3, 0.75):
        dissimilarity = pruning.frame_dissimilarity(features, (4, 3, 5))
        assert torch.equal(
            pruning.retention_mask_from_dissimilarity(dissimilarity, q),
            pruning.compute_retention_mask(features, (4, 3, 5), q),
        )


# --- the old name ---------------------------------------------------------------------------------


def test_import_evs_is_the_pruning_package_under_its_old_name_for_one_release():
    import importlib

    import evs

    with pytest.warns(DeprecationWarning, match="now `pruning`"):
        importlib.reload(evs)
    assert evs.__all__ and all(getattr(evs, name) is getattr(pruning, name) for name in evs.__all__)
    assert set(evs.__all__) <= set(pruning.__all__)
