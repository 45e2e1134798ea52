"""Still patches skipped before the vision tower (pruning/still.py, GenerationParams.skip_still_patches): the rule
on bare tensors, the tower fed exactly the units that changed with their own positions (and computing for them what
the whole group computes with the rest masked out of its attention), EVS choosing among the encoded tokens only,
and a live session deciding as an upload does."""

import numpy as np
import pytest
import torch
from transformers.vision_utils import get_vision_window_index

import pruning
from engine import Engine, EngineConfig, GenerationParams
from engine.loading import kernels
from engine.prompt.unpruned import unpruned_prompt
from live_helpers import play, write_lossless
from test_attention import varlen_models  # noqa: F401 (a fixture)
from test_live_models import sampled

QWEN = ["tiny-random", "tiny-random-qwen2.5-vl", "tiny-random-qwen3.5"]
UNIT_PIXELS = {"tiny-random": 32, "tiny-random-qwen2.5-vl": 28, "tiny-random-qwen3.5": 32}  # patch * merge
FPS = 2


# --- the rule on bare tensors ---------------------------------------------------------------------------------
def units_of(values: list[list[float]]) -> torch.Tensor:
    """(T, U, 4, 3, 2, 4) unit pixels whose every value in unit u of group t is values[t][u]."""
    return torch.tensor(values, dtype=torch.float32)[:, :, None, None, None, None].expand(-1, -1, 4, 3, 2, 4)


def test_a_unit_drifting_slowly_is_encoded_once_it_moved_the_threshold_since_it_was_last_encoded():
    # Unit 0 brightens by 1.5 levels a group, unit 1 never changes; RLT's comparison with the group before would
    # never encode unit 0 again (1.5 < 4 at every step).
    values = [[1.5 * t, 7.0] for t in range(8)]
    encoded = pruning.still_units(units_of(values), torch.ones(3), threshold=4.0)
    assert encoded[:, 0].tolist() == [True, False, False, True, False, False, True, False]
    assert encoded[:, 1].tolist() == [True] + [False] * 7


def test_a_unit_changes_when_one_of_its_patches_does_in_one_frame_of_one_channel():
    still = units_of([[0.0]])[0]
    moved = still.clone()
    moved[0, 3, 1, 1] = 13.0  # unit 0's patch 3, channel 1, frame 1: all 4 pixels; 1/24 of the unit's values
    levels = torch.tensor([1.0, 2.0, 1.0])  # channel 1's values are 2 levels each
    assert pruning.unit_change(moved, still, levels).tolist() == [pytest.approx(13.0 * 2 / 3)]  # channels averaged
    assert pruning.still_units(torch.stack([still, moved]), levels, threshold=8.6)[1].tolist() == [True]
    assert pruning.still_units(torch.stack([still, moved]), levels, threshold=8.7)[1].tolist() == [False]


def test_the_causal_rule_decides_as_the_whole_stream_does():
    generator = torch.Generator().manual_seed(0)
    units = torch.randint(0, 3, (12, 5, 4, 3, 2, 4), generator=generator).float().cumsum(0)
    causal = pruning.CausalStill(6.0, torch.ones(3))
    assert torch.equal(
        torch.stack([causal.add(group) for group in units]), pruning.still_units(units, torch.ones(3), 6.0)
    )


def test_carried_rows_point_at_the_last_encoded_unit_at_each_place():
    encoded = torch.tensor([[True, True, True], [False, True, False], [True, False, False]])
    # encoded rows in raster order: (0,0) 0, (0,1) 1, (0,2) 2, (1,1) 3, (2,0) 4
    assert pruning.carried_rows(encoded).tolist() == [0, 1, 2, 0, 3, 2, 4, 3, 2]
    with pytest.raises(ValueError):
        pruning.carried_rows(~encoded)


@pytest.mark.parametrize("q", [0.0, 0.5, 0.7, 0.9])
def test_evs_keeps_its_count_among_the_candidates_only(q):
    generator = torch.Generator().manual_seed(1)
    T, h, w = 6, 3, 4
    dissimilarity = torch.rand(T, h, w, generator=generator)
    dissimilarity[0] = float("inf")
    candidates = torch.rand(T * h * w, generator=generator) > 0.6
    candidates[: h * w] = True  # the first group is encoded whole
    mask = pruning.retention_mask_from_dissimilarity(dissimilarity, q, candidates)
    count = min(pruning.retained_token_count(h * w, T, q), int(candidates.sum()))
    assert int(mask.sum()) == count and not bool((mask & ~candidates).any()) and bool(mask[: h * w].all())
    kept, dropped = dissimilarity.reshape(-1)[mask], dissimilarity.reshape(-1)[candidates & ~mask]
    assert dropped.numel() == 0 or float(kept.min()) >= float(dropped.max())
    features = torch.randn(T * h * w, 8, generator=generator)
    for method in ("vidcom2", "uniform"):  # they choose as without candidates, then lose what is not one
        alone = pruning.retention_mask(features, (T, h, w), q, method)
        assert torch.equal(
            pruning.retention_mask(features, (T, h, w), q, method, candidates=candidates), alone & candidates
        )


