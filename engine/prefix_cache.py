"""KV reuse across requests on the same video and rate: the [system + video] prefix, and beyond it the
longest shared start of the latest conversation (earlier question, the answer the model gave, ...).

Causal attention means the KV of a token sequence does not depend on what follows it, and kept tokens
sit at the same positions whatever follows, so any shared leading run of token ids can reuse its KV.
"""

import hashlib
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache

from .batch_kv import cache_from_tensors, cache_nbytes
from .lru import ByteLRU


def prefix_key(feature_key: tuple, pruning_rate: float, prefix_ids: torch.Tensor) -> tuple:
    digest = hashlib.sha256(prefix_ids.to(torch.int64).cpu().numpy().tobytes()).hexdigest()
    return (feature_key, pruning_rate, digest)


def common_prefix_len(a: torch.Tensor, b: torch.Tensor) -> int:
    """Leading tokens two (L,) id tensors share."""
    n = min(a.numel(), b.numel())
    differ = torch.nonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.numel() else n


@dataclass
class Conversation:
    """token_ids: (S,) long on CPU; tensors: per layer (keys, values), each (1, heads, S, head_dim)."""

    token_ids: torch.Tensor
    tensors: list[tuple[torch.Tensor, torch.Tensor]]


class PrefixCache:
    """Per key, the latest conversation's KV; an LRU bounded in bytes over keys."""

    def __init__(self, max_bytes: int):
        self.lru = ByteLRU(max_bytes)

    def lookup(self, key: tuple, token_ids: torch.Tensor, min_len: int) -> tuple[Cache | None, int]:
        """(cache holding the reusable leading tokens, their count), or (None, 0) when fewer than min_len
        tokens are shared. At least one token is always left to prefill, for its logits."""
        stored = self.lru.get(key)
        if stored is None:
            return None, 0
        reused = min(common_prefix_len(stored.token_ids, token_ids), token_ids.numel() - 1)
        if reused < min_len:
            return None, 0
        return cache_from_tensors([(k[:, :, :reused], v[:, :, :reused]) for k, v in stored.tensors]), reused

    def store(self, key: tuple, token_ids: torch.Tensor, tensors: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keep token_ids' KV under key, replacing the conversation stored there. Cloned, so the entry does
        not pin a larger batch tensor in memory."""
        kept = [(k.clone(), v.clone()) for k, v in tensors]
        self.lru.put(key, Conversation(token_ids.cpu(), kept), cache_nbytes(kept))
