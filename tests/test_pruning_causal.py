"""Causal EVS (pruning/causal.py): a group decided when it arrives equals the rule applied to the stream so far;
counts against a brute-force reading of the rule; q = 0; the first group; the kept share over long streams."""

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pruning
from pruning.causal import newest_group_mask

FAST = settings(max_examples=60, deadline=None)


def stream_features(seed: int, groups: int, h: int, w: int, dim: int = 8, still_every: int = 0) -> torch.Tensor:
    """(groups*h*w, dim) random features; with still_every, every such group repeats the one before it exactly
    (dissimilarity 0), as a codec's still frames do."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(groups, h * w, dim, generator=generator)
    if still_every:
        for group in range(1, groups):
            if group % still_every:
                rows[group] = rows[group - 1]
    return rows.reshape(groups * h * w, dim)


def brute_force(dissimilarity: torch.Tensor, q: float, window_groups: int) -> torch.Tensor:
    """The rule as docs/live.md words it, with Python sorting: group 0 whole; group t keeps its tokens among the
    K = floor(n*h*w*(1-q)) largest of the last window_groups groups (group 0 left out; ties to the earlier group
    and token), unless they did not change; q = 0 keeps everything."""
    t, h, w = dissimilarity.shape
    values = dissimilarity.reshape(t, h * w).tolist()
    mask = [[True] * (h * w)]
    for group in range(1, t):
        first = max(1, group - window_groups + 1)
        entries = [(-values[g][i], g, i) for g in range(first, group + 1) for i in range(h * w)]
        k = math.floor((group + 1 - first) * h * w * (1 - Fraction(repr(q))))
        top = {(g, i) for _, g, i in sorted(entries)[:k]}
        mask.append([q == 0 or ((group, i) in top and values[group][i] > 0) for i in range(h * w)])
    return torch.tensor(mask).reshape(-1)


def streamed(features: torch.Tensor, grid, q: float, window_groups: int = pruning.WINDOW_GROUPS):
    """Each group through CausalEVS as it would arrive: (masks, dissimilarities) concatenated."""
    t, h, w = grid
    rule = pruning.CausalEVS(q, window_groups)
    decided = [rule.add(group, (h, w)) for group in features.reshape(t, h * w, -1)]
    return torch.cat([mask for mask, _ in decided]), torch.stack([d for _, d in decided])


@FAST
@given(
    seed=st.integers(0, 10_000),
    t=st.integers(1, 14),
    h=st.integers(1, 3),
    w=st.integers(1, 3),
    q=st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99]),
    window_groups=st.integers(1, 6),
    still_every=st.sampled_from([0, 2, 3]),
)
def test_streamed_decisions_equal_the_rule_on_every_prefix_and_the_brute_force_reading(
    seed, t, h, w, q, window_groups, still_every
):
    features = stream_features(seed, t, h, w, still_every=still_every)
    masks, dissimilarity = streamed(features, (t, h, w), q, window_groups)
    assert torch.equal(dissimilarity, pruning.frame_dissimilarity(features, (t, h, w)))
    assert torch.equal(masks, brute_force(dissimilarity, q, window_groups))
    for groups in range(1, t + 1):  # the rule on a prefix decides that prefix's groups as the stream did
        prefix = pruning.causal_retention_mask(features[: groups * h * w], (groups, h, w), q, window_groups)
        assert torch.equal(prefix, masks[: groups * h * w])


def test_the_first_group_is_kept_whole_and_q_zero_keeps_everything():
    features = stream_features(1, 6, 2, 3, still_every=2)
    assert torch.equal(pruning.causal_retention_mask(features, (6, 2, 3), 0.0), torch.ones(36, dtype=torch.bool))
    assert pruning.causal_retention_mask(features, (6, 2, 3), 0.99)[:6].all()


def test_a_group_never_keeps_more_than_the_window_allows_nor_an_unchanged_token():
    # window of 2 groups of 4 tokens at q = 0.75: K = 2 for two groups, 1 for the first window of one group
    window = torch.tensor([[0.9, 0.8, 0.1, 0.0], [0.5, 0.95, 0.0, 0.2]])
    assert newest_group_mask(window, 0.75).tolist() == [False, True, False, False]  # 0.95 ranks 1st, 0.5 3rd
    assert newest_group_mask(window[1:], 0.75).tolist() == [False, True, False, False]
    # ties go to the earlier group: the newest group's 0.9 ranks after the older one's
    tied = torch.tensor([[0.9, 0.0], [0.9, 0.0]])
    assert newest_group_mask(tied, 0.75).tolist() == [False, False]
    # an unchanged token is never kept below q = 0, even where the window would have room for it
    assert newest_group_mask(torch.zeros(1, 4), 0.1).tolist() == [False] * 4
    assert newest_group_mask(torch.zeros(1, 4), 0.0).tolist() == [True] * 4


def test_decisions_are_never_revised_by_later_groups():
    features = stream_features(7, 12, 2, 2)
    early = pruning.causal_retention_mask(features[: 5 * 4], (5, 2, 2), 0.7)
    changed_later = features.clone()
    changed_later[5 * 4 :] = torch.randn(7 * 4, features.shape[1]) * 100  # the future, utterly different
    assert torch.equal(pruning.causal_retention_mask(changed_later, (12, 2, 2), 0.7)[: 5 * 4], early)


@pytest.mark.parametrize("q", [0.3, 0.5, 0.7, 0.9])
def test_over_a_long_changing_stream_the_kept_share_stays_close_to_one_minus_q(q):
    """Changes spread like a camera's noise: over 600 groups, and over every stretch of 64, about 1 - q kept."""
    h = w = 4
    features = stream_features(3, 600, h, w)
    per_group = pruning.causal_retention_mask(features, (600, h, w), q).reshape(600, h * w).sum(dim=1).double()
    assert abs(float(per_group[1:].mean()) / (h * w) - (1 - q)) < 0.02
    stretches = per_group[1:].unfold(0, 64, 1).mean(dim=1) / (h * w)
    assert float((stretches - (1 - q)).abs().max()) < 0.06


def test_a_still_stream_keeps_only_its_first_group():
    features = stream_features(4, 20, 2, 2, still_every=10_000)
    mask = pruning.causal_retention_mask(features, (20, 2, 2), 0.5).reshape(20, 4)
    assert mask[0].all() and not mask[1:].any()


def test_the_stream_refuses_a_group_of_another_grid_and_bad_settings():
    rule = pruning.CausalEVS(0.5)
    rule.add(torch.randn(4, 8), (2, 2))
    with pytest.raises(ValueError, match="same grid"):
        rule.add(torch.randn(6, 8), (2, 3))
    with pytest.raises(ValueError, match="pruning rate"):
        pruning.CausalEVS(1.0)
    with pytest.raises(ValueError, match="window_groups"):
        pruning.CausalEVS(0.5, window_groups=0)
