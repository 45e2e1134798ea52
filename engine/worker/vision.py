"""Cross-request vision batching: one ViT forward for every medium whose features are not cached.

Each medium of a request (a video, or a still image) is keyed on its own: identical media (same content hash,
frame sampling and model, and whether still units were skipped) are encoded once, also when they arrive together
or twice in one request, and a byte-bounded LRU keeps each one's features for later questions (asking about A,
then about A and B, encodes A once). The forward runs only the units each medium's plan encodes
(engine/prompt/units.py); every other token takes the features of the last encoded unit at its place. A
soundtrack that is heard goes through the audio tower in the same step, right after the vision forward (one
forward per soundtrack), and its features are kept with its video's (the key says whether it was heard).
"""

import time
from dataclasses import dataclass

import torch

from engine.families.base import Family, VideoFeatures, VideoInputs
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

    def feature_keys(self, request: Request) -> list[tuple]:
        """One key per medium of the request, in order."""
        return [
            (medium.content_hash, request.frame_sampling, self.model_name, prompt.audio is not None, plan.leave_out)
            for medium, prompt, plan in zip(request.media, request.prompt.media, request.plans)
        ]

    def lookup(self, key: tuple, grid_thw: tuple[int, int, int]) -> VideoFeatures | None:
        cached = self.cache.get(key)
        # A key match is trusted only when the token grid agrees too (guards a hash collision).
        if cached is None or cached.grid_thw != grid_thw:
            return None
        return cached.features

    def missing(self, request: Request) -> dict[tuple, int]:
        """The media of the request whose features are not cached: key -> vision patches its plan encodes."""
        return {
            key: plan.patches
            for key, medium, plan in zip(request.feature_keys, request.prompt.media, request.plans)
            if self.lookup(key, medium.grid_thw) is None
        }

    def encode(self, requests: list[Request], on_batch=None, live=()) -> None:
        """Set features and vision stats on every request, each medium not cached encoded once, all of them
        in one forward with the live groups `live` (engine/live/session.py LiveGroup: the features of the units its
        `encoded` marks set, never cached; a group with none is left out); on_batch({request: indices of its media
        the forward encodes}) is called before it so callers can report progress."""
        misses: dict[tuple, list[tuple[Request, int]]] = {}
        for request in requests:
            request.features = [
                self.lookup(key, medium.grid_thw) for key, medium in zip(request.feature_keys, request.prompt.media)
            ]
            for index, features in enumerate(request.features):
                if features is None:
                    misses.setdefault(request.feature_keys[index], []).append((request, index))
            if all(features is not None for features in request.features):
                stats = request.stats
                stats.vit_cache_hit, stats.vit_s, stats.vit_batch_requests = True, 0.0, 0
        if misses or live:
            self._forward(misses, on_batch, live)

    def _forward(self, misses: dict[tuple, list[tuple[Request, int]]], on_batch, live) -> None:
        keys = list(misses)
        owners = [misses[key][0][0].prompt.media[misses[key][0][1]] for key in keys]
        plans = [misses[key][0][0].plans[misses[key][0][1]] for key in keys]
        encoding: dict[Request, list[int]] = {}
        for key in keys:
            for request, index in misses[key]:
                encoding.setdefault(request, []).append(index)
        served = list(encoding)
        if on_batch is not None and encoding:
            on_batch(encoding)
        live = [group for group in live if bool(group.encoded.any())]  # an exact repeat needs no forward
        if not owners and not live:
            return
        start = time.perf_counter()
        groups = [VideoInputs(group.pixel_values, group.grid_thw_patches, (1, *group.grid_hw), 0.0) for group in live]
        masks = [plan.encoded for plan in plans] + [group.encoded[None] for group in live]
        outputs = self.family.encode_planned(self.model, owners + groups, masks)
        for group, output in zip(live, outputs[len(owners) :]):
            group.features = output  # the encoded units' rows: engine/worker/live.py carries the rest
        outputs = [output.carried(plan.encoded) for output, plan in zip(outputs[: len(owners)], plans)]
        # One soundtrack per audio forward, never a batch of them: the memory plan counts the audio tower's
        # activations for one soundtrack of the longest length a request may have (its attention is quadratic
        # in the length), and soundtracks cut at that length would otherwise share a forward, several at once.
        for owner, output in zip(owners, outputs):
            if owner.audio is not None:
                output.audio = self.family.encode_audio(self.model, owner.audio)
        device = self.model.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        vit_s = time.perf_counter() - start
        self.forwards += 1
        for key, owner, split, plan in zip(keys, owners, outputs, plans):
            # own copies: a split view would keep the whole batch's output alive in the cache
            features = VideoFeatures(
                split.embeds.clone(),
                [level.clone() for level in split.deepstack],
                None if split.audio is None else split.audio.clone(),
            )
            self.cache.put(key, CachedFeatures(features, owner.grid_thw), features.nbytes)
            for request, index in misses[key]:
                request.features[index] = features
            for request in {request for request, _ in misses[key]}:  # a medium asked twice is encoded once
                request.stats.vision_patches_encoded += plan.patches
        for request in served:
            stats = request.stats
            stats.vit_cache_hit, stats.vit_s, stats.vit_batch_requests = False, vit_s, len(served)
