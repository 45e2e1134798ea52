"""The memory plan: how many video tokens one request may have and how many requests may decode together,
so that what the engine keeps on the GPU fits in the memory left after loading, with a margin.

    dims = ModelDims.from_config(model.config, dtype_bytes=2)
    plan = plan_memory(dims, free_bytes=130 * GIB, settings=PlanSettings(planned_video_tokens=12_544))
    plan.max_video_tokens, plan.max_running, plan.kv_bytes_per_token

`plan_memory` is arithmetic on plain numbers, so tests feed it made-up free-memory figures; `engine_plan`
measures the device after loading and is what the Engine calls.

What the plan counts (bytes; N requests decoding together, each with at most V video tokens):

    usable   = free * (1 - margin) - reserved                       reserved: feature + prefix cache bounds
    row(V)   = kv_copies * kv_per_token * (V + text + new + spare)  one request's KV cache
             + feature_per_video_token * V                          its video features (full + EVS-kept)
    one(V)   = max(ViT forward over max(vit_patches, V * merge^2) patches, prefill of V + text + new tokens)
    N * row(V) + one(V) <= usable

- kv_per_token = 2 (K and V) * layers * KV heads * head_dim * dtype bytes (147,456 on Qwen3-VL-4B in bf16).
- kv_copies = 3: a request joining or leaving rebuilds the padded decode batch, and for a moment the old
  batch, the concatenated tensors and the growable buffers they are copied into are all alive
  (engine/batch_kv.py DecodeBatch.add / remove through cache_from_tensors).
- Every row is planned at the worst case, q = 0 (nothing pruned; compare mode always sends a q = 0
  request), and left padding makes every row of the batch as long as the longest.
- The ViT and the prefill never run at the same time and free their activations layer by layer
  (inference mode), so only the larger of the two counts, at one layer's worth: the vision tower's depth
  does not enter. A request over the ViT patch budget is encoded alone, hence max(vit_patches, V * merge^2).
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

from .errors import InputError

GIB = 1024**3
# Bytes of one float32 number: the processor's pixel_values reach the device as float32.
FLOAT32_BYTES = 4


@dataclass(frozen=True)
class ModelDims:
    """The sizes of a loaded model that decide its memory per token.

    text_layers, kv_heads, head_dim: the language model's KV cache shape. text_hidden, text_intermediate:
    its residual and MLP widths (prefill activations). vision_hidden, vision_intermediate: the ViT's widths;
    patch_values: numbers in one patch row of pixel_values (channels * temporal_patch * patch^2);
    merge_patches: patches per LLM token (spatial_merge^2). feature_levels: feature tensors per video token
    (the merger output, plus one per DeepStack level on Qwen3-VL), each feature_dim wide. dtype_bytes: of the
    model's weights, KV cache and activations.
    """

    text_layers: int
    kv_heads: int
    head_dim: int
    text_hidden: int
    text_intermediate: int
    vision_hidden: int
    vision_intermediate: int
    patch_values: int
    merge_patches: int
    feature_levels: int
    feature_dim: int
    dtype_bytes: int

    @classmethod
    def from_config(cls, config, dtype_bytes: int) -> "ModelDims":
        """From a Qwen3-VL or Qwen2.5-VL *ForConditionalGeneration config."""
        text, vision = config.text_config, config.vision_config
        # Qwen2.5-VL's text config has no head_dim: it is hidden / heads there.
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        channels = getattr(vision, "in_channels", None) or getattr(vision, "in_chans", 3)
        deepstack = getattr(vision, "deepstack_visual_indexes", None) or []
        return cls(
            text_layers=text.num_hidden_layers,
            kv_heads=text.num_key_value_heads,
            head_dim=head_dim,
            text_hidden=text.hidden_size,
            text_intermediate=text.intermediate_size,
            vision_hidden=vision.hidden_size,
            vision_intermediate=vision.intermediate_size,
            patch_values=channels * vision.temporal_patch_size * vision.patch_size**2,
            merge_patches=vision.spatial_merge_size**2,
            feature_levels=1 + len(deepstack),
            feature_dim=vision.out_hidden_size,
            dtype_bytes=dtype_bytes,
        )

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token."""
        return 2 * self.text_layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def feature_bytes_per_video_token(self) -> int:
        """A running request holds its video's features and the EVS-kept copy of them (all of them at q = 0)."""
        return 2 * self.feature_levels * self.feature_dim * self.dtype_bytes

    def vit_bytes(self, patches: int) -> int:
        """Peak activations of one ViT forward over `patches` patch rows: the float32 pixels and their cast,
        one layer's residual, norm, attention and MLP tensors (4 * hidden + 2 * MLP wide), and the merged
        output of every feature level, which lives until the forward ends."""
        per_patch = (FLOAT32_BYTES * self.patch_values
                     + self.dtype_bytes * (self.patch_values + 4 * self.vision_hidden + 2 * self.vision_intermediate))
        outputs = self.dtype_bytes * self.feature_levels * self.feature_dim * (patches // self.merge_patches)
        return patches * per_patch + outputs

    def prefill_bytes(self, tokens: int) -> int:
        """Peak activations of one prefill over `tokens` tokens at one layer: input embeddings, residual,
        norm output and attention output (4 * hidden), and the gated MLP's gate, up and product (3 * MLP).
        Attention itself is O(tokens) (flash / memory-efficient kernels: no mask on a single-row prefill),
        and only the last position's logits are computed."""
        return tokens * self.dtype_bytes * (4 * self.text_hidden + 3 * self.text_intermediate)


@dataclass(frozen=True)
class PlanSettings:
    """What the plan sizes for, beside the model and the free memory.

    planned_video_tokens: the video tokens of a typical large request (the device's default sampling on
    this model); max_running rows of it must fit. max_running: the configured ceiling. text_tokens: prompt
    tokens other than video pads planned per request: system prompt, question (at most 4,000 characters),
    Qwen3-VL's per-group timestamp and markers (a handful of tokens a group, some 600 at 64 groups) and a
    few turns of history. new_tokens: answer tokens planned per request, the UI's slider maximum; an API
    request may ask for up to the engine's 4,096 when the rest of its row leaves room (Plan.check_request
    counts the whole row). spare_tokens: KV slots a growing cache allocates ahead (engine/batch_kv.py
    GrowingLayer.SPARE_TOKENS). vit_patches: the ViT forward budget in patches. reserved_bytes: device
    memory held by the feature and prefix caches at their bounds. margin_fraction: of the free memory,
    kept back. kv_copies: of the decode batch's KV alive while it is rebuilt (module docstring).
    """

    planned_video_tokens: int
    max_running: int = 16
    text_tokens: int = 4096
    new_tokens: int = 1024
    spare_tokens: int = 256
    vit_patches: int = 65536
    reserved_bytes: int = 2 * GIB
    margin_fraction: float = 0.10
    kv_copies: int = 3


class InsufficientMemory(RuntimeError):
    """The GPU has too little free memory after loading to serve even a small request."""


@dataclass(frozen=True)
class Plan:
    """The limits one engine serves under.

    free_bytes: device memory the plan divided (None: no plan). max_video_tokens: most video tokens (T*h*w,
    before EVS) in one request; max_request_tokens: most prompt + answer tokens of one request (the KV row
    it may fill); None when unbounded. max_running: requests decoding together. reasons: one line per term
    of the arithmetic, for logs and tests.
    """

    free_bytes: int | None
    kv_bytes_per_token: int
    max_video_tokens: int | None
    max_request_tokens: int | None
    max_running: int
    reasons: tuple[str, ...]

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
                f"{smallest_video_tokens:,} of a small clip: use a GPU with more memory or a smaller checkpoint.")

    def summary(self) -> str:
        """One line for the start-up log."""
        if not self.bounded:
            return (f"memory plan: none ({self.reasons[0]}); KV {self.kv_bytes_per_token} bytes/token, "
                    f"{self._running()} decoding together")
        return (f"memory plan: {self.free_bytes / GIB:.1f} GiB free, KV {self.kv_bytes_per_token} bytes/token, "
                f"at most {self.max_video_tokens:,} video tokens per request, {self._running()} decoding together")

    def _running(self) -> str:
        return f"{self.max_running} request{'s' if self.max_running != 1 else ''}"

    def check_request(self, video_tokens: int, prompt_tokens: int, max_new_tokens: int) -> None:
        """Raise InputError, one sentence saying what to lower, for a request the plan has no room for.

        video_tokens: T*h*w of its video; prompt_tokens: its whole unpruned prompt (video included)."""
        if not self.bounded:
            return
        if video_tokens > self.max_video_tokens:
            raise InputError(
                f"This video comes to {video_tokens:,} video tokens, more than the {self.max_video_tokens:,} this "
                "server's GPU memory allows per request: choose fewer frames or fewer pixels per frame.")
        needed = prompt_tokens + max_new_tokens
        if needed > self.max_request_tokens:
            raise InputError(
                f"This request needs {needed:,} tokens of prompt and answer, more than the "
                f"{self.max_request_tokens:,} this server's GPU memory allows per request: ask for fewer new "
                "tokens, start a new conversation, or choose fewer frames or fewer pixels per frame.")


