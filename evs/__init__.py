"""Efficient Video Sampling: drop video tokens that barely changed since the previous temporal group; offline over
a whole video (core.py), or causally, a group at a time, for live video (causal.py).

Pure torch on bare tensors; imports nothing else of this project.
"""

from evs.causal import (
    WINDOW_GROUPS,
    CausalEVS,
    causal_retention_mask,
    causal_retention_mask_from_dissimilarity,
)
from evs.core import (
    compute_retention_mask,
    frame_dissimilarity,
    retained_token_count,
    retention_mask_from_dissimilarity,
    validate_pruning_rate,
)
from evs.layout import prompt_keep_mask, select_positions, tokens_kept_per_group

__all__ = [
    "WINDOW_GROUPS",
    "CausalEVS",
    "causal_retention_mask",
    "causal_retention_mask_from_dissimilarity",
    "compute_retention_mask",
    "frame_dissimilarity",
    "prompt_keep_mask",
    "retained_token_count",
    "retention_mask_from_dissimilarity",
    "select_positions",
    "tokens_kept_per_group",
    "validate_pruning_rate",
]
