"""EVS layout: per-group counts, which prompt tokens survive, and positions from the unpruned layout."""

import pytest
import torch

import pruning


def test_tokens_kept_per_group_sums_to_mask():
    torch.manual_seed(1)
    grid = (4, 2, 3)
    mask = pruning.compute_retention_mask(torch.randn(24, 6), grid, 0.5)
    per_group = pruning.tokens_kept_per_group(mask, grid)
    assert per_group.dtype == torch.int64 and per_group.shape == (4,)
    assert int(per_group.sum()) == int(mask.sum())
    assert per_group[0] == 6


def test_tokens_kept_per_group_counts_each_group():
    mask = torch.tensor([1, 1, 0, 0, 0, 0, 1, 0, 1], dtype=torch.bool)
    assert pruning.tokens_kept_per_group(mask, [3, 1, 3]).tolist() == [2, 0, 2]


def test_tokens_kept_per_group_rejects_wrong_size():
    with pytest.raises(ValueError):
        pruning.tokens_kept_per_group(torch.ones(5, dtype=torch.bool), (2, 1, 3))


def test_prompt_keep_mask_keeps_text_and_places_video_keeps():
    #                 text  v     v      text  v     v     v      text
    is_video = torch.tensor([0, 1, 1, 0, 1, 1, 1, 0], dtype=torch.bool)
    retention = torch.tensor([1, 0, 0, 1, 1], dtype=torch.bool)
    keep = pruning.prompt_keep_mask(is_video, retention)
    assert keep.tolist() == [True, True, False, True, False, True, True, True]


def test_prompt_keep_mask_rejects_count_mismatch():
    is_video = torch.tensor([0, 1, 1, 0], dtype=torch.bool)
    with pytest.raises(ValueError, match="video tokens"):
        pruning.prompt_keep_mask(is_video, torch.ones(3, dtype=torch.bool))


def unpruned_positions():
    # Row 0 contiguous; rows 1-3 an MRoPE-like layout with a video in the middle.
    row0 = torch.arange(7)
    t = torch.tensor([0, 1, 1, 1, 2, 2, 4])
    h = torch.tensor([0, 1, 1, 2, 1, 2, 4])
    w = torch.tensor([0, 1, 2, 1, 1, 2, 4])
    return torch.stack([row0, t, h, w])


def test_select_positions_keeps_mrope_rows_unrenumbered():
    positions = unpruned_positions()
    keep = torch.tensor([1, 1, 0, 0, 1, 0, 1], dtype=torch.bool)
    selected = pruning.select_positions(positions[1:], keep)
    assert selected.tolist() == [[0, 1, 2, 4], [0, 1, 1, 4], [0, 1, 1, 4]]


def test_select_positions_makes_row_zero_contiguous():
    positions = unpruned_positions()
    keep = torch.tensor([1, 1, 0, 0, 1, 0, 1], dtype=torch.bool)
    selected = pruning.select_positions(positions, keep)
    assert selected[0].tolist() == [0, 1, 2, 3]
    assert selected[1:].tolist() == [[0, 1, 2, 4], [0, 1, 1, 4], [0, 1, 1, 4]]
    assert selected.dtype == positions.dtype
    assert positions[0].tolist() == list(range(7))  # input untouched


def test_select_positions_row_zero_continues_from_its_start():
    positions = unpruned_positions() + 10
    keep = torch.tensor([1, 0, 1, 0, 1, 0, 1], dtype=torch.bool)
    assert pruning.select_positions(positions, keep)[0].tolist() == [10, 11, 12, 13]


def test_select_positions_with_batch_axis():
    positions = unpruned_positions()[:, None, :].expand(4, 2, 7)
    keep = torch.tensor([1, 1, 0, 0, 1, 0, 1], dtype=torch.bool)
    selected = pruning.select_positions(positions, keep)
    assert selected.shape == (4, 2, 4)
    assert selected[0].tolist() == [[0, 1, 2, 3]] * 2
    assert selected[1, 1].tolist() == [0, 1, 2, 4]


def test_select_positions_rejects_bad_shapes():
    with pytest.raises(ValueError):
        pruning.select_positions(torch.zeros(2, 5, dtype=torch.long), torch.ones(5, dtype=torch.bool))
    with pytest.raises(ValueError):
        pruning.select_positions(torch.zeros(3, 5, dtype=torch.long), torch.ones(4, dtype=torch.bool))


def test_pipeline_end_to_end_on_a_small_prompt():
    grid = (3, 1, 2)
    features = torch.tensor([[1.0, 0.0]] * 4 + [[0.0, 1.0]] * 2)  # only the last group changes
    retention = pruning.compute_retention_mask(features, grid, 0.5)  # K = 3
    assert retention.tolist() == [True, True, False, False, True, False]
    is_video = torch.tensor([0] + [1] * 6 + [0], dtype=torch.bool)
    keep = pruning.prompt_keep_mask(is_video, retention)
    positions = torch.stack([torch.arange(8), torch.arange(8), torch.arange(8), torch.arange(8)])
    selected = pruning.select_positions(positions, keep)
    assert selected[0].tolist() == [0, 1, 2, 3, 4]
    assert selected[1].tolist() == [0, 1, 2, 5, 7]
