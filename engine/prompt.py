"""From (sampled frames, question, history) to the unpruned prompt the language model would see.

The HF processor does the pixel work and expands the video placeholder; we keep its token ids and add
what EVS and the scheduler need: which tokens are video, their MRoPE positions, where the reusable
[system + video] prefix ends.
"""

from dataclasses import dataclass

import torch
from transformers.video_utils import VideoMetadata

from .families import Family
from .video import SampledVideo


@dataclass
class PreparedPrompt:
    """One request's unpruned prompt and pixels.

    input_ids: (L,) long. is_video: (L,) bool, True on the T*h*w video pad tokens.
    positions: (3, L) long MRoPE t/h/w positions of the unpruned prompt (a family without rotary positions:
    each token's index, Family.full_positions).
    prefix_len: tokens of [system + video], up to and including the video's closing marker.
    reply_start: tokens before the answer's opening (Qwen3.5's think block after `<|im_start|>assistant\n`):
    a later turn quoting this answer continues the prompt from here, since the template writes an earlier
    answer without its opening. The prompt's length when the family writes no opening.
    pixel_values: (P, C) float patches; grid_thw_patches: (3,) long patch grid for the vision tower.
    grid_thw: (T, h, w) in LLM tokens. timestamps_s: (T,) centre time of each temporal group.
    """

    input_ids: torch.Tensor
    is_video: torch.Tensor
    positions: torch.Tensor
    prefix_len: int
    reply_start: int
    pixel_values: torch.Tensor
    grid_thw_patches: torch.Tensor
    grid_thw: tuple[int, int, int]
    timestamps_s: list[float]


def chat_text(family: Family, system: str, question: str, history: list[tuple[str, str]],
              thinking: bool = False) -> str:
    """ChatML conversation as the checkpoint's chat template writes it: the video opens the first user turn,
    earlier turns follow, then the question and the opening of the answer (thinking: the template's
    enable_thinking, for a family that has the switch)."""
    turns = [*history, (question, None)]
    written = system or family.writes_empty_system
    parts = [f"<|im_start|>system\n{family.message_text(system)}<|im_end|>\n"] if written else []
    for i, (asked, answered) in enumerate(turns):
        video = family.video_placeholder() if i == 0 else ""
        parts.append(f"<|im_start|>user\n{family.message_text(video + asked)}<|im_end|>\n<|im_start|>assistant\n")
        if answered is not None:
            parts.append(f"{family.earlier_answer(answered)}<|im_end|>\n")
    parts.append(family.answer_opening(thinking))
    return "".join(parts)


def group_timestamps_s(frame_positions: list[float], native_fps: float, temporal_patch: int) -> list[float]:
    """Centre time of each temporal group: the mean of its first and last frame's time (as Qwen does).

    frame_positions: each frame's time in average frame intervals (`processor_frame_positions`), divided by
    native_fps exactly as the HF processor divides them, so these times are the ones its `<t seconds>`
    text shows.
    """
    times = [i / native_fps for i in frame_positions]
    return [(times[g] + times[g + temporal_patch - 1]) / 2 for g in range(0, len(times), temporal_patch)]


def processor_frame_positions(video: SampledVideo) -> list[float]:
    """Each sampled frame's presentation time in average frame intervals (timestamps_s * native_fps).

    The HF processors take frame indices and an fps and divide (Qwen3-VL's `<t seconds>`; Qwen2.5-VL's
    seconds per group come from the count and fps). Index / fps is the frame's time only at a constant
    rate; the container's time scaled by the average rate is right for variable-rate files too, and
    equals the index at a constant rate (snapped to it, so those prompts are unchanged to the bit).
    """
    positions = []
    for index, time_s in zip(video.frame_indices, video.timestamps_s):
        position = time_s * video.native_fps
        positions.append(index if abs(position - index) < 1e-6 else position)
    return positions


def processor_inputs(loaded, video: SampledVideo, text: str, max_pixels_per_frame: int) -> dict:
    """Run the real HF processor on our own sampled frames (do_sample_frames=False), with the frames' true
    times (`processor_frame_positions`) and the file's average fps, so Qwen3-VL's timestamps are the
    container's and Qwen2.5-VL's second_per_grid_ts is temporal_patch / video.sampled_fps."""
    from .models import sized_processor

    metadata = VideoMetadata(
        total_num_frames=video.total_frames,
        fps=video.native_fps,
        frames_indices=processor_frame_positions(video),
        duration=video.duration_s,
        height=video.frames.shape[1],
        width=video.frames.shape[2],
    )
    processor, size_kwargs = sized_processor(loaded, len(video.frames), max_pixels_per_frame)
    return processor(
        text=[text],
        videos=[video.frames],
        video_metadata=[metadata],
        do_sample_frames=False,
        return_tensors="pt",
        **size_kwargs,
    )


def prepare_prompt(
    loaded, family: Family, video: SampledVideo, question: str, history, system: str, max_pixels_per_frame: int,
    thinking: bool = False,
) -> PreparedPrompt:
    text = chat_text(family, system, question, history, thinking)
    inputs = processor_inputs(loaded, video, text, max_pixels_per_frame)
    input_ids = inputs["input_ids"][0]
    config, tokenizer = loaded.model.config, loaded.processor.tokenizer
    pixels = family.video_inputs(inputs, config)
    is_video = input_ids == family.video_token_id(config)
    positions = family.full_positions(is_video, pixels.grid_thw, pixels.second_per_group)
    last_video = int(torch.nonzero(is_video).max())
    if int(input_ids[last_video + 1]) != family.video_end_token_id(config, tokenizer):
        raise ValueError("the processor did not close the video with its end marker")
    temporal_patch = family.temporal_patch
    opening = tokenizer(family.answer_opening(thinking), add_special_tokens=False)["input_ids"]
    ends_with_opening = 0 < len(opening) < len(input_ids) and input_ids[-len(opening):].tolist() == opening
    return PreparedPrompt(
        input_ids=input_ids,
        is_video=is_video,
        positions=positions,
        prefix_len=last_video + 2,
        reply_start=len(input_ids) - len(opening) if ends_with_opening else len(input_ids),
        pixel_values=pixels.pixel_values,
        grid_thw_patches=pixels.grid_thw_patches,
        grid_thw=pixels.grid_thw,
        timestamps_s=group_timestamps_s(processor_frame_positions(video), video.native_fps, temporal_patch),
    )
