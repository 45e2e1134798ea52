"""Video token pruning on bare tensors: which of a video's tokens reach the language model.

Pure torch; imports nothing else of this project. One interface for every method, `retention_mask(features,
grid_thw, q, method)` (`methods.py`); the methods, one module each: `evs.py`, Efficient Video Sampling (drop
the tokens that barely changed since the previous temporal group), `vidcom2.py` (VidCom2: a budget per frame
from its uniqueness, then the most unique tokens in it) and `uniform.py` (whole temporal groups, evenly
spaced: fewer frames instead of fewer tokens per frame). `causal.py` is EVS for a live stream: each temporal
group's tokens chosen when it arrives, never revised (`CausalEVS`). `inputs.py` checks what every method is given;
`layout.py` turns a retention mask into the pruned prompt's layout and positions. `still.py` decides
before the vision tower which merge units it need not encode: exact repeats of the previous temporal group, and
(a request's `skip_still_patches`) units whose pixels barely changed since they were last encoded.
"""

from pruning.causal import (
    WINDOW_GROUPS,
    CausalEVS,
    causal_retention_mask,
    causal_retention_mask_from_dissimilarity,
)
from pruning.evs import (
    compute_retention_mask,
    frame_dissimilarity,
    retained_token_count,
    retention_mask_from_dissimilarity,
)
from pruning.inputs import validate_pruning_rate
from pruning.layout import prompt_keep_mask, select_positions, tokens_kept_per_group
from pruning.methods import (
    PRUNING_METHODS,
    kept_token_count,
    retention_mask,
    validate_pruning_method,
)
from pruning.still import (
    STILL_THRESHOLD_LEVELS,
    CausalStill,
    carried_rows,
    repeated_groups,
    still_units,
    unit_change,
)

__all__ = [
    "PRUNING_METHODS",
    "STILL_THRESHOLD_LEVELS",
    "WINDOW_GROUPS",
    "CausalEVS",
    "CausalStill",
    "carried_rows",
    "causal_retention_mask",
    "causal_retention_mask_from_dissimilarity",
    "compute_retention_mask",
    "frame_dissimilarity",
    "kept_token_count",
    "prompt_keep_mask",
    "repeated_groups",
    "retained_token_count",
    "retention_mask",
    "retention_mask_from_dissimilarity",
    "select_positions",
    "still_units",
    "tokens_kept_per_group",
    "unit_change",
    "validate_pruning_method",
    "validate_pruning_rate",
]
