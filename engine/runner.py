"""The tensor side of an iteration: vision forwards, EVS, prefill and the shared decode step.

Only the worker thread calls it, so nothing here is locked. It owns the device state: the vision
encoder and its feature cache, the prefix KV cache and the decode batch.
"""

import time

import torch

from .batch_kv import DecodeBatch, cache_tensors, new_cache
from .families import Family
from .lm import LMInput, embed_prompt, embed_tokens, lm_logits
from .prefix_cache import PrefixCache, prefix_key
from .pruning import prune_prompt
from .request import Request
from .scheduler import WorkWeights
from .vision import VisionEncoder

KVTensors = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each (1, heads, S, head_dim)


def vit_token_budget(config, device: torch.device) -> int:
    """Patches per vision forward: on a CPU, batches past ~2 short clips overflow the caches (measured
    1.18x the separate forwards for 8 clips against 0.97x for 2); on a GPU one forward per burst pays."""
    if config.vit_token_budget is not None:
        return config.vit_token_budget
    return 65536 if device.type == "cuda" else 4096


def eos_token_ids(loaded) -> set[int]:
    ids = loaded.model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if loaded.processor.tokenizer.eos_token_id is not None:
        ids.add(loaded.processor.tokenizer.eos_token_id)
    return ids


def work_weights(model) -> WorkWeights:
    """Cost of a vision patch against a prompt token, as the parameters each passes through."""
    vision = sum(p.numel() for p in model.model.visual.parameters())
    language = sum(p.numel() for p in model.model.language_model.parameters())
    return WorkWeights(per_patch=vision / language, per_token=1.0)


class ModelRunner:
    def __init__(self, loaded, family: Family, config):
        self.model = loaded.model
        self.family = family
        self.vision = VisionEncoder(
            self.model, family, loaded.name, config.feature_cache_bytes, vit_token_budget(config, loaded.device)
        )
        self.prefix = PrefixCache(config.prefix_cache_bytes)
        self.batch = DecodeBatch()
        self.eos_ids = eos_token_ids(loaded)
        self.weights = work_weights(self.model)

    def has_features(self, request: Request) -> bool:
        return self.vision.lookup(request.feature_key, request.prompt.grid_thw) is not None

    def encode(self, requests: list[Request], on_forward) -> None:
        """Features for every request, in one vision forward when they fit the patch budget."""
        self.vision.encode(requests, on_batch=on_forward)

    def prune(self, request: Request) -> None:
        start = time.perf_counter()
        request.pruned = prune_prompt(request.prompt, request.features, request.params.pruning_rate)
        request.stats.evs_s = time.perf_counter() - start

    def prefill(self, request: Request) -> torch.Tensor:
        """Run the request's pruned prompt (its uncached part) through the language model into a KV
        cache of its own (request.kv); returns the last position's logits, (V,) float32."""
        start = time.perf_counter()
        pruned = request.pruned
        request.prefix_key = prefix_key(
            request.feature_key, request.params.pruning_rate, pruned.input_ids[: pruned.prefix_len]
        )
        cache, begin = self.prefix.lookup(request.prefix_key, pruned.input_ids, min_len=pruned.prefix_len)
        hit = cache is not None
        ids = pruned.input_ids[begin:]
        positions = pruned.positions[:, None, begin:].to(self.model.device)
        if hit:  # the video lies inside the reused part; the rest is text
            batch = LMInput(embed_tokens(self.model, ids)[None], positions)
        else:
            cache = new_cache()
            embeds = embed_prompt(self.model, ids, pruned.video_mask, pruned.features)
            visual_mask = pruned.video_mask[None].to(self.model.device)
            batch = LMInput(embeds[None], positions, None, visual_mask, pruned.features.deepstack)
        logits = lm_logits(self.model, self.family, batch, cache)
        stats = request.stats
        stats.prefix_cache_hit, stats.prefill_tokens = hit, ids.numel()
        stats.prefill_s, stats.decode_batch_max = time.perf_counter() - start, 1
        request.tokens_seen = pruned.input_ids.numel()
        request.next_position = pruned.next_position
        request.kv = cache
        if not hit:  # requests arriving meanwhile on the same video reuse at least this prompt
            self.prefix.store(request.prefix_key, pruned.input_ids, cache_tensors(cache))
        return logits[0]

    def join(self, request: Request) -> None:
        """The prefilled request becomes a row of the decode batch."""
        self.batch.add(request.id, request.kv)
        request.kv = None

    def decode_step(self, rows: list[Request]) -> torch.Tensor:
        """One token for every row of the batch; rows in batch order. Returns (B, V) float32 logits."""
        assert [r.id for r in rows] == self.batch.keys, "rows must be the decode batch, in its order"
        device = self.model.device
        tokens = torch.tensor([r.last_token for r in rows], device=device)
        one_d = torch.tensor([r.tokens_seen for r in rows], device=device)
        mrope = torch.tensor([r.next_position for r in rows], device=device)
        positions = torch.stack([one_d, mrope, mrope, mrope])[:, :, None]  # (4, B, 1)
        batch = LMInput(embed_tokens(self.model, tokens)[:, None], positions, self.batch.step_mask())
        logits = lm_logits(self.model, self.family, batch, self.batch.cache)
        for request in rows:
            request.tokens_seen += 1
            request.next_position += 1
        return logits

    def leave(self, requests: list[Request], remember: bool) -> None:
        """Requests end: their rows leave the decode batch (one rebuild for all). With remember, each one's
        conversation KV (prompt + the answer tokens fed back so far; a cancelled one's too, its partial
        answer is what a follow-up will quote) is stored for a follow-up."""
        rows = {r.id for r in requests if r.id in self.batch.keys}
        for request in requests:
            tensors = self.batch.row_tensors(request.id) if request.id in rows else None
            if tensors is None and request.kv is not None:
                tensors = cache_tensors(request.kv)
            if remember and tensors is not None and request.pruned is not None:
                self._remember(request, tensors)
            request.kv = None
        self.batch.remove(rows)

    def _remember(self, request: Request, tensors: KVTensors) -> None:
        fed_back = request.tokens_seen - request.pruned.input_ids.numel()
        answer = torch.tensor(request.detokenizer.token_ids[:fed_back], dtype=request.pruned.input_ids.dtype)
        self.prefix.store(request.prefix_key, torch.cat([request.pruned.input_ids, answer]), tensors)

    def drop_batch(self) -> None:
        """Forget the decode batch without touching the device (after a fault it may be out of memory)."""
        self.batch = DecodeBatch()
