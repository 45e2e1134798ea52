"""Engine-wide settings and per-request generation settings."""

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """Where the offline tiny models are saved once and loaded from afterwards (EVS_CACHE_DIR overrides)."""
    return Path(os.environ.get("EVS_CACHE_DIR") or Path.home() / ".cache" / "evs-video-chat")


@dataclass(frozen=True)
class FrameSampling:
    """How frames are taken from an upload; part of the feature-cache key.

    fps: frames sampled per second of video. max_frames: cap on sampled frames (rounded down to a
    multiple of the temporal patch, at least 2). max_pixels_per_frame: cap on height*width of each frame
    after resizing (the HF processor aligns sides to patch*merge).
    """

    fps: float = 2.0
    max_frames: int = 32
    max_pixels_per_frame: int = 224 * 224


@dataclass(frozen=True)
class FrameSamplingLimits:
    """The largest sampling settings on a device: the UI's slider maxima, and the engine refuses a request
    asking for more; on a GPU its memory plan also refuses a request whose video would not fit."""

    max_fps: float
    max_frames: int
    max_pixels_per_frame: int


def video_tokens(frames: int, max_pixels_per_frame: int, patch_size: int, merge_size: int, temporal_patch: int) -> int:
    """Most LLM video tokens `frames` frames of at most `max_pixels_per_frame` pixels become.

    One token covers (patch*merge)^2 pixels of `temporal_patch` frames: 32x32 x 2 frames on Qwen3-VL (patch 16,
    merge 2), 28x28 x 2 frames on Qwen2.5-VL (patch 14). Sides are multiples of patch*merge, so h*w <= cap
    means at most cap // (patch*merge)^2 tokens per group whatever the aspect ratio (exact for a square cap
    such as 448x448). Frames are taken in whole temporal groups, as engine/reading/video.py samples them.
    """
    groups = frames // temporal_patch
    return groups * (max_pixels_per_frame // (patch_size * merge_size) ** 2)


# The CPU keeps the class defaults (about 800 video tokens on Qwen3-VL: 16 groups x 7x7), which the tests
# and tiny models are sized for. On a GPU the defaults must give EVS something to prune: a 1-2 minute clip
# at 2 fps is 120-240 frames, capped at 128 = 64 temporal groups; 448x448 per frame is 14x14 = 196 tokens
# per group on Qwen3-VL, so 64 x 196 = 12,544 video tokens (16x16 = 256 per group, 16,384 in all, on
# Qwen2.5-VL). Qwen3-VL-4B's KV cache holds that in 1.7 GiB (147,456 bytes a token), and its ViT takes it
# as 50,176 patches, inside the GPU's 65,536-patch forward budget, so one request is one forward.
CPU_FRAME_SAMPLING = FrameSampling()
GPU_FRAME_SAMPLING = FrameSampling(fps=2.0, max_frames=128, max_pixels_per_frame=448 * 448)
# Slider maxima: the CPU keeps today's ranges; a GPU offers twice the frames and 896x896 frames (the
# memory plan says when a combination is too large for the GPU's free memory).
CPU_FRAME_SAMPLING_LIMITS = FrameSamplingLimits(max_fps=8.0, max_frames=128, max_pixels_per_frame=32 * 112 * 112)
GPU_FRAME_SAMPLING_LIMITS = FrameSamplingLimits(max_fps=8.0, max_frames=256, max_pixels_per_frame=896 * 896)


def max_media(config, device_type: str) -> int:
    """Videos and images one request may carry: EngineConfig.max_media, else by device ("cuda" or another)."""
    if config.max_media is not None:
        return config.max_media
    return GPU_MAX_MEDIA if device_type == "cuda" else CPU_MAX_MEDIA


def default_frame_sampling(device_type: str) -> FrameSampling:
    """How frames are sampled when a request does not say: by the device the model runs on ("cuda",
    "cpu", ...; anything but "cuda" gets the CPU defaults)."""
    return GPU_FRAME_SAMPLING if device_type == "cuda" else CPU_FRAME_SAMPLING


def frame_sampling_limits(device_type: str) -> FrameSamplingLimits:
    """The UI's slider maxima on `device_type`, as default_frame_sampling picks its defaults."""
    return GPU_FRAME_SAMPLING_LIMITS if device_type == "cuda" else CPU_FRAME_SAMPLING_LIMITS


def vit_patch_budget(config, device_type: str) -> int:
    """Patches (rows of pixel_values) in one vision forward: EngineConfig.vit_patch_budget, else 65,536 on a
    GPU ("cuda"; one forward per burst pays, and the memory plan counts its activations) and 4,096 on a CPU
    (where larger batches overflow the caches: EngineConfig says what was measured)."""
    if config.vit_patch_budget is not None:
        return config.vit_patch_budget
    return 65536 if device_type == "cuda" else 4096


DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

# Video limits (EngineConfig fields; read_video's defaults). Length: 3 hours, as sampling caps the frames and
# the decoder seeks, so a long video costs little more to read than a short one (bench/decoding.py). Frame
# size as stored: DCI 4K (4096x2160, 8.8 megapixels) and UHD pass; 8K (33 megapixels a frame) is refused
# before decoding, since each decoded frame alone is 50 MB and the decoder holds a dozen.
MAX_VIDEO_SECONDS = 3 * 3600.0
MAX_VIDEO_SOURCE_PIXELS = 4096 * 2160
# Heap and private writable memory of a reader process while it reads one file (RLIMIT_DATA). Measured on a 2-minute
# 1080p file: 0.2 GB for 32 frames of 224x224, 0.8 GB at the UI's largest (256 frames of up to 896x896, 0.6 GB of them);
# a 4K source adds a few hundred MB of reference frames. A file that makes FFmpeg allocate without bound
# gets a MemoryError in its own process and the user a sentence.
READ_MEMORY_BYTES = 4 << 30
# The largest video a request may send: an upload (app.py's --max-file-mb), a data: URL, a fetched file.
MAX_FILE_BYTES = 200 << 20
# The most of an upload's soundtrack a model that hears is given, from its start: 10 minutes are 7,501 audio
# tokens on Nemotron-H Omni (12.5 a second) and 38 MB of samples at 16 kHz; past it the rest is not heard.
MAX_SOUNDTRACK_SECONDS = 600.0
# The largest picture (a still image, or an animated one's frames) as stored: 50 megapixels pass a 48-megapixel
# phone photo (8064x6048), whose decoded pixels are 146 MB; a PNG that says 40,000 x 40,000 (1,600 megapixels,
# a decompression bomb of a few KB) is refused from its header, before any pixel is decoded.
MAX_PICTURE_PIXELS = 50_000_000
# The most videos and images one request may carry (EngineConfig.max_media: None picks by device). Each is read,
# encoded and planned in full, so the device's defaults allow what its memory plan and ViT budget hold easily:
# four on a CPU, eight on a GPU.
CPU_MAX_MEDIA, GPU_MAX_MEDIA = 4, 8


@dataclass
class EngineConfig:
    model: str = "tiny-random"
    device: str = "auto"  # auto | cuda | cpu
    # None follows the device the model loads on (the function default_frame_sampling): the engine's
    # `default_frame_sampling`.
    frame_sampling: FrameSampling | None = None
    max_video_seconds: float = MAX_VIDEO_SECONDS
    max_video_source_pixels: int = MAX_VIDEO_SOURCE_PIXELS  # width*height of the frames as stored, before resizing
    max_picture_pixels: int = MAX_PICTURE_PIXELS  # width*height of a picture as stored, before resizing
    # Videos and images in one request; None: CPU_MAX_MEDIA on a CPU, GPU_MAX_MEDIA on a GPU (`max_media`).
    max_media: int | None = None
    read_memory_bytes: int = READ_MEMORY_BYTES  # a reader process's memory cap per file (RLIMIT_DATA)
    max_file_bytes: int = MAX_FILE_BYTES
    read_timeout_s: float = 60.0  # reading one upload, once a reader has it (waiting for one is not counted)
    # Seconds of soundtrack a model with an audio tower hears; a longer one is cut there (a status line says so).
    max_soundtrack_seconds: float = MAX_SOUNDTRACK_SECONDS
    # Warm reader processes (engine/reading/pool.py): how many uploads are read at once, and how many parts
    # a long video is read in. None: one per core this process may run on.
    video_readers: int | None = None
    # Patches (pre-merge rows) in one ViT forward; the scheduler splits a burst's videos into forwards within
    # it (engine/scheduling/scheduler.py). None picks by device:
    # 65536 on a GPU (bounds activation memory), 4096 on a CPU, where larger batches overflow the caches
    # and turn the elementwise ops memory-bound (2 cores, 8 videos of 1568 patches: one forward 1.18x
    # eight separate ones, forwards of 2 videos 0.97x; `python -m bench`).
    vit_patch_budget: int | None = None
    feature_cache_bytes: int = 1 << 30
    prefix_cache_bytes: int = 1 << 30
    frame_cache_bytes: int = 256 << 20  # sampled frames of recent uploads (follow-ups skip reading the file)
    max_queue: int = 64  # requests waiting for admission before submit answers "busy"
    # Host bytes that admitted requests' frames, pixel values and soundtracks may hold together until their vision
    # forward (engine/scheduling/admission.py: each estimated from its frame sampling before it is read); past it
    # submit answers "busy". None: a quarter of the machine's memory (or of its container's limit).
    admission_bytes: int | None = None
    # Requests one client (a browser tab, a gradio_client, an API caller's address) may have waiting or being
    # answered at once (engine/front/shares.py): one sweep's worth, so that one client cannot fill the queue.
    max_client_requests: int = 16
    max_running: int = 16  # requests decoding together (the memory plan may lower it on a GPU)
    max_question_chars: int = 4000
    max_question_tokens: int = 1024  # the question alone, in the model's tokens
    max_history_tokens: int = 8192  # every earlier question and answer together, in the model's tokens
    # Checked before the history is tokenized, so that a body of megabytes is refused in microseconds: 8 characters
    # a token is more than English (about 4.5) or code takes, so the token limit still decides for any real
    # conversation. Turns: earlier (question, answer) pairs, each of which the chat template wraps in tokens the
    # token limit does not count.
    max_history_chars: int = 65536
    max_history_turns: int = 128
    max_new_tokens: int = 4096  # the most a request may ask for
    # Device bytes the memory plan (engine/memory/plan.py) divides between requests. None: on a GPU the free
    # memory measured after loading, on a CPU no plan (requests unbounded by memory). Set it to share a GPU
    # with another process, or to try the plan's limits on a CPU.
    memory_budget_bytes: int | None = None
    prefill_token_budget: int = 2048  # prompt tokens prefilled per iteration between decode steps (>= 1 prompt)
    # Live sessions (Engine.open_live, docs/live.md): how many may be open at once (the memory plan may allow
    # fewer on a GPU), and the most tokens each one's state holds (its KV: the prefix, and whole groups' text
    # counted with their video; engine/live/window.py; a checkpoint that declares a span holds at most that). None:
    # the planned video tokens of one request (the device's default frame sampling), so that a session costs no
    # more than an upload does.
    max_live_sessions: int = 4
    live_window_tokens: int | None = None
    # A temporal group whose pixels equal the previous group's is not encoded: its tokens take the previous group's
    # features, which the tower would give it again (each temporal group is encoded alone). Off only for the
    # equivalence tests, which compare the two.
    vision_reuse: bool = True
    # The dissimilarity at or below which a live token counts as unchanged: a watch is not asked again for them,
    # and causal EVS keeps none such. None: the checkpoint's measured floor when it declares one (it was trained
    # with it), else DEFAULT_LIVE_NOISE_FLOOR for the watches and 0 for causal EVS (LiveSessions.evs_floor).
    # Standing questions (LiveSession.watch) one session may hold.
    live_noise_floor: float | None = None
    max_watches_per_session: int = 8
    cache_dir: Path = field(default_factory=default_cache_dir)
    # None: the model's own when its folder says (tiny-trained: none at all), else DEFAULT_SYSTEM_PROMPT.
    system_prompt: str | None = None


# A live token that changed by no more than this is sensor or codec noise: measured on tiny-trained's vision tower
# (python -m bench.noise_floor), a still camera with noise up to 8 levels and H.264 at 250 kbps-4 Mbps changed no
# token by more than 1e-3, a shape moving or appearing changed one by 0.26 or more. A checkpoint's notes may say
# its own (live_noise_floor); docs/live.md, "The noise floor".
DEFAULT_LIVE_NOISE_FLOOR = 0.01

# The pruning rate of a request that names none, unless the checkpoint's config.json says `video_pruning_rate`
# (Engine.model_info["default_pruning_rate"] is the one in force).
DEFAULT_PRUNING_RATE = 0.7


@dataclass(frozen=True)
class GenerationParams:
    """Per-request settings. pruning_rate q in [0, 1): the fraction of video tokens pruned. pruning_method: which
    tokens, one of pruning.PRUNING_METHODS ("evs", "vidcom2", "uniform"; docs/architecture.md, "Pruning
    methods")."""

    pruning_rate: float = DEFAULT_PRUNING_RATE
    pruning_method: str = "evs"
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    ignore_eos: bool = False  # benchmarks decode a fixed number of tokens
    seed: int = 0
    frame_sampling: FrameSampling | None = None  # None: the engine's default
    # The done event then carries each generated token's logits, (generated, V) float32: for equivalence
    # tests and research, at V * 4 bytes per token.
    return_logits: bool = False
    # Think before answering (the chat template's enable_thinking): the thinking streams as "thinking" events
    # before the answer's "text". A model without the switch (Engine.model_info["thinks"]) ignores it.
    enable_thinking: bool = False
    # Hear the upload's soundtrack beside its frames. None: whenever the model has an audio tower
    # (Engine.model_info["hears"]); a model without one ignores True, as enable_thinking is ignored.
    hear_soundtrack: bool | None = None
    # Still patches skipped before the vision tower (pruning/still.py): a merge unit whose pixels changed less
    # than a threshold since it was last encoded is not encoded and not in the prompt; the pruning method then
    # chooses among the rest. A model whose tower encodes only whole groups (Engine.model_info
    # ["skips_still_patches"]) ignores it.
    skip_still_patches: bool = False


# Every limit a user can hit, and the environment variable that overrides it (README, "Limits").
# Uploads (EVS_MAX_FILE_MB) and temporary files (EVS_TEMP_*) are set by app.py's flags.
LIMIT_ENV = {
    "max_video_seconds": "EVS_MAX_VIDEO_SECONDS",
    "max_video_source_pixels": "EVS_MAX_VIDEO_SOURCE_PIXELS",
    "max_picture_pixels": "EVS_MAX_PICTURE_PIXELS",
    "max_media": "EVS_MAX_MEDIA",
    "read_timeout_s": "EVS_READ_TIMEOUT_S",
    "read_memory_bytes": "EVS_READ_MEMORY_BYTES",
    "max_soundtrack_seconds": "EVS_MAX_SOUNDTRACK_SECONDS",
    "max_queue": "EVS_MAX_QUEUE",
    "max_client_requests": "EVS_MAX_CLIENT_REQUESTS",
    "max_running": "EVS_MAX_RUNNING",
    "max_question_chars": "EVS_MAX_QUESTION_CHARS",
    "max_question_tokens": "EVS_MAX_QUESTION_TOKENS",
    "max_history_tokens": "EVS_MAX_HISTORY_TOKENS",
    "max_history_chars": "EVS_MAX_HISTORY_CHARS",
    "max_history_turns": "EVS_MAX_HISTORY_TURNS",
    "admission_bytes": "EVS_ADMISSION_BYTES",
    "max_new_tokens": "EVS_MAX_NEW_TOKENS",
}
# Variables renamed when reading a video stopped being called decoding: variable -> its old name, still read
# (with a warning) when the new one is not set, for one release.
OLD_LIMIT_ENV = {
    "EVS_READ_TIMEOUT_S": "EVS_DECODE_TIMEOUT_S",
    "EVS_READ_MEMORY_BYTES": "EVS_DECODE_MEMORY_BYTES",
}


def limits_from_env(environ=os.environ) -> dict:
    """EngineConfig fields for every LIMIT_ENV variable set in environ (or its OLD_LIMIT_ENV name);
    ValueError names a bad one."""
    # A limit whose default is None (picked by device) takes a whole number.
    kinds = {
        name: int if getattr(EngineConfig, name) is None else type(getattr(EngineConfig, name)) for name in LIMIT_ENV
    }
    found = {}
    for name, variable in LIMIT_ENV.items():
        text = environ.get(variable, "").strip()
        old = OLD_LIMIT_ENV.get(variable)
        if not text and old and environ.get(old, "").strip():
            log.warning("%s is deprecated and will be ignored after this release; set %s instead", old, variable)
            variable, text = old, environ[old].strip()
        if not text:
            continue
        try:
            value = kinds[name](float(text)) if kinds[name] is int and float(text).is_integer() else kinds[name](text)
        except ValueError:
            kind = "whole number" if kinds[name] is int else "number"
            raise ValueError(f"{variable}={text!r} is not a {kind}") from None
        if value <= 0:
            raise ValueError(f"{variable} must be above 0")
        found[name] = value
    return found
