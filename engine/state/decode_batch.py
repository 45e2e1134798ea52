"""The state of every request that decodes together: one batch, KV left-padded, recurrent states stacked.

Rows join after their own prefill and leave when done; the batch tensors are rebuilt only when the
membership changes, never on an ordinary decode step. A decode step feeds one token per row, so no row's
recurrent state ever sees a pad (engine/state/lm_state.py says why that matters).
"""

import torch
from transformers.cache_utils import Cache

from .lm_state import LMState, batch_cache, state_of


class DecodeBatch:
    """Rows of a padded decode batch.

    cache: the batch's state (B rows; KV of shape (B, heads, S, head_dim)). attention_mask: (B, S) long, 0 on
    each row's left padding. Row order is the order of `keys`.
    """

    def __init__(self):
        self.keys: list[object] = []
        self.cache: Cache | None = None
        self.attention_mask: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, key: object, cache: Cache) -> None:
        """Join a row whose prompt was prefilled alone into cache (batch 1, no padding)."""
        new = state_of(cache)
        new_len = new.tokens
        if self.cache is None:
            self.keys = [key]
            self.cache = cache
            self.attention_mask = torch.ones(1, new_len, dtype=torch.long, device=new.device)
            return
        old = state_of(self.cache)
        length = max(new_len, old.tokens)
        old_mask = self.attention_mask
        mask = torch.zeros(len(self.keys) + 1, length, dtype=torch.long, device=old_mask.device)
        mask[:-1, length - old_mask.shape[1] :] = old_mask
        mask[-1, length - new_len :] = 1
        # Built first, so that a failed rebuild (out of memory) leaves the batch as it was.
        self.cache = batch_cache([old, new], length)
        self.keys.append(key)
        self.attention_mask = mask

    def row_state(self, key: object) -> LMState:
        """One row's state without its padding (views into the batch)."""
        row = self.keys.index(key)
        return state_of(self.cache).row(row, int(self.attention_mask[row].sum()))

    def remove(self, gone: set) -> None:
        """Drop rows whose key is in gone and trim padding no remaining row needs."""
        keep = [i for i, key in enumerate(self.keys) if key not in gone]
        if len(keep) == len(self.keys):
            return
        if not keep:
            self.keys, self.cache, self.attention_mask = [], None, None
            return
        mask = self.attention_mask.index_select(0, torch.tensor(keep, device=self.attention_mask.device))
        tokens = mask.sum(dim=1).tolist()  # each row's own, after its left padding
        length = max(tokens)  # the padding every row left has is trimmed
        state = state_of(self.cache)
        # Built first, so that a failed rebuild (out of memory) leaves the batch as it was.
        cache = batch_cache([state.row(i, n) for i, n in zip(keep, tokens)], length)
        self.keys = [self.keys[i] for i in keep]
        self.cache = cache
        self.attention_mask = mask[:, mask.shape[1] - length :].contiguous()

    def step_mask(self) -> torch.Tensor:
        """(B, S + 1): the mask for one more token per row; becomes the batch mask after the step."""
        ones = torch.ones(len(self.keys), 1, dtype=torch.long, device=self.attention_mask.device)
        self.attention_mask = torch.cat([self.attention_mask, ones], dim=1)
        return self.attention_mask
