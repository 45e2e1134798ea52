"""From (media: videos' sampled frames and soundtracks, still images; question, history) to the unpruned prompt
the language model would see.

The HF processor does the pixel work, the soundtrack's mel features, and expands the media and audio
placeholders; we keep its token ids and add what EVS and the scheduler need: which tokens are media and which
audio, their MRoPE positions, where the reusable [system + media (+ soundtracks)] prefix ends.
"""

from dataclasses import dataclass, field

import torch
from transformers.video_utils import VideoMetadata

from engine.families.base import AudioInputs, Family, VideoInputs
from engine.families.registry import family_for
from engine.reading.media import Medium, StillImage
from engine.reading.video import SampledVideo

from .audio import audio_token_count, processor_audio


@dataclass
class MediumPrompt(VideoInputs):
    """One medium of a prompt as the processor gave it (VideoInputs: its pixels and grids; is_image for a still
    image), with what the engine adds: timestamps_s, the centre time of each temporal group of a video ([] for
    an image); audio, the audio tower's input of a video's soundtrack when it was heard, else None, and
    audio_tokens, the tokens the processor wrote for it (0 when not heard). pixel_values and audio are None once
    the vision forward is done with them (Request.drop_pixels): the grids and counts stay."""

    timestamps_s: list[float] = field(default_factory=list)
    audio: AudioInputs | None = None
    audio_tokens: int = 0

    @property
    def kind(self) -> str:
        """ "video" or "image"."""
        return "image" if self.is_image else "video"


@dataclass
class UnprunedPrompt:
    """One request's unpruned prompt and pixels.

    input_ids: (L,) long. is_visual: (L,) bool, True on every medium's T*h*w tokens (video and image tokens), the
    media in order. is_audio: (L,) bool, True on the heard soundtracks' audio tokens (each after its video's).
    positions: (3, L) long MRoPE t/h/w positions of the unpruned prompt (a family without rotary positions:
    each token's index, Family.full_positions).
    prefix_len: tokens of [system + media], up to and including the last medium's closing marker (or its
    soundtrack's, when heard).
    reply_start: tokens before the answer's opening (Qwen3.5's think block after `<|im_start|>assistant\n`):
    a later turn quoting this answer continues the prompt from here, since the template writes an earlier
    answer without its opening. The prompt's length when the family writes no opening.
    media: one MediumPrompt per medium, in prompt order.
    """

    input_ids: torch.Tensor
    is_visual: torch.Tensor
    is_audio: torch.Tensor
    positions: torch.Tensor
    prefix_len: int
    reply_start: int
    media: list[MediumPrompt]

    @property
    def videos(self) -> list[MediumPrompt]:
        return [medium for medium in self.media if not medium.is_image]

    @property
    def video_tokens(self) -> int:
        """Tokens of every video (what EVS prunes from), before pruning."""
        return sum(medium.tokens for medium in self.videos)

    @property
    def media_tokens(self) -> int:
        """Tokens of every medium, images included."""
        return sum(medium.tokens for medium in self.media)

    @property
    def heard(self) -> bool:
        """Whether any soundtrack was heard."""
        return any(medium.audio is not None for medium in self.media)


def chat_text(
    family: Family,
    system: str,
    question: str,
    history: list[tuple[str, str]],
    thinking: bool = False,
    heard: bool = False,
    media: str | None = None,
) -> str:
    """ChatML conversation as the checkpoint's chat template writes it: the media open the first user turn
    (media: their text, each medium's placeholder or its expansion, in order; None: one video's placeholder,
    followed by its soundtrack's when heard, a family that hears), earlier turns follow, then the question and
    the opening of the answer (thinking: the template's enable_thinking, for a family that has the switch)."""
    turns = [*history, (question, None)]
    written = system or family.writes_empty_system
    if media is None:
        media = family.video_placeholder() + (family.audio_placeholder() if heard else "")
    parts = [f"<|im_start|>system\n{family.message_text(system)}<|im_end|>\n"] if written else []
    for i, (asked, answered) in enumerate(turns):
        opening = media if i == 0 else ""
        parts.append(f"<|im_start|>user\n{family.message_text(opening + asked)}<|im_end|>\n<|im_start|>assistant\n")
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


def processor_inputs(
    loaded, video: SampledVideo, text: str, max_pixels_per_frame: int, audio: dict | None = None
) -> dict:
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
    processor, size_kwargs = family_for(loaded.model).sized_processor(
        loaded.processor, len(video.frames), max_pixels_per_frame
    )
    return processor(
        text=[text],
        videos=[video.frames],
        video_metadata=[metadata],
        do_sample_frames=False,
        return_tensors="pt",
        **size_kwargs,
        **(audio or {}),
    )


