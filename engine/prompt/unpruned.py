"""From (sampled frames, soundtrack, question, history) to the unpruned prompt the language model would see.

The HF processor does the pixel work, the soundtrack's mel features, and expands the video and audio
placeholders; we keep its token ids and add what EVS and the scheduler need: which tokens are video and which
audio, their MRoPE positions, where the reusable [system + video (+ soundtrack)] prefix ends.
"""

from dataclasses import dataclass

import torch
from transformers.video_utils import VideoMetadata

from engine.families.base import AudioInputs, Family
from engine.families.registry import family_for
from engine.reading.soundtrack import Soundtrack
from engine.reading.video import SampledVideo

from .audio import audio_token_count, processor_audio


@dataclass
class UnprunedPrompt:
    """One request's unpruned prompt and pixels.

    input_ids: (L,) long. is_video: (L,) bool, True on the T*h*w video pad tokens. is_audio: (L,) bool, True on
    the soundtrack's audio tokens (none when it was not heard).
    positions: (3, L) long MRoPE t/h/w positions of the unpruned prompt (a family without rotary positions:
    each token's index, Family.full_positions).
    prefix_len: tokens of [system + video], up to and including the video's closing marker, and of the
    soundtrack up to its closing marker when it was heard (it follows the video).
    reply_start: tokens before the answer's opening (Qwen3.5's think block after `<|im_start|>assistant\n`):
    a later turn quoting this answer continues the prompt from here, since the template writes an earlier
    answer without its opening. The prompt's length when the family writes no opening.
    pixel_values: (P, C) float patches; grid_thw_patches: (3,) long patch grid for the vision tower.
    grid_thw: (T, h, w) in LLM tokens. timestamps_s: (T,) centre time of each temporal group.
    audio: the audio tower's input when the soundtrack was heard, else None.
    """

    input_ids: torch.Tensor
    is_video: torch.Tensor
    is_audio: torch.Tensor
    positions: torch.Tensor
    prefix_len: int
    reply_start: int
    pixel_values: torch.Tensor
    grid_thw_patches: torch.Tensor
    grid_thw: tuple[int, int, int]
    timestamps_s: list[float]
    audio: AudioInputs | None = None


def chat_text(family: Family, system: str, question: str, history: list[tuple[str, str]],
              thinking: bool = False, heard: bool = False) -> str:
    """ChatML conversation as the checkpoint's chat template writes it: the video opens the first user turn
    (followed by its soundtrack when heard: a family that hears), earlier turns follow, then the question and
    the opening of the answer (thinking: the template's enable_thinking, for a family that has the switch)."""
    turns = [*history, (question, None)]
    written = system or family.writes_empty_system
    media = family.video_placeholder() + (family.audio_placeholder() if heard else "")
    parts = [f"<|im_start|>system\n{family.message_text(system)}<|im_end|>\n"] if written else []
    for i, (asked, answered) in enumerate(turns):
        video = media if i == 0 else ""
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


def processor_inputs(loaded, video: SampledVideo, text: str, max_pixels_per_frame: int,
                     audio: dict | None = None) -> dict:
    """Run the real HF processor on our own sampled frames (do_sample_frames=False), with the frames' true
    times (`processor_frame_positions`) and the file's average fps, so Qwen3-VL's timestamps are the
    container's and Qwen2.5-VL's second_per_grid_ts is temporal_patch / video.sampled_fps. audio: the
    soundtrack's processor arguments (audio_inputs.processor_audio), for a text that holds its placeholder."""
    metadata = VideoMetadata(
        total_num_frames=video.total_frames,
        fps=video.native_fps,
        frames_indices=processor_frame_positions(video),
        duration=video.duration_s,
        height=video.frames.shape[1],
        width=video.frames.shape[2],
    )
    processor, size_kwargs = family_for(loaded.model).sized_processor(loaded.processor, len(video.frames),
                                                                      max_pixels_per_frame)
    return processor(
        text=[text],
        videos=[video.frames],
        video_metadata=[metadata],
        do_sample_frames=False,
        return_tensors="pt",
        **size_kwargs,
        **(audio or {}),
    )


def unpruned_prompt(
    loaded, family: Family, video: SampledVideo, question: str, history, system: str, max_pixels_per_frame: int,
    thinking: bool = False, soundtrack: Soundtrack | None = None,
) -> UnprunedPrompt:
    """The unpruned prompt. soundtrack: heard after the video (a family that hears), unless it is too short
    to hear (audio_inputs.min_soundtrack_samples): then the prompt's `audio` is None, as without one."""
    processor = loaded.processor
    audio = None if soundtrack is None else processor_audio(processor, soundtrack.samples, soundtrack.rate_hz)
    text = chat_text(family, system, question, history, thinking, heard=audio is not None)
    inputs = processor_inputs(loaded, video, text, max_pixels_per_frame, audio)
    input_ids = inputs["input_ids"][0]
    config, tokenizer = loaded.model.config, processor.tokenizer
    pixels = family.video_inputs(inputs, config)
    is_video = input_ids == family.video_token_id(config)
    positions = family.full_positions(is_video, pixels.grid_thw, pixels.second_per_group)
    prefix_end = last_video = int(torch.nonzero(is_video).max())
    if int(input_ids[last_video + 1]) != family.video_end_token_id(config, tokenizer):
        raise ValueError("the processor did not close the video with its end marker")
    is_audio = torch.zeros_like(is_video)
    if audio is not None:
        is_audio = input_ids == family.audio_token_id(config)
        prefix_end = int(torch.nonzero(is_audio).max())
        # Markers the question would add (a typed `<so_embedding>`) would be taken for the soundtrack's.
        if int(is_audio.sum()) != audio_token_count(processor, len(soundtrack.samples)) or \
                int(input_ids[prefix_end + 1]) != family.audio_end_token_id(tokenizer):
            raise ValueError("the processor did not write the soundtrack's audio tokens and end marker as counted")
    temporal_patch = family.temporal_patch
    opening = tokenizer(family.answer_opening(thinking), add_special_tokens=False)["input_ids"]
    ends_with_opening = 0 < len(opening) < len(input_ids) and input_ids[-len(opening):].tolist() == opening
    return UnprunedPrompt(
        input_ids=input_ids,
        is_video=is_video,
        is_audio=is_audio,
        positions=positions,
        prefix_len=prefix_end + 2,
        reply_start=len(input_ids) - len(opening) if ends_with_opening else len(input_ids),
        pixel_values=pixels.pixel_values,
        grid_thw_patches=pixels.grid_thw_patches,
        grid_thw=pixels.grid_thw,
        timestamps_s=group_timestamps_s(processor_frame_positions(video), video.native_fps, temporal_patch),
        audio=None if audio is None else family.audio_inputs(inputs),
    )