def unbounded_plan(dims: ModelDims, max_running: int, why: str) -> Plan:
    return Plan(None, dims.kv_bytes_per_token, None, None, max_running, (why,))


def plan_memory(dims: ModelDims, free_bytes: int, settings: PlanSettings) -> Plan:
    """The limits under which N * row(V) + one(V) <= free * (1 - margin) - reserved (module docstring)."""
    s = settings
    usable = int(free_bytes * (1 - s.margin_fraction)) - s.reserved_bytes
    other_tokens = s.text_tokens + s.new_tokens + s.spare_tokens

    def row_bytes(video: int) -> int:
        return (s.kv_copies * dims.kv_bytes_per_token * (video + other_tokens)
                + dims.feature_bytes_per_video_token * video)

    def one_forward_bytes(video: int) -> int:
        return max(dims.vit_bytes(max(s.vit_patches, video * dims.merge_patches)),
                   dims.prefill_bytes(video + s.text_tokens + s.new_tokens))

    def fits(rows: int, video: int) -> bool:
        return rows * row_bytes(video) + one_forward_bytes(video) <= usable

    def largest_video(rows: int) -> int:
        """Most video tokens per row with `rows` rows (-1 when not even zero fit)."""
        low, high = -1, max(0, usable) // dims.kv_bytes_per_token + 1  # fits(rows, high) is False
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
        running_note = (f"{rows_fit} requests of {planned:,} video tokens fit"
                        + (f", capped at the configured {s.max_running}" if rows_fit > s.max_running else ""))
    else:
        max_running = 1
        max_video = max(0, largest_video(1))
        running_note = (f"not even one request of {planned:,} video tokens fits: one request at a time, "
                        f"with at most {max_video:,} video tokens")
    reasons = (
        f"free {free_bytes / GIB:.1f} GiB, less a {s.margin_fraction:.0%} margin and {s.reserved_bytes / GIB:.1f} "
        f"GiB for the feature and prefix caches: {usable / GIB:.1f} GiB usable",
        f"KV cache: {dims.kv_bytes_per_token} bytes per token (2 x {dims.text_layers} layers x {dims.kv_heads} "
        f"KV heads x {dims.head_dim} x {dims.dtype_bytes} bytes), x{s.kv_copies} while the decode batch is rebuilt",
        f"one request of {planned:,} video tokens (+{s.text_tokens} text, {s.new_tokens} new, {s.spare_tokens} "
        f"spare): {row_bytes(planned) / GIB:.2f} GiB of KV and features",
        f"one forward at a time: ViT {dims.vit_bytes(max(s.vit_patches, planned * dims.merge_patches)) / GIB:.2f} "
        f"GiB, prefill {dims.prefill_bytes(planned + s.text_tokens + s.new_tokens) / GIB:.2f} GiB",
        running_note,
    )
    return Plan(
        free_bytes=free_bytes,
        kv_bytes_per_token=dims.kv_bytes_per_token,
        max_video_tokens=max_video,
        max_request_tokens=max_video + s.text_tokens + s.new_tokens,
        max_running=max_running,
        reasons=reasons,
    )


def measured_free_bytes(device) -> int:
    """Device memory this process can still allocate: what the driver reports free plus what torch's
    caching allocator holds but does not use (loading leaves some behind)."""
    import torch

    free, _total = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def engine_plan(loaded, config, planned_video_tokens: int, vit_patches: int) -> Plan:
    """The plan for a freshly loaded model under `config` (EngineConfig); see the module docstring."""
    from .batch_kv import GrowingLayer

    dims = ModelDims.from_config(loaded.model.config, dtype_bytes=loaded.dtype.itemsize)
    free_bytes = config.memory_budget_bytes
    if free_bytes is None:
        if loaded.device.type != "cuda":
            return unbounded_plan(dims, config.max_running, f"{loaded.device.type}: requests are not bounded by memory")
        free_bytes = measured_free_bytes(loaded.device)
    settings = PlanSettings(
        planned_video_tokens=planned_video_tokens,
        max_running=config.max_running,
        spare_tokens=GrowingLayer.SPARE_TOKENS,
        vit_patches=vit_patches,
        reserved_bytes=config.feature_cache_bytes + config.prefix_cache_bytes,
    )
    return plan_memory(dims, free_bytes, settings)
