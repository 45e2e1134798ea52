"""State reuse across requests on the same video and rate: the [system + video] prefix, and beyond it the
longest shared start of the latest conversation (earlier question, the answer the model gave, ...).

Causal attention means the KV of a token sequence does not depend on what follows it, and kept tokens
sit at the same positions whatever follows, so any shared leading run of token ids can reuse its KV.
A recurrent layer's state cannot be cut back that way: a hybrid model resumes only where a snapshot was
taken: at the end of [system + video], and where an answer begins (a follow-up quoting it continues the
prompt up to there, as the chat template writes an earlier answer without its think block), or at the end
of a conversation for a family whose template writes no such opening (engine/state/lm_state.py).
"""

import hashlib
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache

from engine.lru import ByteLRU

from .lm_state import LMState, Snapshot, cache_of, snapshot_nbytes


def prefix_key(feature_keys: tuple, pruning_method: str, pruning_rate: float, prefix_ids: torch.Tensor) -> tuple:
    """The key of a conversation's state: every medium's features in order, which of its tokens were kept (method and
    rate: two methods at one rate keep as many tokens, so the same ids, but not the same ones) and the prefix ids."""
    digest = hashlib.sha256(prefix_ids.to(torch.int64).cpu().numpy().tobytes()).hexdigest()
    return (feature_keys, pruning_method, pruning_rate, digest)


def common_prefix_len(a: torch.Tensor, b: torch.Tensor) -> int:
    """Leading tokens two (L,) id tensors share."""
    n = min(a.numel(), b.numel())
    differ = torch.nonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.numel() else n


@dataclass
class StoredConversation:
    """token_ids: (S,) long on CPU; state: after all S tokens (one sequence, owned tensors); snapshots: token
    count -> the recurrent layers' state after that many tokens, for counts below S (empty without recurrent
    layers, whose KV resumes anywhere)."""

    token_ids: torch.Tensor
    state: LMState
    snapshots: dict[int, Snapshot] = field(default_factory=dict)

    def resume_point(self, limit: int) -> int:
        """The most leading tokens, at most limit, this state can resume after; -1 when none."""
        if not self.state.has_recurrent:
            return limit
        points = [n for n in (*self.snapshots, self.token_ids.numel()) if n <= limit]
        return max(points, default=-1)

    def state_at(self, length: int) -> LMState:
        return self.state.prefix(length, self.snapshots.get(length))


class PrefixCache:
    """Per key, the latest conversation's state; an LRU bounded in bytes (KV, recurrent state and snapshots)."""

    def __init__(self, max_bytes: int):
        self.lru = ByteLRU(max_bytes)

    def lookup(
        self, key: tuple, token_ids: torch.Tensor, min_len: int
    ) -> tuple[Cache | None, int, dict[int, Snapshot]]:
        """(cache holding the reusable leading tokens, their count, the stored snapshots within them), or
        (None, 0, {}) when fewer than min_len tokens can be resumed. At least one token is always left to
        prefill, for its logits."""
        stored = self.lru.get(key)
        if stored is None:
            return None, 0, {}
        shared = min(common_prefix_len(stored.token_ids, token_ids), token_ids.numel() - 1)
        reused = stored.resume_point(shared)
        if reused < min_len:
            return None, 0, {}
        # Passed on: the video's end (every later turn may need it) and the resume point itself; the snapshots
        # of older turns' answers are not, since a follow-up quotes the whole history and continues past them.
        kept = {n: snap for n, snap in stored.snapshots.items() if n in (min_len, reused)}
        return cache_of(stored.state_at(reused)), reused, kept

    def store(self, key: tuple, token_ids: torch.Tensor, state: LMState, snapshots: dict[int, Snapshot]) -> None:
        """Keep the state after token_ids under key, replacing the conversation stored there, with the
        snapshots taken inside it. Cloned, so the entry pins no batch tensor and later forwards leave it be."""
        kept = state.clone()
        kept_snapshots = (
            {n: snap for n, snap in snapshots.items() if n < token_ids.numel()} if kept.has_recurrent else {}
        )
        nbytes = kept.nbytes + sum(snapshot_nbytes(snap) for snap in kept_snapshots.values())
        self.lru.put(key, StoredConversation(token_ids.cpu(), kept, kept_snapshots), nbytes)
