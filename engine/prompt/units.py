"""Which merge units of a medium the vision tower encodes, decided on the processor's pixels before it runs
(pruning/still.py has the rules): an exact repeat of the previous temporal group is never encoded (its tokens take
the previous group's features and stay in the prompt), and with skip_still_patches a unit whose pixels barely
changed since it was last encoded is not encoded and leaves the prompt."""

from dataclasses import dataclass

import torch

import pruning
from engine.families.base import Family, VideoInputs


@dataclass
class EncodePlan:
    """One medium's plan. encoded: (T, h*w) bool, the units the vision tower runs (group 0 always whole).
    leave_out: whether the units not encoded leave the prompt (still units) rather than stay in it with the
    features of the last encoded unit at their place (exact repeats). patches_per_unit: the tower's patches in one
    unit (merge^2)."""

    encoded: torch.Tensor
    leave_out: bool
    patches_per_unit: int

    @property
    def patches(self) -> int:
        """Vision patches (rows of pixel values) the tower encodes."""
        return int(self.encoded.sum()) * self.patches_per_unit

    @property
    def candidates(self) -> torch.Tensor | None:
        """(T*h*w,) bool, the tokens a pruning method may keep, when some left the prompt; None: every token."""
        return self.encoded.reshape(-1) if self.leave_out else None


def encode_plan(
    family: Family, medium: VideoInputs, levels: torch.Tensor, reuse: bool, skip: bool, threshold: float
) -> EncodePlan:
    """The plan of one medium: reuse, whether exact repeats of the previous group are not encoded
    (EngineConfig.vision_reuse); skip, whether still units are skipped (the request's skip_still_patches, on a
    family whose tower encodes part of a group); levels: the processor's (C,) intensity levels per pixel value unit
    (Family.pixel_levels); threshold: the still rule's, in levels."""
    T, h, w = medium.grid_thw
    per_unit = medium.pixel_values.shape[0] // medium.tokens
    if skip:
        encoded = pruning.still_units(family.unit_pixels(medium), levels, threshold)
    elif reuse:
        encoded = (~pruning.repeated_groups(medium.pixel_values, T))[:, None].expand(T, h * w).clone()
    else:
        encoded = torch.ones(T, h * w, dtype=torch.bool)
    return EncodePlan(encoded, skip, per_unit)