def medium_prompt(
    loaded, family: Family, medium: Medium, max_pixels_per_frame: int, hear: bool = False
) -> tuple[str, MediumPrompt]:
    """(text, prompt) of one medium alone, run through the real HF processor: the text it writes in the
    medium's place (the expansion of its placeholder, a heard soundtrack's after a video's) and its pixels.
    Each medium is processed alone, so it is sized as when it is asked about alone (a Qwen3-VL video's pixel
    budget counts its own frames; Nemotron-H Omni stacks only videos of one shape). hear: a video's soundtrack
    is heard (a family that hears), unless it is too short to hear (audio_inputs.min_soundtrack_samples)."""
    processor, config = loaded.processor, loaded.model.config
    if isinstance(medium, StillImage):
        placeholder = family.image_placeholder()
        inputs = processor(
            text=[placeholder],
            images=[medium.pixels],
            return_tensors="pt",
            **family.image_processor_kwargs(processor, max_pixels_per_frame),
        )
        prompt = MediumPrompt(**vars(family.image_inputs(inputs, config)))
    else:
        soundtrack = medium.soundtrack if hear else None
        audio = None if soundtrack is None else processor_audio(processor, soundtrack.samples, soundtrack.rate_hz)
        placeholder = family.video_placeholder() + (family.audio_placeholder() if audio else "")
        inputs = processor_inputs(loaded, medium, placeholder, max_pixels_per_frame, audio)
        timestamps = group_timestamps_s(processor_frame_positions(medium), medium.native_fps, family.temporal_patch)
        prompt = MediumPrompt(**vars(family.video_inputs(inputs, config)), timestamps_s=timestamps)
        if audio is not None:
            prompt.audio = family.audio_inputs(inputs)
            prompt.audio_tokens = audio_token_count(processor, len(soundtrack.samples))
            if int((inputs["input_ids"][0] == family.audio_token_id(config)).sum()) != prompt.audio_tokens:
                raise ValueError("the processor did not write the soundtrack's audio tokens as counted")
    text = processor.tokenizer.decode(
        inputs["input_ids"][0], skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    return text, prompt


def unpruned_prompt(
    loaded,
    family: Family,
    media: list[Medium] | Medium,
    question: str,
    history,
    system: str,
    max_pixels_per_frame: int,
    thinking: bool = False,
    hear: bool = False,
) -> UnprunedPrompt:
    """The unpruned prompt about media (one medium, or several in order), as the processor writes it when given
    them all: each medium's text (medium_prompt) in its placeholder's place, the whole text tokenized at once.
    hear: every video's soundtrack is heard after it (a family that hears)."""
    media = media if isinstance(media, list) else [media]
    written = [medium_prompt(loaded, family, medium, max_pixels_per_frame, hear) for medium in media]
    processor, config = loaded.processor, loaded.model.config
    tokenizer = processor.tokenizer
    text = chat_text(family, system, question, history, thinking, media="".join(text for text, _ in written))
    input_ids = tokenizer([text], return_tensors="pt")["input_ids"][0]
    prompts = [prompt for _, prompt in written]
    is_visual = torch.isin(input_ids, torch.tensor(family.visual_token_ids(config)))
    is_audio = torch.zeros_like(is_visual)
    if any(prompt.audio is not None for prompt in prompts):
        is_audio = input_ids == family.audio_token_id(config)
    # Markers the question would add (a typed `<|image_pad|>` or `<so_embedding>`) would be taken for a medium's.
    written_counts = sum(p.tokens for p in prompts), sum(p.audio_tokens for p in prompts)
    if (int(is_visual.sum()), int(is_audio.sum())) != written_counts:
        raise ValueError("the prompt does not hold the media's tokens as the processor wrote them")
    positions = family.full_positions(is_visual, prompts)
    last_visual = int(torch.nonzero(is_visual).max())
    if int(input_ids[last_visual + 1]) != family.video_end_token_id(config, tokenizer):
        raise ValueError("the processor did not close the last medium with its end marker")
    prefix_end = last_visual
    if prompts[-1].audio is not None:
        prefix_end = int(torch.nonzero(is_audio).max())
        if int(input_ids[prefix_end + 1]) != family.audio_end_token_id(tokenizer):
            raise ValueError("the processor did not close the soundtrack with its end marker")
    opening = tokenizer(family.answer_opening(thinking), add_special_tokens=False)["input_ids"]
    ends_with_opening = 0 < len(opening) < len(input_ids) and input_ids[-len(opening) :].tolist() == opening
    return UnprunedPrompt(
        input_ids=input_ids,
        is_visual=is_visual,
        is_audio=is_audio,
        positions=positions,
        prefix_len=prefix_end + 2,
        reply_start=len(input_ids) - len(opening) if ends_with_opening else len(input_ids),
        media=prompts,
    )
