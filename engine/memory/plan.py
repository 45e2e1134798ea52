"""The memory plan: how many video tokens one request may have and how many requests may decode together,
so that what the engine keeps on the GPU fits in the memory left after loading, with a margin.

    dims = ModelDims.from_config(model.config, dtype_bytes=2)
    plan = plan_memory(dims, free_bytes=130 * GIB, settings=PlanSettings(planned_video_tokens=12_544))
    plan.max_video_tokens, plan.max_running, plan.kv_bytes_per_token, plan.state_bytes_per_sequence

`plan_memory` is arithmetic on plain numbers, so tests feed it made-up free-memory figures; `engine_plan`
measures the device after loading and is what the Engine calls; `checkpoint_plan` plans a checkpoint from
its config alone, for any free-memory figure, without a GPU (`python -m engine --model M --plan-gib 40 130`).

What the plan counts (bytes; N requests decoding together, each with at most V video tokens and, on a model
that hears, A audio tokens: the longest soundtrack it is given, EngineConfig.max_soundtrack_seconds):

    usable   = free * (1 - margin) - reserved                       reserved: feature + prefix cache bounds
    row(V)   = kv_copies * (kv_per_token * (V + A + text + new + spare)  one request's KV cache
                            + state_per_sequence)                    and its linear-attention state
             + feature_per_video_token * V                          its video features (full + EVS-kept)
             + feature_per_audio_token * A                          its audio features (EVS keeps them all)
    one(V)   = max(ViT forward over max(vit_patch_budget, V * merge^2) patches, audio forward over A tokens,
                   prefill of V + A + text + new tokens)
    live     = kv_per_token * (W + text + spare) + state_per_sequence  one live session's state (window W)
    L * live + N * row(V) + one(V) <= usable

- A live session keeps its window of W tokens (EngineConfig.live_window_tokens, by default the planned video
  tokens of one request; the window counts every token of the state, its groups' text with their kept video) in
  its own state, once: it never joins the decode batch, a question forks it into a row that N counts. The text
  term is slack for it: a prefill of up to 4 groups enters the state before the oldest leave. L = the configured
  max_live_sessions, fewer when so many would leave no room for one planned request (Plan.max_live_sessions); the
  rows are planned in what is left. A closed session counts until the worker has freed its state.

- kv_per_token = 2 (K and V) * KV layers * KV heads * head_dim * dtype bytes (147,456 on Qwen3-VL-4B in
  bf16). KV layers are the attention layers: all of them on Qwen2.5-VL and Qwen3-VL (MoE too); on the
  hybrid Qwen3.5 / 3.6 only the full-attention ones (text_config.layer_types; every 4th), 32,768 bytes a
  token on Qwen3.5-9B.
- state_per_sequence: a hybrid model's linear-attention layers (Gated DeltaNet, Mamba-2) keep, whatever the
  length, a conv state (conv_dim x conv kernel, model dtype) and a recurrent state (value heads x key head_dim
  x value head_dim, float32), as transformers' LinearAttentionLayer holds them: 49.5 MiB a sequence on
  Qwen3.5-9B (24 layers x (8,192 x 4 x 2 + 32 x 128 x 128 x 4 bytes)). 0 on KV-only models. Mamba-2 has the
  same two tensors (LinearAttentionDims.from_text_config maps its sizes onto these names).
- kv_copies = 3: a request joining or leaving rebuilds the decode batch (engine/state/decode_batch.py DecodeBatch.add
  / remove through lm_state.batch_cache): for a moment the old batch with the joining row's own cache (one
  copy of every row) and the new batch's buffers (a second) are alive together; the third is slack for the
  caching allocator, which cannot hand the old batch's blocks to a batch one row larger. The recurrent
  states are rebuilt the same way, so they count three times too.
- The prefix cache keeps a hybrid model's state snapshots (at the end of [system + video] and where the
  last answer began) beside the KV it stores; they count inside its byte bound (engine/state/prefix_cache.py), which
  is part of reserved.
- Every row is planned at the worst case, q = 0 (nothing pruned; compare mode always sends a q = 0
  request), and left padding makes every row of the batch as long as the longest.
- The ViT, the audio tower and the prefill never run at the same time and free their activations layer by
  layer (inference mode), so only the largest of the three counts, at one layer's worth: the towers' depth
  does not enter. A request over the ViT patch budget is encoded alone, hence max(vit_patch_budget, V * merge^2).
  The audio tower's attention is quadratic in the soundtrack's length (AudioDims.forward_bytes); it takes one
  soundtrack per forward (engine/worker/vision.py), so one soundtrack's forward counts.
  A hybrid model's prefill peaks in its linear-attention layers, whose chunked delta rule runs in float32
  (ModelDims.prefill_bytes).
- margin (10%) covers what the estimate leaves out: allocator fragmentation, cuBLAS / attention
  workspaces, the CUDA context of kernels loaded on first use.

How the two limits are chosen, so that both hold at once and more memory never lowers either:
max_running = min(configured max_running, how many rows of `planned_video_tokens` (the device's default
sampling on this model) fit); max_video_tokens = the planned size, or more when the configured
max_running rows of a larger size fit. When not even one planned-size request fits, one request may
decode at a time, with as many video tokens as fit alone.

On a CPU there is no plan (limits None): it serves the tiny models, whose KV cache is a few KiB per
request, app.py refuses large checkpoints on a CPU it chose itself, and host memory is already bounded by
the upload, duration and cache limits. EngineConfig.memory_budget_bytes turns the plan on anywhere.
"""

