"""Which merge units of a video the vision tower has to encode, decided on the pixels before it runs.

A merge unit is what becomes one language-model token: merge x merge patches of one temporal group (2x2 patches of
2 frames on the Qwen towers and Nemotron-H Omni). Two rules, both on bare tensors:

- Exact repeats (`repeated_groups`): a temporal group whose pixel values equal the previous group's, to the bit.
  The towers encode each temporal group alone, so its features would equal the previous group's too: it need not
  be encoded, and its tokens take the previous group's features (EVS then finds them unchanged, as it would).
- Still units (`still_units`, `CausalStill`): in the manner of Run-Length Tokenization (Choudhury et al.,
  NeurIPS 2024), a unit whose pixels changed less than a threshold since it was last encoded is not encoded, and
  leaves the prompt. The change of a unit is the largest, over its patches and its frames, of the mean absolute
  difference of a patch's pixels (every channel) from the same patch and frame when the unit was last encoded,
  in 0-255 intensity levels. Departures from RLT, which compares each patch with the one before it in time and
  averages over the whole patch and both frames of the two tubelets' far ends: a unit is compared with what
  was last encoded at its place (a slow drift accumulates until it is encoded, instead of never counting), it
  changes when any of its patches does (a unit is one token: one changed patch changes it), and each frame is
  compared with its like. The first group is always encoded whole. RLT adds a run-length embedding to each kept
  token for a model trained with it; these models were not, so nothing is added (RLT's inference-only setting).

Units are given as (T, U, S, C, F, P): T temporal groups, U = h*w units per group in raster order, S = merge^2
patches of a unit, C channels, F frames per group, P pixels per patch side squared (`Family.unit_pixels`).
"""

import torch

# Measured (docs/performance.md, "The threshold: a still camera must read as still"; bench/still_noise.py): the
# largest unit change that a still camera's sensor noise (up to a dark room's) and x264's noise reach stays under
# 2.6 levels at the CPU's 224x224 frame cap and 4.3 at the GPU's 448x448; a unit a moving object covers reads 40
# and more.
STILL_THRESHOLD_LEVELS = 6.0


def repeated_groups(pixel_values: torch.Tensor, groups: int) -> torch.Tensor:
    """(T,) bool: whether each temporal group's pixel values equal the previous group's exactly (group 0: False).

    pixel_values: (T*R, V) the processor's rows, each group's R rows contiguous (every family's layout)."""
    rows = pixel_values.reshape(groups, -1)
    same = torch.zeros(groups, dtype=torch.bool)
    for group in range(1, groups):
        same[group] = torch.equal(rows[group], rows[group - 1])
    return same


def unit_change(units: torch.Tensor, reference: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """How much each unit changed, (U,) float32 in 0-255 levels: units and reference (U, S, C, F, P) the processor's
    pixel values, levels (C,) the intensity levels of one unit of pixel value in each channel."""
    difference = (units.to(torch.float32) - reference.to(torch.float32)).abs()
    per_channel = difference.mean(dim=-1) * levels.to(torch.float32)[None, None, :, None]  # (U, S, C, F)
    return per_channel.mean(dim=2).amax(dim=(1, 2))  # channels averaged; the largest over patches and frames


def still_units(units: torch.Tensor, levels: torch.Tensor, threshold: float) -> torch.Tensor:
    """(T, U) bool, True on the units to encode: all of group 0, then each unit that changed by `threshold` levels
    or more since it was last encoded (units: (T, U, S, C, F, P))."""
    rule = CausalStill(threshold, levels)
    return torch.stack([rule.add(group) for group in units])


class CausalStill:
    """The still-unit rule one group at a time, as a live stream's groups arrive (the same decisions as
    `still_units` over the whole stream). Holds the pixels of each unit as it was last encoded: one group's."""

    def __init__(self, threshold: float, levels: torch.Tensor):
        self.threshold, self.levels = float(threshold), levels
        self._reference: torch.Tensor | None = None  # (U, S, C, F, P)

    def add(self, units: torch.Tensor) -> torch.Tensor:
        """(U,) bool: which of the group's units (U, S, C, F, P) to encode; the first group's all. ValueError when
        a group's shape differs from the first's."""
        if self._reference is None:
            self._reference = units.clone()
            return torch.ones(units.shape[0], dtype=torch.bool)
        if units.shape != self._reference.shape:
            raise ValueError(f"a group of {tuple(units.shape)} unit pixels follows {tuple(self._reference.shape)}")
        encode = unit_change(units, self._reference, self.levels) >= self.threshold
        self._reference[encode] = units[encode]
        return encode


def carried_rows(encoded: torch.Tensor) -> torch.Tensor:
    """(T*U,) long: for each unit in raster order, the row of the last encoded unit at its place (itself when it is
    encoded) among the encoded units' rows, in raster order. encoded: (T, U) bool, group 0 all True."""
    groups, units = encoded.shape
    if not bool(encoded[0].all()):
        raise ValueError("the first group is always encoded whole")
    row_of = (encoded.reshape(-1).cumsum(0) - 1).reshape(groups, units)
    group = torch.arange(groups)[:, None].expand(groups, units)
    last = torch.where(encoded, group, torch.full_like(group, -1)).cummax(dim=0).values
    return row_of[last, torch.arange(units)[None, :].expand(groups, units)].reshape(-1)
