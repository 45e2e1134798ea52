"""The pruning picture of a request about several uploads: one per video (a picture is never pruned), the page
showing one at a time behind a choice of video, the `/ask` API sending them all.

A video is named by its place among the request's uploads, pictures counted ("Video 3" is the third upload),
as the stats' `media` list and the engine's EVS events (`EvsPicture.medium`) number them.
"""

import gradio as gr
import numpy as np

from engine.stream import EvsPicture
from ui import figures, frame_files, overlays


def video_label(medium: int) -> str:
    """ "Video 3" for the upload at index 2."""
    return f"Video {medium + 1}"


def first_picture(pictures: dict[int, EvsPicture]) -> EvsPicture:
    """The first video's picture among those received (pictures: by the video's place among the uploads)."""
    return pictures[min(pictures)]


def picture_outputs(picture: EvsPicture | None) -> dict:
    """The page's bars, heatmap and dimmed frames for one video (all empty for None)."""
    if picture is None:
        return dict(bars=None, heatmap=None, gallery=None)
    return dict(
        bars=figures.tokens_per_group_figure(picture),
        heatmap=figures.dissimilarity_figure(picture),
        gallery=frame_files.saved(overlays.frame_gallery(picture)),
    )


def video_choice(pictures: dict[int, EvsPicture], uploads: int, shown: int | None):
    """The choice of video above the pruning picture: shown when a request has two videos or more, on `shown`."""
    choices = [video_label(medium) for medium in sorted(pictures)]
    return gr.Radio(
        choices=choices,
        value=None if shown is None else video_label(shown),
        visible=len(choices) > 1,
        label=f"Which video ({len(choices)} of {uploads} uploads)",
    )


def show(choice: str | None, pictures: dict[int, EvsPicture] | None) -> tuple:
    """The choice's change: the bars, heatmap and dimmed frames of the chosen video."""
    chosen = next((p for medium, p in (pictures or {}).items() if video_label(medium) == choice), None)
    shown = picture_outputs(chosen)
    return shown["bars"], shown["heatmap"], shown["gallery"]


def media_figures_payload(pictures: dict[int, EvsPicture]) -> dict:
    """`/ask`'s figures: the first video's two figures as before, and with several videos "videos", each one's
    {"medium": its place among the uploads, "tokens_per_group": ..., "dissimilarity": ...} in order."""
    payload = figures.figures_payload(first_picture(pictures))
    if len(pictures) > 1:
        payload["videos"] = [
            {"medium": medium, **figures.figures_payload(pictures[medium])} for medium in sorted(pictures)
        ]
    return payload


def media_frame_gallery(pictures: dict[int, EvsPicture], uploads: int) -> list[tuple[np.ndarray, str]]:
    """`/ask`'s frames: every video's dimmed frames in order, each caption naming its video when the request had
    more than one upload."""
    frames = []
    for medium in sorted(pictures):
        prefix = f"{video_label(medium).lower()} · " if uploads > 1 else ""
        frames += [(frame, prefix + caption) for frame, caption in overlays.frame_gallery(pictures[medium])]
    return frames