from dataclasses import dataclass

from engine.errors import InputError
from engine.families.registry import video_geometry
from engine.prompt.audio import audio_tokens

from .dims import FLOAT32_BYTES, GIB, MIB, ModelDims


@dataclass(frozen=True)
class PlanSettings:
    """What the plan sizes for, beside the model and the free memory.

    planned_video_tokens: the video tokens of a typical large request (the device's default sampling on
    this model); max_running rows of it must fit. planned_audio_tokens: the audio tokens of the longest
    soundtrack a request is given (EngineConfig.max_soundtrack_seconds), on a model that hears; 0 on the
    others. max_running: the configured ceiling. text_tokens: prompt
    tokens other than video pads planned per request: system prompt, question (at most 4,000 characters),
    Qwen3-VL's per-group timestamp and markers (a handful of tokens a group, some 600 at 64 groups) and a
    few turns of history. new_tokens: answer tokens planned per request, the UI's slider maximum; an API
    request may ask for up to the engine's 4,096 when the rest of its row leaves room (Plan.check_request
    counts the whole row). spare_tokens: KV slots a growing cache allocates ahead (engine/state/lm_state.py
    GrowingLayer.SPARE_TOKENS). vit_patch_budget: the ViT forward budget in patches. reserved_bytes: device
    memory held by the feature and prefix caches at their bounds. margin_fraction: of the free memory,
    kept back. kv_copies: of the decode batch's KV and recurrent state alive while it is rebuilt (module
    docstring). live_sessions: the configured most live sessions open at once (EngineConfig.max_live_sessions);
    live_window_tokens: the tokens each one's state holds at most, text and video (engine/worker/live.py).
    """

    planned_video_tokens: int
    planned_audio_tokens: int = 0
    max_running: int = 16
    text_tokens: int = 4096
    new_tokens: int = 1024
    spare_tokens: int = 256
    vit_patch_budget: int = 65536
    reserved_bytes: int = 2 * GIB
    margin_fraction: float = 0.10
    kv_copies: int = 3
    live_sessions: int = 0
    live_window_tokens: int = 0


class InsufficientMemory(RuntimeError):
    """The GPU has too little free memory after loading to serve even a small request."""


