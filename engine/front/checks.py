"""The checks of a request that need nothing but the engine's config: each problem a user could cause is an
InputError with one sentence. Engine.submit and replicas.ReplicatedEngine.submit both run them, so a
request refused behind --replicas reads as it would on one engine, before it travels to a replica."""

import math
import re

import pruning
from engine.config import EngineConfig, FrameSamplingLimits, GenerationParams
from engine.errors import BAD_HISTORY, NO_VIDEO, InputError

LIVE_PRUNING_METHOD = "evs"  # the one method with a causal form (pruning/causal.py)
# What torch.Generator.manual_seed takes: a signed or an unsigned 64-bit number.
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)
BAD_SEED = f"The seed must be a whole number from {SEED_RANGE[0]:,} to {SEED_RANGE[1]:,}."
CONTROL_TOKEN = re.compile(r"<\|[a-z_]+\|>")


def check_text(text: str, what: str) -> None:
    """The model's control tokens (<|video_pad|>, <|im_end|>, ...) in user text would be read as markup."""
    if CONTROL_TOKEN.search(text):
        raise InputError(f"The {what} may not contain control markers such as <|im_end|>.")


def model_markup(tokenizer) -> tuple[str, ...]:
    """The tokenizer's added tokens written as tags (<image>, <so_embedding>, <think>, <|im_end|>): the
    model's markup, whatever its family calls it."""
    return tuple(sorted(t for t in tokenizer.get_added_vocab() if len(t) > 2 and t[0] == "<" and t[-1] == ">"))


def check_markup(text: str, what: str, markup: tuple[str, ...]) -> None:
    """A tag of the model's own in user text would be read as markup: a media placeholder the processor
    cannot match to any media, an end of turn the user did not write."""
    found = next((tag for tag in markup if tag in text), None)
    if found:
        raise InputError(f"The {what} may not contain control markers such as {found}.")


def check_params(question: str, params: GenerationParams, config: EngineConfig, limits: FrameSamplingLimits) -> None:
    """Raise InputError for anything in the request a user could have got wrong."""
    if not isinstance(question, str) or not question.strip():
        raise InputError("Please type a question about the video.")
    if len(question) > config.max_question_chars:
        raise InputError(
            f"The question is {len(question):,} characters long; the limit is {config.max_question_chars:,}."
        )
    check_text(question, "question")
    check_settings(params, config, limits)


def check_settings(params: GenerationParams, config: EngineConfig, limits: FrameSamplingLimits) -> None:
    """Raise InputError for any setting of params a user could have got wrong (a live session's, which has no
    question yet, as well as a request's)."""
    try:
        pruning.validate_pruning_rate(params.pruning_rate)
        pruning.validate_pruning_method(params.pruning_method)
    except ValueError as error:
        raise InputError(str(error)) from None
    if not isinstance(params.max_new_tokens, int) or not 1 <= params.max_new_tokens <= config.max_new_tokens:
        raise InputError(f"Max new tokens must be a whole number from 1 to {config.max_new_tokens:,}.")
    temperature = params.temperature
    if not (
        isinstance(temperature, (int, float))
        and math.isfinite(temperature)
        and (temperature == 0 or temperature >= 0.01)
    ):
        raise InputError("The temperature must be 0 (greedy) or a number of at least 0.01.")
    if not isinstance(params.seed, int) or not SEED_RANGE[0] <= params.seed <= SEED_RANGE[1]:
        raise InputError(BAD_SEED)
    if not isinstance(params.enable_thinking, bool):
        raise InputError("Think first must be true or false.")
    if params.hear_soundtrack is not None and not isinstance(params.hear_soundtrack, bool):
        raise InputError("Hear the soundtrack must be true or false.")
    if not isinstance(params.skip_still_patches, bool):
        raise InputError("Skip still patches must be true or false.")
    if not (isinstance(params.top_p, (int, float)) and 0 < params.top_p <= 1):
        raise InputError("Top-p must be above 0 and at most 1.")
    sampling = params.frame_sampling
    if sampling is not None and not (
        sampling.fps > 0 and sampling.max_frames >= 2 and sampling.max_pixels_per_frame >= 28 * 28
    ):
        raise InputError("Sampling needs fps above 0, at least 2 frames and at least 28x28 pixels per frame.")
    if sampling is not None:
        for what, asked, most in [
            ("fps", sampling.fps, limits.max_fps),
            ("frames", sampling.max_frames, limits.max_frames),
            ("pixels per frame", sampling.max_pixels_per_frame, limits.max_pixels_per_frame),
        ]:
            if asked > most:
                raise InputError(f"{asked:,} {what} were asked for; this server samples at most {most:,}.")


