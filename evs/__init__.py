"""The old name of the `pruning` package, kept for one release: `import evs` gives the same functions.

Before this release the package held EVS alone and was called `evs`; it now holds every pruning method and is
called `pruning` (docs/architecture.md). Importing `evs` warns (DeprecationWarning); the names below are the
ones it offered, each the very object `pruning` exports. This package goes in the next release.
"""

import warnings

import pruning

# The public names of `evs` before the rename, no more: new code imports `pruning`.
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
globals().update({name: getattr(pruning, name) for name in __all__})

warnings.warn(
    "the `evs` package is now `pruning`; `import evs` works until the next release", DeprecationWarning, stacklevel=2
)
