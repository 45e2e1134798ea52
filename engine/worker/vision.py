"""Cross-request vision batching: one ViT forward for every request whose features are not cached.

Identical videos (same content hash, frame sampling and model) are encoded once, also when they
arrive together; a byte-bounded LRU keeps features for later questions on the same video. A soundtrack that
is heard goes through the audio tower in the same step, right after the vision forward (one forward per
soundtrack), and its features are kept with the video's (the key says whether it was heard).
"""

import time
from dataclasses import dataclass

import torch

from engine.families.base import Family, VideoFeatures
from engine.lru import ByteLRU
from engine.scheduling.request import Request


@dataclass
class CachedFeatures:
    features: VideoFeatures
    grid_thw: tuple[int, int, int]


class VisionEncoder:
    """Fills request.features for a chunk of admitted requests, in one forward: the scheduler decides the
    chunks (engine/scheduling/scheduler.py, within its patch budget)."""

    def __init__(self, model, family: Family, model_name: str, cache_bytes: int):
        self.model = model
        self.family = family
        self.model_name = model_name
        self.cache = ByteLRU(cache_bytes)
        self.forwards = 0  # vision forwards run so far (tests count them)

    def feature_key(self, request: Request) -> tuple:
        heard = request.prompt.audio is not None
        return (request.video.content_hash, request.frame_sampling, self.model_name, heard)

    def lookup(self, key: tuple, grid_thw: tuple[int, int, int]) -> VideoFeatures | None:
        cached = self.cache.get(key)
        # A key match is trusted only when the token grid agrees too (guards a hash collision).
        if cached is None or cached.grid_thw != grid_thw:
            return None
        return cached.features

    def encode(self, requests: list[Request], on_batch=None, live=()) -> None:
        """Set features and vision stats on every request, each video not cached encoded once, all of them
        in one forward with the live groups `live` (engine/live/session.py LiveGroup: their features set, never
        cached); on_batch(requests_in_forward) is called before it so callers can report progress."""
        misses: dict[tuple, list[Request]] = {}
        for request in requests:
            request.feature_key = self.feature_key(request)
            features = self.lookup(request.feature_key, request.prompt.grid_thw)
            if features is not None:
                request.features = features
                stats = request.stats
                stats.vit_cache_hit, stats.vit_s, stats.vit_batch_requests = True, 0.0, 0
            else:
                misses.setdefault(request.feature_key, []).append(request)
        if misses or live:
            self._forward(misses, on_batch, live)

    def _forward(self, misses: dict[tuple, list[Request]], on_batch, live) -> None:
        keys = list(misses)
        owners = [misses[key][0] for key in keys]
        served = [request for key in keys for request in misses[key]]
        if on_batch is not None and served:
            on_batch(served)
        device = self.model.device
        pixels = torch.cat([r.prompt.pixel_values for r in owners] + [g.pixel_values for g in live]).to(device)
        grids = torch.stack([r.prompt.grid_thw_patches for r in owners] + [g.grid_thw_patches for g in live]).to(device)
        start = time.perf_counter()
        outputs = self.family.encode(self.model, pixels, grids)
        for group, output in zip(live, outputs[len(owners):]):
            group.features = output
        outputs = outputs[: len(owners)]
        # One soundtrack per audio forward, never a batch of them: the memory plan counts the audio tower's
        # activations for one soundtrack of the longest length a request may have (its attention is quadratic
        # in the length), and soundtracks cut at that length would otherwise share a forward, several at once.
        for owner, output in zip(owners, outputs):
            if owner.prompt.audio is not None:
                output.audio = self.family.encode_audio(self.model, owner.prompt.audio)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        vit_s = time.perf_counter() - start
        self.forwards += 1
        for key, owner, split in zip(keys, owners, outputs):
            # own copies: a split view would keep the whole batch's output alive in the cache
            features = VideoFeatures(split.embeds.clone(), [level.clone() for level in split.deepstack],
                                     None if split.audio is None else split.audio.clone())
            self.cache.put(key, CachedFeatures(features, owner.prompt.grid_thw), features.nbytes)
            for request in misses[key]:
                request.features = features
                stats = request.stats
                stats.vit_cache_hit, stats.vit_s, stats.vit_batch_requests = False, vit_s, len(served)