# --- the vision tower fed the units that changed ------------------------------------------------------------------
def moving_square(unit: int, steps: list[tuple[int, int]]) -> np.ndarray:
    """Frames of 4x4 units of `unit` pixels: a still landscape with a 0.6-unit square at unit (row, col) of each
    step, one step per temporal group of 2 frames."""
    y, x = np.mgrid[0 : 4 * unit, 0 : 4 * unit]
    background = np.stack([40 + 3 * y % 200, 90 + ((x + y) // 5 % 2) * 100, 200 - 2 * x % 150], axis=-1).astype(
        np.uint8
    )
    frames = []
    for row, col in steps:
        frame = background.copy()
        side = int(0.6 * unit)
        frame[row * unit + 3 : row * unit + 3 + side, col * unit + 3 : col * unit + 3 + side] = [220, 20, 30]
        frames += [frame, frame]
    return np.stack(frames)


STEPS = [(1, 1), (1, 2), (1, 2), (3, 3), (3, 3), (0, 0)]
# The units each group changes against the pixels last encoded at their place (the first group whole).
CHANGED = [None, {(1, 1), (1, 2)}, set(), {(1, 2), (3, 3)}, set(), {(3, 3), (0, 0)}]


def expected_units() -> torch.Tensor:
    encoded = torch.zeros(len(STEPS), 16, dtype=torch.bool)
    encoded[0] = True
    for group, changed in enumerate(CHANGED[1:], start=1):
        for row, col in changed:
            encoded[group, 4 * row + col] = True
    return encoded


@pytest.mark.parametrize("name", QWEN)
def test_the_vision_tower_is_given_exactly_the_changed_units_at_their_own_positions(name, tiny_cache_dir, tmp_path):
    frames = moving_square(UNIT_PIXELS[name], STEPS)
    video = write_lossless(tmp_path / "square.mkv", frames, FPS)
    seen = []
    config = EngineConfig(model=name, device="cpu", cache_dir=tiny_cache_dir)
    with Engine(config) as engine:
        visual = engine.loaded.model.model.visual
        hook = visual.register_forward_pre_hook(
            lambda module, args, kwargs: seen.append((args[0].clone(), kwargs["position_ids"].clone())),
            with_kwargs=True,
        )
        params = GenerationParams(pruning_rate=0.0, max_new_tokens=1, skip_still_patches=True)
        answer = engine.submit(video=video, question="What moves?", params=params).result(120)
        hook.remove()
        medium = unpruned_prompt(
            engine.loaded, engine.family, sampled(frames, FPS), "What moves?", [], engine.system_prompt, 224 * 224
        ).media[0]
    encoded = expected_units()
    assert medium.grid_thw == (len(STEPS), 4, 4)
    ((pixels, positions),) = seen
    rows = encoded.reshape(-1).repeat_interleave(4)  # a unit's 4 patches are consecutive rows
    torch.testing.assert_close(pixels.float(), medium.pixel_values[rows].float(), atol=0, rtol=0)
    # Each patch at its place in the full 8x8 patch grid: unit (r, c)'s patches are (2r + i, 2c + j), i and j in {0, 1}.
    want = [
        (2 * (unit // 4) + i, 2 * (unit % 4) + j)
        for _group, unit in torch.nonzero(encoded).tolist()
        for i in (0, 1)
        for j in (0, 1)
    ]
    assert [tuple(p) for p in positions.tolist()] == want
    stats = answer.stats
    assert stats["vision_patches_encoded"] == 4 * int(encoded.sum()) < stats["vision_patches_total"] == 4 * 16 * 6
    assert stats["video_tokens_kept"] == int(encoded.sum())  # q = 0 keeps every encoded token, and only those


def masked_kernel(keep: torch.Tensor):
    """The varlen attention of a whole group with the keys where keep (tokens,) bool is False masked out."""

    def kernel(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, scale):
        lengths = cu_seq_q.diff()
        segment = torch.repeat_interleave(torch.arange(lengths.numel()), lengths.long())
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        blocked = (segment[:, None] != segment[None, :]) | ~keep[None, :]
        # A query whose every key is masked (a group with nothing kept) gets 0, and the values of masked keys are
        # zeroed, so that such rows (NaN after an empty softmax) never reach a kept one.
        weights = scores.masked_fill(blocked, float("-inf")).softmax(-1).nan_to_num(0.0)
        return torch.einsum("hqk,khd->qhd", weights, v.masked_fill(~keep[:, None, None], 0.0))

    return kernel


@pytest.mark.parametrize("name", ["tiny-random", "tiny-random-qwen2.5-vl"])
def test_the_shorter_sequence_computes_what_the_whole_group_does_with_the_rest_masked_out(
    name,
    varlen_models,  # noqa: F811 (test_attention's fixture)
    tiny_models,
    monkeypatch,
):
    """Every op of the towers but attention is row by row, so the units encoded alone must equal the same units of
    the whole groups when attention may not look at the units left out (Qwen2.5-VL: in its windows too)."""
    loaded = varlen_models(name)
    family = tiny_models(name)[1]
    frames = moving_square(UNIT_PIXELS[name], STEPS)
    medium = unpruned_prompt(loaded, family, sampled(frames, FPS), "What moves?", [], "", 224 * 224).media[0]
    encoded = expected_units()
    visual = loaded.model.model.visual
    keep = encoded.reshape(-1)
    if hasattr(visual, "window_size"):  # the tower runs its units in window order
        order, _ = pruning_window_order(visual, medium)
        keep = keep[order]
    monkeypatch.setattr(kernels, "kernel", masked_kernel(keep.repeat_interleave(4)))
    with torch.inference_mode():
        whole = family.encode_media(loaded.model, [medium])[0]
        monkeypatch.setattr(kernels, "kernel", masked_kernel(torch.ones(int(encoded.sum()) * 4, dtype=torch.bool)))
        alone = family.encode_units(loaded.model, [medium], [encoded])[0]
    torch.testing.assert_close(alone.embeds, whole.embeds[encoded.reshape(-1)], atol=1e-5, rtol=1e-5)
    for level, level_alone in zip(whole.deepstack, alone.deepstack):
        torch.testing.assert_close(level_alone, level[encoded.reshape(-1)], atol=1e-5, rtol=1e-5)
    unmasked = family.encode_media(tiny_models(name)[0].model, [medium])[0]  # the sdpa model: every unit seen
    assert (unmasked.embeds[encoded.reshape(-1)] - alone.embeds).abs().max() > 1e-3  # the context did shrink


def pruning_window_order(visual, medium):
    """(Qwen2.5-VL's order of the medium's units in its windowed blocks, the windows' bounds)."""
    return get_vision_window_index(
        medium.grid_thw_patches[None], visual.spatial_merge_size, visual.window_size, visual.patch_size
    )


# --- live ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny-random", "tiny-random-qwen2.5-vl"])
def test_a_live_session_skips_the_units_an_upload_of_its_frames_skips(name, tiny_cache_dir, tmp_path):
    frames = moving_square(UNIT_PIXELS[name], STEPS)
    video = write_lossless(tmp_path / "square.mkv", frames, FPS)
    params = GenerationParams(pruning_rate=0.0, max_new_tokens=1, skip_still_patches=True)
    with Engine(EngineConfig(model=name, device="cpu", cache_dir=tiny_cache_dir)) as engine:
        upload = engine.submit(video=video, question="What moves?", params=params).result(120)
        with engine.open_live(params) as live:
            play(live, frames, fps=FPS)
            stats = live.stats()
    assert stats["vision_patches_encoded"] == upload.stats["vision_patches_encoded"] == 4 * int(expected_units().sum())
    assert stats["video_tokens_kept"] == upload.stats["video_tokens_kept"]  # q = 0: every encoded token, only those


def test_a_tower_that_encodes_whole_groups_only_ignores_the_switch(tiny_cache_dir, tmp_path):
    frames = moving_square(32, STEPS)
    video = write_lossless(tmp_path / "square.mkv", frames, FPS)
    config = EngineConfig(model="tiny-random-nemotron-omni", device="cpu", cache_dir=tiny_cache_dir)
    with Engine(config) as engine:
        assert engine.model_info["skips_still_patches"] is False
        params = GenerationParams(pruning_rate=0.0, max_new_tokens=1, skip_still_patches=True)
        stats = engine.submit(video=video, question="What moves?", params=params).result(120).stats
    # Groups 2 and 4 repeat the group before exactly: only those are not encoded, and every token is in the prompt.
    assert stats["vision_patches_encoded"] == stats["vision_patches_total"] * 4 // 6
    assert stats["video_tokens_kept"] == stats["video_tokens_total"]
