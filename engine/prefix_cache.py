"""Reuse of the [system + video] prefix KV for follow-up questions on the same video and rate.

Causal attention means the KV of a prefix does not depend on what follows it, so a cold prefill's
cache, cut at the prefix, is exactly what a later request with the same prefix would compute.
"""

import hashlib

import torch
from transformers.cache_utils import Cache

from .batch_kv import cache_from_tensors, cache_nbytes, cache_tensors
from .lru import ByteLRU


def prefix_key(feature_key: tuple, pruning_rate: float, prefix_ids: torch.Tensor) -> tuple:
    digest = hashlib.sha256(prefix_ids.to(torch.int64).cpu().numpy().tobytes()).hexdigest()
    return (feature_key, pruning_rate, digest)


class PrefixCache:
    """LRU of per-layer (keys, values), each (1, heads, prefix_len, head_dim), bounded in bytes."""

    def __init__(self, max_bytes: int):
        self.lru = ByteLRU(max_bytes)

    def get(self, key: tuple) -> Cache | None:
        tensors = self.lru.get(key)
        return None if tensors is None else cache_from_tensors(tensors)

    def put(self, key: tuple, cache: Cache, prefix_len: int) -> None:
        if key in self.lru:
            return
        # clone so the stored prefix does not pin the whole prompt's KV in memory
        tensors = [(k[:, :, :prefix_len].clone(), v[:, :, :prefix_len].clone()) for k, v in cache_tensors(cache)]
        self.lru.put(key, tensors, cache_nbytes(tensors))
