"""Video token pruning on bare tensors: which of a video's tokens reach the language model.

Pure torch; imports nothing else of this project. `evs.py` is Efficient Video Sampling (drop the tokens that
barely changed since the previous temporal group); `inputs.py` checks what every method is given; `layout.py`
turns a retention mask into the pruned prompt's layout and positions.
"""

from pruning.evs import (
    compute_retention_mask,
    frame_dissimilarity,
    retained_token_count,
    retention_mask_from_dissimilarity,
)
from pruning.inputs import validate_pruning_rate
from pruning.layout import prompt_keep_mask, select_positions, tokens_kept_per_group

__all__ = [
    "compute_retention_mask",
    "frame_dissimilarity",
    "prompt_keep_mask",
    "retained_token_count",
    "retention_mask_from_dissimilarity",
    "select_positions",
    "tokens_kept_per_group",
    "validate_pruning_rate",
]
