"""MRoPE positions: taken from the unpruned layout, never renumbered; text after the video continues from
the unpruned maximum + 1; a Qwen3-VL group that keeps zero tokens keeps its timestamp text."""

import torch

import pruning
from engine.config import FrameSampling
from engine.families.base import VideoInputs
from engine.families.qwen import Qwen3VL, Qwen25VL
from engine.prompt.pruned import prune_prompt
from engine.prompt.unpruned import unpruned_prompt
from engine.reading.video import read_video

FRAME_SAMPLING = FrameSampling(fps=4.0, max_frames=8, max_pixels_per_frame=224 * 224)


def prepared(tiny_models, name, path, question="What moves?"):
    loaded, family = tiny_models(name)
    video = read_video(path, FRAME_SAMPLING, max_seconds=60, max_bytes=10**8, timeout_s=60)
    prompt = unpruned_prompt(loaded, family, video, question, [], "You are a helpful assistant.", 224 * 224)
    return loaded, family, video, prompt


def test_qwen3_full_positions_match_stock_rope_index(tiny_models, clip):
    loaded, family, video, prompt = prepared(tiny_models, "tiny-random", clip("moving_object"))
    ids = prompt.input_ids[None]
    mm_types = (ids == loaded.model.config.video_token_id).int() * 2
    grids = prompt.media[0].grid_thw_patches[None].clone()
    stock, _ = loaded.model.model.get_rope_index(ids, mm_types, video_grid_thw=grids)
    assert torch.equal(stock[:, 0], prompt.positions)


def test_qwen25_hand_worked_long_clip_positions():
    """T=6 groups of 2x2 tokens, 1 s per group, 2 tokens per second: t offsets 0, 2, ..., 10.
    Original Qwen rule: text after the video starts at the video's max position + 1 = start + 10 + 1."""
    family = Qwen25VL(temporal_patch=2, tokens_per_second=2)
    is_video = torch.tensor([False] * 3 + [True] * 24 + [False] * 2)
    pos = family.full_positions(is_video, [VideoInputs(torch.zeros(0), torch.zeros(3), (6, 2, 2), 1.0)])
    assert pos[:, :3].tolist() == [[0, 1, 2]] * 3
    t = [3 + 2 * g for g in range(6) for _ in range(4)]
    h = [3 + r for _ in range(6) for r in (0, 0, 1, 1)]
    w = [3 + c for _ in range(6) for c in (0, 1, 0, 1)]
    assert pos[:, 3:27].tolist() == [t, h, w]
    assert pos[:, 27:].tolist() == [[14, 15]] * 3  # stock transformers >= 5.3 would give [5, 6]


def test_qwen25_truncates_after_multiplying():
    family = Qwen25VL(temporal_patch=2, tokens_per_second=2)
    # 0.7 s per group: 1.4, 2.8, 4.2 -> 1, 2, 4 (truncating 0.7 first would give 0, 0, 0)
    assert family.temporal_offsets(4, 0.7).tolist() == [0, 1, 2, 4]


def test_qwen3_groups_each_restart_temporal_position():
    family = Qwen3VL(temporal_patch=2)
    # <t><vs> 2x2 pads <ve> for each of 2 groups, then 2 text tokens
    is_video = torch.tensor([False, False, *[True] * 4, False, False, False, *[True] * 4, False, False, False])
    pos = family.full_positions(is_video, [VideoInputs(torch.zeros(0), torch.zeros(3), (2, 2, 2), 0.0)])
    assert pos[:, 2:6].tolist() == [[2, 2, 2, 2], [2, 2, 3, 3], [2, 3, 2, 3]]
    assert pos[:, 6:9].tolist() == [[4, 5, 6]] * 3
    assert pos[:, 9:13].tolist() == [[7, 7, 7, 7], [7, 7, 8, 8], [7, 8, 7, 8]]
    assert pos[:, 13:].tolist() == [[9, 10, 11]] * 3


def check_pruned_positions(prompt, pruned):
    keep = pruning.prompt_keep_mask(prompt.is_visual, pruned.retention[0])
    assert torch.equal(pruned.positions[1:], prompt.positions[:, keep])
    assert pruned.positions[0].tolist() == list(range(int(keep.sum())))
    after_video = int(torch.nonzero(prompt.is_visual).max()) + 1
    video_max = int(prompt.positions[:, :after_video].max())
    kept_after = int(keep[:after_video].sum())
    assert pruned.positions[1:, kept_after].tolist() == [video_max + 1] * 3
    assert pruned.next_position == int(prompt.positions.max()) + 1


def test_pruned_positions_are_the_unpruned_ones(tiny_models, clip):
    for name in ("tiny-random", "tiny-random-qwen2.5-vl"):
        loaded, family, video, prompt = prepared(tiny_models, name, clip("moving_object"))
        features = family.encode_media(loaded.model, prompt.media)
        pruned = prune_prompt(prompt, features, 0.6, "evs")
        assert pruned.retention[0].sum() < prompt.is_visual.sum()
        check_pruned_positions(prompt, pruned)


def test_qwen3_empty_group_keeps_its_timestamp(tiny_models, clip):
    loaded, family, video, prompt = prepared(tiny_models, "tiny-random", clip("static"))
    features = family.encode_media(loaded.model, prompt.media)
    T, h, w = prompt.media[0].grid_thw
    pruned = prune_prompt(prompt, features, 1 - 1 / T, "evs")  # keeps exactly one group's worth
    counts = pruned.tokens_kept_per_group(0)
    assert counts[0] == h * w and 0 in counts[1:]
    text = loaded.processor.tokenizer.decode(pruned.input_ids)
    for t_s in prompt.media[0].timestamps_s:
        assert f"<{t_s:.1f} seconds><|vision_start|>" in text
    assert text.count("<|vision_start|>") == T and text.count("<|vision_end|>") == T
    assert text.count("<|video_pad|>") == sum(counts)
    check_pruned_positions(prompt, pruned)