@dataclass(frozen=True)
class Plan:
    """The limits one engine serves under.

    free_bytes: device memory the plan divided (None: no plan). kv_bytes_per_token, state_bytes_per_sequence:
    what one request keeps per token and, on a hybrid model, per sequence (ModelDims); cache_summary: the
    two in words. max_video_tokens: most video tokens (T*h*w, before EVS) in one request;
    max_request_tokens: most prompt + answer tokens of one request (the KV row it may fill); None when
    unbounded. max_running: requests decoding together. reasons: one line per term of the arithmetic, for
    logs and tests. max_live_sessions: live sessions open at once (each holds its own state, outside the decode
    batch; a question forks it into a row of the batch, which max_running counts).
    """

    free_bytes: int | None
    kv_bytes_per_token: int
    state_bytes_per_sequence: int
    cache_summary: str
    max_video_tokens: int | None
    max_request_tokens: int | None
    max_running: int
    reasons: tuple[str, ...]
    max_live_sessions: int = 0

    @property
    def bounded(self) -> bool:
        return self.max_video_tokens is not None

    def check_serviceable(self, smallest_video_tokens: int) -> None:
        """InsufficientMemory (one sentence) when not even a small request of `smallest_video_tokens` video
        tokens fits; an engine that refuses every request is not worth starting."""
        if self.bounded and self.max_video_tokens < smallest_video_tokens:
            raise InsufficientMemory(
                f"After loading the model the GPU has {self.free_bytes / GIB:.1f} GiB free, room for "
                f"{max(0, self.max_video_tokens):,} video tokens per request, fewer than the "
                f"{smallest_video_tokens:,} of a small clip: use a GPU with more memory or a smaller checkpoint."
            )

    def summary(self) -> str:
        """One line for the start-up log."""
        if not self.bounded:
            return f"memory plan: none ({self.reasons[0]}); {self.cache_summary}, {self._running()} decoding together"
        return (
            f"memory plan: {self.free_bytes / GIB:.1f} GiB free, {self.cache_summary}, "
            f"at most {self.max_video_tokens:,} video tokens per request, {self._running()} decoding together, "
            f"{self.max_live_sessions} live session{'s' if self.max_live_sessions != 1 else ''}"
        )

    def _running(self) -> str:
        return f"{self.max_running} request{'s' if self.max_running != 1 else ''}"

    def check_fits(self, video_tokens: int, prompt_tokens: int, max_new_tokens: int, media: int = 1) -> None:
        """Raise InputError, one sentence saying what to lower, for a request the plan has no room for.

        video_tokens: T*h*w of every medium of the request together (its videos and pictures: the plan's video
        tokens per request count them all); prompt_tokens: its whole unpruned prompt (media included); media:
        how many there are."""
        if not self.bounded:
            return
        if video_tokens > self.max_video_tokens:
            what = "This video comes" if media == 1 else f"These {media} videos and pictures come"
            fewer = "" if media == 1 else "send fewer of them, or "
            raise InputError(
                f"{what} to {video_tokens:,} video tokens, more than the {self.max_video_tokens:,} this "
                f"server's GPU memory allows per request: {fewer}choose fewer frames or fewer pixels per frame."
            )
        needed = prompt_tokens + max_new_tokens
        if needed > self.max_request_tokens:
            raise InputError(
                f"This request needs {needed:,} tokens of prompt and answer, more than the "
                f"{self.max_request_tokens:,} this server's GPU memory allows per request: ask for fewer new "
                "tokens, start a new conversation, or choose fewer frames or fewer pixels per frame."
            )


def unbounded_plan(dims: ModelDims, max_running: int, why: str, max_live_sessions: int = 0) -> Plan:
    return Plan(
        free_bytes=None,
        kv_bytes_per_token=dims.kv_bytes_per_token,
        state_bytes_per_sequence=dims.state_bytes_per_sequence,
        cache_summary=dims.cache_summary(),
        max_video_tokens=None,
        max_request_tokens=None,
        max_running=max_running,
        reasons=(why,),
        max_live_sessions=max_live_sessions,
    )


