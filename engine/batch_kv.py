"""The KV cache of every request that decodes together: one left-padded batch.

Rows join after their own prefill and leave when done; the padded tensors are rebuilt only when the
membership changes, never on an ordinary decode step.
"""

import torch
from transformers.cache_utils import Cache, DynamicLayer


class GrowingLayer(DynamicLayer):
    """A KV layer that appends into spare capacity in place.

    transformers' DynamicLayer concatenates on every update, copying the whole cache each decode step
    (measured: 39% of a batch-8 decode step on CPU). Here `keys`/`values` are views of the first
    `length` slots of (B, heads, capacity, head_dim) buffers that grow by SPARE_TOKENS when full.
    """

    SPARE_TOKENS = 256

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._key_buffer = self._value_buffer = None
        length = self.get_seq_length()
        end = length + key_states.shape[-2]
        if self._key_buffer is None or end > self._key_buffer.shape[-2]:
            self._key_buffer = self._grown(self.keys, key_states, end + self.SPARE_TOKENS)
            self._value_buffer = self._grown(self.values, value_states, end + self.SPARE_TOKENS)
        self._key_buffer[:, :, length:end] = key_states
        self._value_buffer[:, :, length:end] = value_states
        self.keys = self._key_buffer[:, :, :end]
        self.values = self._value_buffer[:, :, :end]
        return self.keys, self.values

    @staticmethod
    def _grown(old: torch.Tensor, new: torch.Tensor, capacity: int) -> torch.Tensor:
        buffer = new.new_empty(new.shape[0], new.shape[1], capacity, new.shape[3])
        if old.numel():
            buffer[:, :, : old.shape[-2]] = old
        return buffer


def new_cache() -> Cache:
    """An empty KV cache whose layers append in place."""
    return Cache(layer_class_to_replicate=GrowingLayer)


def cache_tensors(cache: Cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (keys, values), each (B, heads, S, head_dim)."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def cache_from_tensors(tensors: list[tuple[torch.Tensor, torch.Tensor]]) -> Cache:
    cache = new_cache()
    for layer_idx, (keys, values) in enumerate(tensors):
        cache.update(keys, values, layer_idx)
    return cache


def cache_nbytes(tensors: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in tensors)


def left_pad(tensor: torch.Tensor, length: int) -> torch.Tensor:
    """Pad (B, H, S, D) on the left of S with zeros up to length."""
    missing = length - tensor.shape[2]
    if missing == 0:
        return tensor
    pad = tensor.new_zeros(tensor.shape[0], tensor.shape[1], missing, tensor.shape[3])
    return torch.cat([pad, tensor], dim=2)


class DecodeBatch:
    """Rows of a padded decode batch.

    cache: one KV cache of shape (B, heads, S, head_dim) per layer. attention_mask: (B, S) long,
    0 on each row's left padding. Row order is the order of `keys`.
    """

    def __init__(self):
        self.keys: list[object] = []
        self.cache: Cache | None = None
        self.attention_mask: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, key: object, cache: Cache) -> None:
        """Join a row whose prompt was prefilled alone into cache (batch 1, no padding)."""
        new = cache_tensors(cache)
        new_len = new[0][0].shape[2]
        device = new[0][0].device
        if self.cache is None:
            self.keys = [key]
            self.cache = cache
            self.attention_mask = torch.ones(1, new_len, dtype=torch.long, device=device)
            return
        old = cache_tensors(self.cache)
        length = max(new_len, old[0][0].shape[2])
        merged = [
            (torch.cat([left_pad(ok, length), left_pad(nk, length)]), torch.cat([left_pad(ov, length), left_pad(nv, length)]))
            for (ok, ov), (nk, nv) in zip(old, new)
        ]
        old_mask = self.attention_mask
        mask = torch.zeros(len(self.keys) + 1, length, dtype=torch.long, device=device)
        mask[:-1, length - old_mask.shape[1] :] = old_mask
        mask[-1, length - new_len :] = 1
        self.keys.append(key)
        self.cache = cache_from_tensors(merged)
        self.attention_mask = mask

    def row_tensors(self, key: object) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One row's KV without its padding: per layer (1, heads, tokens, head_dim) views."""
        row = self.keys.index(key)
        tokens = int(self.attention_mask[row].sum())
        return [(k[row : row + 1, :, -tokens:], v[row : row + 1, :, -tokens:]) for k, v in cache_tensors(self.cache)]

    def remove(self, gone: set) -> None:
        """Drop rows whose key is in gone and trim padding no remaining row needs."""
        keep = [i for i, key in enumerate(self.keys) if key not in gone]
        if len(keep) == len(self.keys):
            return
        if not keep:
            self.keys, self.cache, self.attention_mask = [], None, None
            return
        index = torch.tensor(keep, device=self.attention_mask.device)
        mask = self.attention_mask.index_select(0, index)
        first_used = int(mask.any(dim=0).nonzero().min())
        tensors = [
            (k.index_select(0, index)[:, :, first_used:], v.index_select(0, index)[:, :, first_used:])
            for k, v in cache_tensors(self.cache)
        ]
        self.keys = [self.keys[i] for i in keep]
        self.cache = cache_from_tensors(tensors)
        self.attention_mask = mask[:, first_used:].contiguous()

    def step_mask(self) -> torch.Tensor:
        """(B, S + 1): the mask for one more token per row; becomes the batch mask after the step."""
        ones = torch.ones(len(self.keys), 1, dtype=torch.long, device=self.attention_mask.device)
        self.attention_mask = torch.cat([self.attention_mask, ones], dim=1)
        return self.attention_mask
