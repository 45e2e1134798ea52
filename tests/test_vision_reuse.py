"""Exact reuse before the vision tower (engine/prompt/units.py, EngineConfig.vision_reuse): a temporal group whose
pixels equal the previous group's is not encoded, its tokens take the previous group's features, and nothing the
model computes after that moves: the logits with and without reuse are the same for an upload, a question about
two videos and a live session, at q = 0 and q = 0.7, on every family's tiny model. A group one pixel off is
encoded."""

import numpy as np
import pytest
import torch

from engine import Engine, EngineConfig, GenerationParams
from engine.prompt.units import encode_plan
from engine.prompt.unpruned import unpruned_prompt
from live_helpers import clip_frames, logits_close, play, write_lossless
from test_live_models import sampled

MODELS = ["tiny-random", "tiny-random-qwen2.5-vl", "tiny-random-qwen3.5", "tiny-random-nemotron-omni"]
FPS = 2
# Reuse changes which groups share the vision forward: Qwen's towers give each row the same bits whatever else is
# in it; RADIO's batched matmuls differ in the last bits when the batch shrinks to one tubelet (1.3e-5 on the
# tiny model's features), which the logits carry through. A wrong feature moves them by 1e-2 and more.
ATOL = {"tiny-random-nemotron-omni": 1e-4}
SEEDS = (2_000_001, 2_000_002)  # the two videos' shapes clips


def repeating(seed: int) -> np.ndarray:
    """16 frames of a shapes clip as 8 temporal groups of 2, each group shown twice (group 2k+1 repeats 2k):
    a screen recording's stills, or a paused stream."""
    frames = clip_frames(seed, fps=FPS, seconds=4.0)  # 8 frames, 4 groups
    groups = frames.reshape(4, 2, *frames.shape[1:])
    return np.repeat(groups, 2, axis=0).reshape(16, *frames.shape[1:])


def new_groups(frames: np.ndarray) -> int:
    """Temporal groups of 2 frames that differ from the group before (the first counts): the groups to encode."""
    groups = frames.reshape(-1, 2 * frames[0].size)
    return 1 + int((groups[1:] != groups[:-1]).any(axis=1).sum())


@pytest.fixture(scope="module")
def engines(tiny_cache_dir):
    """(name, reuse) -> an Engine, made once; every cache off, so that each request encodes for itself."""
    made = {}

    def get(name: str, reuse: bool) -> Engine:
        if (name, reuse) not in made:
            config = EngineConfig(
                model=name,
                device="cpu",
                cache_dir=tiny_cache_dir,
                vision_reuse=reuse,
                feature_cache_bytes=0,
                prefix_cache_bytes=0,
            )
            made[name, reuse] = Engine(config)
        return made[name, reuse]

    yield get
    for engine in made.values():
        engine.shutdown()


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("repeating")
    return [write_lossless(folder / f"repeating-{seed}.mkv", repeating(seed), FPS) for seed in SEEDS]


def _params(q: float) -> GenerationParams:
    return GenerationParams(pruning_rate=q, max_new_tokens=4, return_logits=True)


@pytest.mark.parametrize("q", [0.0, 0.7])
@pytest.mark.parametrize("name", MODELS)
def test_reuse_gives_the_logits_of_encoding_every_group(name, q, engines, videos):
    answers = {}
    for reuse in (True, False):
        engine = engines(name, reuse)
        one = engine.submit(video=videos[0], question="What moves?", params=_params(q)).result(120)
        two = engine.submit(media=videos, question="Which is first?", params=_params(q)).result(120)
        answers[reuse] = (one, two)
    groups = [new_groups(repeating(seed)) for seed in SEEDS]
    for with_reuse, without, encoded in zip(answers[True], answers[False], (groups[0], sum(groups))):
        logits_close(with_reuse, without, ATOL.get(name, 1e-5))
        total = with_reuse.stats["vision_patches_total"]
        assert without.stats["vision_patches_encoded"] == total == without.stats["vision_patches_total"]
        assert with_reuse.stats["vision_patches_encoded"] == total * encoded // (8 * len(with_reuse.stats["media"]))
        assert with_reuse.stats["video_tokens_kept"] == without.stats["video_tokens_kept"]


@pytest.mark.parametrize("q", [0.0, 0.7])
@pytest.mark.parametrize("name", MODELS)
def test_a_live_session_reuses_as_an_upload_does(name, q, engines):
    frames = repeating(2_000_003)
    answers, stats = {}, {}
    for reuse in (True, False):
        with engines(name, reuse).open_live(GenerationParams(pruning_rate=q)) as live:
            play(live, frames, fps=FPS)
            answers[reuse] = live.ask("What moves?", params=_params(q)).result(120)
            stats[reuse] = live.stats()
    logits_close(answers[True], answers[False], ATOL.get(name, 1e-5))
    total = stats[True]["vision_patches_total"]
    assert stats[False]["vision_patches_encoded"] == total == stats[False]["vision_patches_total"] > 0
    assert stats[True]["vision_patches_encoded"] == total * new_groups(frames) // 8
    assert stats[True]["video_tokens_kept"] == stats[False]["video_tokens_kept"]


@pytest.mark.parametrize("name", MODELS)
def test_a_group_one_pixel_off_the_one_before_is_encoded(name, tiny_models):
    loaded, family = tiny_models(name)
    levels = family.pixel_levels(loaded.processor)

    def plan_of(frames):
        medium = unpruned_prompt(loaded, family, sampled(frames, FPS), "What moves?", [], "", 224 * 224).media[0]
        return medium, encode_plan(family, medium, levels, reuse=True, skip=False, threshold=6.0)

    def differs(frames):  # whether each group's frames differ from the group before (the first: yes)
        groups = frames.reshape(8, -1)
        return [True] + [bool((groups[t] != groups[t - 1]).any()) for t in range(1, 8)]

    frames = repeating(2_000_004)
    _, plan = plan_of(frames)
    assert plan.encoded.all(dim=1).tolist() == differs(frames) and not differs(frames)[3]  # 3 repeats group 2
    frames[7, 17, 30] = 255 - frames[7, 17, 30]  # ... but for one pixel of its second frame
    medium, plan = plan_of(frames)
    rows = medium.pixel_values.reshape(8, -1)
    assert not torch.equal(rows[3], rows[2])  # the processor kept the pixel's difference
    assert plan.encoded.all(dim=1).tolist() == differs(frames) and differs(frames)[3]
    assert torch.equal(plan.encoded.any(dim=1), plan.encoded.all(dim=1))  # by whole groups
    assert plan.candidates is None  # every token stays in the prompt