def plan_memory(dims: ModelDims, free_bytes: int, settings: PlanSettings) -> Plan:
    """The limits under which N * row(V) + one(V) <= free * (1 - margin) - reserved (module docstring)."""
    s = settings
    usable = int(free_bytes * (1 - s.margin_fraction)) - s.reserved_bytes
    audio = s.planned_audio_tokens
    other_tokens = audio + s.text_tokens + s.new_tokens + s.spare_tokens

    def row_bytes(video: int) -> int:
        return (
            s.kv_copies * (dims.kv_bytes_per_token * (video + other_tokens) + dims.state_bytes_per_sequence)
            + dims.feature_bytes_per_video_token * video
            + dims.feature_bytes_per_audio_token * audio
        )

    def one_forward_bytes(video: int) -> int:
        return max(
            dims.vit_bytes(max(s.vit_patch_budget, video * dims.merge_patches)),
            dims.audio_bytes(audio),
            dims.prefill_bytes(video + audio + s.text_tokens + s.new_tokens),
        )

    # Live sessions first: each keeps its window's KV (and a hybrid's recurrent state) once, outside the batch; as
    # many as leave room for one planned request and its forward.
    live_row = (
        dims.kv_bytes_per_token * (s.live_window_tokens + s.text_tokens + s.spare_tokens)
        + dims.state_bytes_per_sequence
    )
    room_for_live = usable - one_forward_bytes(s.planned_video_tokens) - row_bytes(s.planned_video_tokens)
    max_live = min(s.live_sessions, max(0, room_for_live) // live_row)
    live_bytes = max_live * live_row
    usable_for_sessions = usable
    usable -= live_bytes

    def fits(rows: int, video: int) -> bool:
        return rows * row_bytes(video) + one_forward_bytes(video) <= usable

    def largest_video(rows: int) -> int:
        """Most video tokens per row with `rows` rows (-1 when not even zero fit)."""
        # row(V) >= V * per_video_token, so fits(rows, high) is False.
        per_video_token = s.kv_copies * dims.kv_bytes_per_token + dims.feature_bytes_per_video_token
        low, high = -1, max(0, usable) // per_video_token + 1
        while high - low > 1:
            middle = (low + high) // 2
            if fits(rows, middle):
                low = middle
            else:
                high = middle
        return low

    planned = s.planned_video_tokens
    spare_for_rows = usable - one_forward_bytes(planned)
    rows_fit = max(0, spare_for_rows) // row_bytes(planned)
    if rows_fit >= 1:
        max_running = min(s.max_running, rows_fit)
        # The planned size fits max_running times; a larger one is allowed only when the configured
        # ceiling of such rows fits too, which keeps both limits safe together and monotonic in memory.
        max_video = max(planned, largest_video(s.max_running))
        running_note = f"{rows_fit} requests of {planned:,} video tokens fit" + (
            f", capped at the configured {s.max_running}" if rows_fit > s.max_running else ""
        )
    else:
        max_running = 1
        max_video = max(0, largest_video(1))
        running_note = (
            f"not even one request of {planned:,} video tokens fits: one request at a time, "
            f"with at most {max_video:,} video tokens"
        )
    heard = f"{audio:,} audio, " if audio else ""
    audio_forward = f"audio {dims.audio_bytes(audio) / GIB:.2f} GiB, " if audio else ""
    vit_forward = dims.vit_bytes(max(s.vit_patch_budget, planned * dims.merge_patches))
    prefill_forward = dims.prefill_bytes(planned + audio + s.text_tokens + s.new_tokens)
    reasons = (
        f"free {free_bytes / GIB:.1f} GiB, less a {s.margin_fraction:.0%} margin and {s.reserved_bytes / GIB:.1f} "
        f"GiB for the feature and prefix caches: {usable_for_sessions / GIB:.1f} GiB usable",
        *_cache_reasons(dims, s.kv_copies),
        f"one request of {planned:,} video tokens (+{heard}{s.text_tokens} text, {s.new_tokens} new, {s.spare_tokens} "
        f"spare): {row_bytes(planned) / GIB:.2f} GiB of {'state, ' if dims.linear else ''}KV and features",
        f"one forward at a time: ViT {vit_forward / GIB:.2f} GiB, "
        f"{audio_forward}prefill {prefill_forward / GIB:.2f} GiB",
        f"live sessions: {max_live} of the {s.live_sessions} configured, {live_row / GIB:.2f} GiB each (a window "
        f"of {s.live_window_tokens:,} tokens, {s.text_tokens} text, {s.spare_tokens} spare"
        f"{', and the recurrent state' if dims.linear else ''}): {live_bytes / GIB:.2f} GiB",
        running_note,
    )
    return Plan(
        free_bytes=free_bytes,
        kv_bytes_per_token=dims.kv_bytes_per_token,
        state_bytes_per_sequence=dims.state_bytes_per_sequence,
        cache_summary=dims.cache_summary(),
        max_video_tokens=max_video,
        max_request_tokens=max_video + audio + s.text_tokens + s.new_tokens,
        max_running=max_running,
        reasons=reasons,
        max_live_sessions=max_live,
    )


def _cache_reasons(dims: ModelDims, kv_copies: int) -> tuple[str, ...]:
    """The reasons lines of what a request keeps: its KV, and on a hybrid model its linear-attention state."""
    copies = f"x{kv_copies} while the decode batch is rebuilt"
    layers = f"{dims.kv_layers} of {dims.text_layers} layers" if dims.linear else f"{dims.kv_layers} layers"
    kv = (
        f"KV cache: {dims.kv_bytes_per_token} bytes per token (2 x {layers} x {dims.kv_heads} KV heads x "
        f"{dims.head_dim} x {dims.dtype_bytes} bytes), {copies}"
    )
    if not dims.linear:
        return (kv,)
    linear = dims.linear
    state = (
        f"linear-attention state: {dims.state_bytes_per_sequence / MIB:.1f} MiB per sequence ({linear.layers} "
        f"layers x (conv {linear.conv_dim} x {linear.conv_kernel} x {dims.dtype_bytes} bytes + recurrent "
        f"{linear.value_heads} x {linear.key_head_dim} x {linear.value_head_dim} x {FLOAT32_BYTES} bytes)), "
        f"{copies}; the prefix cache's snapshots of it count inside its bound"
    )
    return (state, kv)


def measured_free_bytes(device) -> int:
    """Device memory this process can still allocate: what the driver reports free plus what torch's
    caching allocator holds but does not use (loading leaves some behind)."""
    import torch

    free, _total = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def engine_settings(
    config, planned_video_tokens: int, vit_patch_budget: int, planned_audio_tokens: int = 0
) -> PlanSettings:
    """The settings an engine under `config` (EngineConfig) plans with."""
    from engine.state.lm_state import GrowingLayer

    return PlanSettings(
        planned_video_tokens=planned_video_tokens,
        planned_audio_tokens=planned_audio_tokens,
        max_running=config.max_running,
        spare_tokens=GrowingLayer.SPARE_TOKENS,
        vit_patch_budget=vit_patch_budget,
        reserved_bytes=config.feature_cache_bytes + config.prefix_cache_bytes,
        live_sessions=config.max_live_sessions,
        live_window_tokens=config.live_window_tokens or planned_video_tokens,
    )


def engine_plan(
    loaded, config, planned_video_tokens: int, vit_patch_budget: int, planned_audio_tokens: int = 0
) -> Plan:
    """The plan for a freshly loaded model under `config` (EngineConfig); see the module docstring.
    planned_audio_tokens: the longest soundtrack's, on a model that hears."""
    dims = ModelDims.from_config(loaded.model.config, dtype_bytes=loaded.dtype.itemsize)
    free_bytes = config.memory_budget_bytes
    if free_bytes is None:
        if loaded.device.type != "cuda":
            return unbounded_plan(
                dims,
                config.max_running,
                f"{loaded.device.type}: requests are not bounded by memory",
                config.max_live_sessions,
            )
        free_bytes = measured_free_bytes(loaded.device)
    return plan_memory(
        dims, free_bytes, engine_settings(config, planned_video_tokens, vit_patch_budget, planned_audio_tokens)
    )


def checkpoint_config(model: str):
    """The config of `model`, read without building anything: random:<checkpoint> from its stored spec
    (engine/checkpoints/random_weights.py), anything else through AutoConfig, offline: a local folder, or a Hub id
    already in the local cache. Raises UnknownCheckpoint, OSError or ValueError when there is none."""
    from transformers import AutoConfig

    from engine.checkpoints.random_weights import checkpoint_spec, is_random, spec_config

    if is_random(model):
        return spec_config(checkpoint_spec(model))
    return AutoConfig.from_pretrained(model, local_files_only=True)


def checkpoint_plan(config, free_bytes: int, engine_config=None) -> Plan:
    """The plan a GPU engine would make for the model of `config` (a *ForConditionalGeneration config) with
    `free_bytes` free after loading: bfloat16, the GPU's default sampling (engine/config.py GPU_FRAME_SAMPLING) as
    the planned video, the GPU's ViT patch budget, and `engine_config`'s (EngineConfig, default: the
    defaults) max_running, cache bounds and longest soundtrack, as engine_plan. Nothing is built or measured."""
    import torch

    from engine.config import GPU_FRAME_SAMPLING, EngineConfig, video_tokens, vit_patch_budget

    engine_config = engine_config or EngineConfig()
    dims = ModelDims.from_config(config, dtype_bytes=torch.bfloat16.itemsize)
    sampling = GPU_FRAME_SAMPLING
    planned = video_tokens(sampling.max_frames, sampling.max_pixels_per_frame, *video_geometry(config))
    audio = checkpoint_audio_tokens(config, engine_config.max_soundtrack_seconds) if dims.audio else 0
    settings = engine_settings(engine_config, planned, vit_patch_budget(engine_config, "cuda"), audio)
    return plan_memory(dims, free_bytes, settings)


def checkpoint_audio_tokens(config, seconds: float) -> int:
    """Audio tokens of `seconds` of soundtrack for a config's audio tower, with the feature extractor's default
    rate and mel frames (ParakeetFeatureExtractor: 16,000 Hz, a frame every 160 samples), which the released
    Nemotron-H Omni keeps: its preprocessor config sets the mel bins and the default rate alone. The processor
    is not part of a config; an engine counts with its own (audio_inputs.audio_token_count)."""
    from transformers import ParakeetFeatureExtractor

    extractor = ParakeetFeatureExtractor()
    samples = int(seconds * extractor.sampling_rate)
    return audio_tokens(samples, extractor.hop_length, config.audio_config.subsampling_factor)