def check_live_settings(params: GenerationParams, config: EngineConfig, limits: FrameSamplingLimits) -> None:
    """check_settings for a live session's params, whose pruning method must be EVS: only EVS has a causal form
    (pruning/causal.py). VidCom2 budgets each frame by its uniqueness across the whole video and uniform spaces
    its groups over the whole video; a stream's end is unknown to both (docs/live.md)."""
    check_settings(params, config, limits)
    if params.pruning_method != LIVE_PRUNING_METHOD:
        raise InputError(
            f"A live session prunes with causal EVS only (the other methods need the whole video); "
            f"got pruning method {params.pruning_method!r}."
        )


def media_paths(video, media) -> list[str]:
    """The uploads of a request, in order, from Engine.submit's `video` (one upload) or `media` (several):
    InputError when both are given, or an entry is not a path."""
    if video is not None and media is not None:
        raise InputError("Send one upload as the video, or several as the media, not both.")
    if media is None:
        return [] if video is None else [video]
    if isinstance(media, (str, bytes)) or not hasattr(media, "__iter__"):
        raise InputError("The media must be a list of uploaded files.")
    return list(media)


def too_many_media(sent: int, max_media: int) -> str:
    """The sentence for more uploads in one question than max_media (a way in that fetches or decodes them says
    it before it does)."""
    return f"{sent} videos and pictures were sent; this server takes at most {max_media} in one question."


def check_request(
    media: list,
    question: str,
    params: GenerationParams,
    history,
    config: EngineConfig,
    limits: FrameSamplingLimits,
    max_media: int,
) -> list[tuple[str, str]]:
    """Every check of this module on one request (media: its uploads, media_paths'; max_media: the most one
    request may carry); returns the history as (question, answer) string pairs."""
    check_params(question, params, config, limits)
    if not media or any(path is None or not str(path).strip() for path in media):
        raise InputError(NO_VIDEO)
    if len(media) > max_media:
        raise InputError(too_many_media(len(media), max_media))
    history = history_turns(history, config)
    for turn in history:
        check_text(" ".join(turn), "conversation history")
    return history


def history_turns(history, config: EngineConfig) -> list[tuple[str, str]]:
    """The history as (question, answer) string pairs, its turns and characters within their limits: checked
    before anything tokenizes or searches it, so that megabytes of it cost a count, not seconds of the server."""
    if hasattr(history, "__len__") and len(history) > config.max_history_turns:
        raise InputError(too_many_turns(len(history), config.max_history_turns))
    try:
        history = [(str(asked), str(answered)) for asked, answered in history]
    except (TypeError, ValueError):
        raise InputError(BAD_HISTORY) from None
    if len(history) > config.max_history_turns:
        raise InputError(too_many_turns(len(history), config.max_history_turns))
    chars = sum(len(asked) + len(answered) for asked, answered in history)
    if chars > config.max_history_chars:
        raise InputError(
            f"The conversation so far is {chars:,} characters long; the limit is {config.max_history_chars:,}: "
            "please start a new conversation."
        )
    return history


def too_many_turns(turns: int, most: int) -> str:
    return (
        f"The conversation so far has {turns:,} earlier questions; the limit is {most:,}: "
        "please start a new conversation."
    )
