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
    N * row(V) + one(V) <= usable

- kv_per_token = 2 (K and V) * KV layers * KV heads * head_dim * dtype bytes (147,456 on Qwen3-VL-4B in
  bf16). KV layers are the attention layers: all of them on Qwen2.5-VL and Qwen3-VL (MoE too); on the
  hybrid Qwen3.5 / 3.6 only the full-attention ones (text_config.layer_types; every 4th), 32,768 bytes a
  token on Qwen3.5-9B.
- state_per_sequence: a hybrid model's linear-attention layers (Gated DeltaNet, Mamba-2) keep, whatever the
  length, a conv state (conv_dim x conv kernel, model dtype) and a recurrent state (value heads x key head_dim
  x value head_dim, float32), as transformers' LinearAttentionLayer holds them: 49.5 MiB a sequence on
  Qwen3.5-9B (24 layers x (8,192 x 4 x 2 + 32 x 128 x 128 x 4 bytes)). 0 on KV-only models. Mamba-2 has the
  same two tensors (LinearAttentionDims.from_text_config maps its sizes onto these names).
- kv_copies = 3: a request joining or leaving rebuilds the decode batch (engine/decode_batch.py DecodeBatch.add
  / remove through lm_state.batch_cache): for a moment the old batch with the joining row's own cache (one
  copy of every row) and the new batch's buffers (a second) are alive together; the third is slack for the
  caching allocator, which cannot hand the old batch's blocks to a batch one row larger. The recurrent
  states are rebuilt the same way, so they count three times too.
- The prefix cache keeps a hybrid model's state snapshots (at the end of [system + video] and where the
  last answer began) beside the KV it stores; they count inside its byte bound (engine/prefix_cache.py), which
  is part of reserved.
- Every row is planned at the worst case, q = 0 (nothing pruned; compare mode always sends a q = 0
  request), and left padding makes every row of the batch as long as the longest.
- The ViT, the audio tower and the prefill never run at the same time and free their activations layer by
  layer (inference mode), so only the largest of the three counts, at one layer's worth: the towers' depth
  does not enter. A request over the ViT patch budget is encoded alone, hence max(vit_patch_budget, V * merge^2).
  The audio tower's attention is quadratic in the soundtrack's length (AudioDims.forward_bytes); it takes one
  soundtrack per forward (engine/vision.py), so one soundtrack's forward counts.
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

from .audio_inputs import audio_tokens
from .errors import InputError
from .families import video_geometry

GIB = 1024**3
MIB = 1024**2
# Bytes of one float32 number: the processor's pixel_values reach the device as float32, and a linear-attention
# layer keeps its recurrent state and runs its chunked delta rule in float32.
FLOAT32_BYTES = 4
# Tokens per chunk of transformers' chunked gated delta rule (torch_chunk_gated_delta_rule's chunk_size).
DELTA_RULE_CHUNK = 64
LINEAR_ATTENTION = "linear_attention"
# Layer types that mix nothing along the sequence and so keep neither KV nor state (Nemotron-H's).
STATELESS_LAYERS = ("moe", "mlp")


@dataclass(frozen=True)
class LinearAttentionDims:
    """The linear-attention layers of a hybrid model: Gated DeltaNet (Qwen3.5 / 3.6; transformers'
    Qwen3_5GatedDeltaNet) or Mamba-2 (Nemotron-H; NemotronHMamba2Mixer).

    layers: how many; key_heads, value_heads, key_head_dim, value_head_dim: linear_num_key_heads ... of a
    Qwen3.5 text config; conv_kernel: linear_conv_kernel_dim. chunk: tokens per chunk of the chunked scan;
    float32_keys, float32_values: key- and value-sized float32 tensors alive at the scan's peak
    (prefill_bytes_per_token).
    """

    layers: int
    key_heads: int
    value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    chunk: int = DELTA_RULE_CHUNK
    float32_keys: int = 6
    float32_values: int = 4

    @classmethod
    def from_text_config(cls, text, layers: int) -> "LinearAttentionDims":
        """Gated DeltaNet's sizes, or Mamba-2's mapped onto the same names: its B and C (n_groups x
        ssm_state_size each) are the keys, its x (mamba heads x mamba head_dim) the values, so conv_dim
        (x, B, C) and the recurrent state (heads x head_dim x ssm_state, float32) come out as transformers
        keeps them. Mamba-2's chunked scan (mamba2_chunk_scan, torch) holds in float32 the B and C repeated to
        every head (2 key-sized), x scaled by dt, the intra- and inter-chunk outputs, their sum, the output and
        the D residual (6 value-sized), and the decay, score and masked score matrices (3 chunk-wide)."""
        if hasattr(text, "linear_num_key_heads"):
            return cls(layers=layers, key_heads=text.linear_num_key_heads, value_heads=text.linear_num_value_heads,
                       key_head_dim=text.linear_key_head_dim, value_head_dim=text.linear_value_head_dim,
                       conv_kernel=text.linear_conv_kernel_dim)
        return cls(layers=layers, key_heads=text.n_groups, value_heads=text.mamba_num_heads,
                   key_head_dim=text.ssm_state_size, value_head_dim=text.mamba_head_dim,
                   conv_kernel=text.conv_kernel, chunk=text.chunk_size, float32_keys=2, float32_values=6)

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: query, key and value projections together (2 * key_dim + value_dim)."""
        return 2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim

    def conv_state_bytes(self, dtype_bytes: int) -> int:
        """One layer's conv state for one sequence: (conv_dim, conv_kernel) in the model dtype."""
        return self.conv_dim * self.conv_kernel * dtype_bytes

    @property
    def recurrent_state_bytes(self) -> int:
        """One layer's recurrent state for one sequence: (value_heads, key_head_dim, value_head_dim) float32,
        whatever the model dtype (the delta rule computes it in float32 and the cache keeps it so)."""
        return self.value_heads * self.key_head_dim * self.value_head_dim * FLOAT32_BYTES

    def state_bytes(self, dtype_bytes: int) -> int:
        """Every linear layer's conv and recurrent state for one sequence."""
        return self.layers * (self.conv_state_bytes(dtype_bytes) + self.recurrent_state_bytes)

    def prefill_bytes_per_token(self, hidden: int, dtype_bytes: int) -> int:
        """Peak activations of one linear-attention layer's prefill, per token. In the model dtype: the input,
        residual, norm and output (4 * hidden), the conv output (conv_dim) and the output gate z (value_dim).
        In float32, inside transformers' chunked delta rule (torch_chunk_gated_delta_rule), where query and
        key are repeated to every value head: six key-sized tensors (value_heads x key_head_dim: query, key,
        the beta-weighted and the decayed keys, the solved decayed keys, and query or key re-decayed), four
        value-sized ones (value, beta-weighted value, new values, output) and three chunk x chunk matrices
        per value head (pairwise decay, UT system, intra-chunk attention). One Qwen3.5-9B linear-attention
        layer measured on CPU (bf16, torch.profiler's memory timeline, 256 to 1,024 tokens): 227 KB a
        token, against the 246 KB counted here. Mamba-2 counts its own tensors the same way (from_text_config;
        not measured)."""
        keys = self.value_heads * self.key_head_dim
        values = self.value_heads * self.value_head_dim
        chunk_matrices = self.value_heads * self.chunk
        float32 = FLOAT32_BYTES * (self.float32_keys * keys + self.float32_values * values + 3 * chunk_matrices)
        return float32 + dtype_bytes * (4 * hidden + self.conv_dim + values)


@dataclass(frozen=True)
class AudioDims:
    """The audio tower of a model that hears (Nemotron-H Omni's Parakeet encoder, the config's audio_config):
    hidden, heads, intermediate: the widths of its conformer layers; mel_bins, conv_channels,
    subsampling_factor: its convolutional subsampling, which turns subsampling_factor mel frames into one
    audio token."""

    hidden: int
    heads: int
    intermediate: int
    mel_bins: int
    conv_channels: int
    subsampling_factor: int

    @classmethod
    def from_config(cls, audio) -> "AudioDims":
        return cls(hidden=audio.hidden_size, heads=audio.num_attention_heads, intermediate=audio.intermediate_size,
                   mel_bins=audio.num_mel_bins, conv_channels=audio.subsampling_conv_channels,
                   subsampling_factor=audio.subsampling_factor)

    def forward_bytes(self, tokens: int, dtype_bytes: int) -> int:
        """Peak activations of the audio tower over a soundtrack of `tokens` audio tokens (tokens *
        subsampling_factor mel frames): the mel features in float32 and their cast, alive throughout, and the
        larger of
        - the subsampling's first convolution, conv_channels x frames / 2 x mel_bins / 2, and its ReLU's copy;
        - one conformer layer: its relative-position attention scores, heads x tokens x 2 tokens, three of them
          alive at once (the product, its shifted copy, the scaled and masked bias sdpa takes: transformers'
          ParakeetEncoderAttention), beside the layer's own tensors (residual, norms, attention output and the
          feed-forward: 4 * hidden + 2 * intermediate a token) and the relative position embeddings with their
          projection (2 * hidden at each of 2 * tokens positions).
        Quadratic in the soundtrack's length: 10 minutes on Nemotron-H Omni (7,501 tokens, 8 heads, bf16) hold
        5.4 GB of scores. Not measured on a GPU."""
        frames = tokens * self.subsampling_factor
        features = frames * self.mel_bins * (FLOAT32_BYTES + dtype_bytes)
        subsampling = 2 * self.conv_channels * (frames // 2) * (self.mel_bins // 2) * dtype_bytes
        scores = 3 * self.heads * tokens * 2 * tokens * dtype_bytes
        layer = scores + dtype_bytes * (tokens * (4 * self.hidden + 2 * self.intermediate) + 2 * tokens * 2 * self.hidden)
        return features + max(subsampling, layer)


@dataclass(frozen=True)
class ModelDims:
    """The sizes of a loaded model that decide its memory per token and per sequence.

    text_layers: the language model's layers; kv_layers: those that keep K and V (the attention layers: all
    of them but a hybrid model's linear-attention ones), each kv_heads x head_dim wide. linear: the
    linear-attention layers of a hybrid model (None on KV-only ones), whose state is constant per sequence.
    text_hidden, text_intermediate: the residual width and the MLP width a token passes through (prefill
    activations): a dense model's intermediate_size; on a mixture of experts the routed experts' width times
    experts_per_token, plus the shared expert's (experts_per_token is 0 on a dense model).
    vision_hidden, vision_intermediate: the ViT's widths; patch_values: numbers in one patch row of
    pixel_values (channels * temporal_patch * patch^2); merge_patches: patches per LLM token
    (spatial_merge^2). feature_levels: feature tensors per video token (the merger output, plus one per
    DeepStack level on Qwen3-VL), each feature_dim wide. dtype_bytes: of the model's weights, KV cache,
    conv state and activations. audio: the audio tower of a model that hears (None on the others), whose
    features reach the language model at its width, text_hidden.
    """

    text_layers: int
    kv_layers: int
    kv_heads: int
    head_dim: int
    text_hidden: int
    text_intermediate: int
    experts_per_token: int
    vision_hidden: int
    vision_intermediate: int
    patch_values: int
    merge_patches: int
    feature_levels: int
    feature_dim: int
    dtype_bytes: int
    linear: LinearAttentionDims | None = None
    audio: AudioDims | None = None

    @classmethod
    def from_config(cls, config, dtype_bytes: int) -> "ModelDims":
        """From a Qwen2.5-VL, Qwen3-VL (dense or MoE), Qwen3.5 / 3.6 (dense or MoE) *ForConditionalGeneration
        config or a Nemotron-H Omni config."""
        text, vision = config.text_config, config.vision_config
        # Qwen2.5-VL's text config has no head_dim: it is hidden / heads there.
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        channels = getattr(vision, "in_channels", None) or getattr(vision, "in_chans", None) or getattr(
            vision, "num_channels", 3)
        deepstack = getattr(vision, "deepstack_visual_indexes", None) or []
        layer_types = getattr(text, "layer_types", None) or []
        linear_layers = sum(kind == LINEAR_ATTENTION for kind in layer_types)
        stateless_layers = sum(kind in STATELESS_LAYERS for kind in layer_types)
        linear = LinearAttentionDims.from_text_config(text, linear_layers) if linear_layers else None
        text_intermediate, experts_per_token = _mlp_width(text)
        patch, merge, temporal = video_geometry(config)
        # RADIO (Nemotron-H Omni) gives its MLP as a ratio, and its features reach the language model through a
        # projector to the text width.
        vision_intermediate = getattr(vision, "intermediate_size", None) or int(vision.hidden_size * vision.mlp_ratio)
        return cls(
            text_layers=text.num_hidden_layers,
            kv_layers=text.num_hidden_layers - linear_layers - stateless_layers,
            kv_heads=text.num_key_value_heads,
            head_dim=head_dim,
            text_hidden=text.hidden_size,
            text_intermediate=text_intermediate,
            experts_per_token=experts_per_token,
            vision_hidden=vision.hidden_size,
            vision_intermediate=vision_intermediate,
            patch_values=channels * temporal * patch**2,
            merge_patches=merge**2,
            feature_levels=1 + len(deepstack),
            feature_dim=getattr(vision, "out_hidden_size", None) or text.hidden_size,
            dtype_bytes=dtype_bytes,
            linear=linear,
            audio=AudioDims.from_config(config.audio_config) if getattr(config, "audio_config", None) else None,
        )

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every KV layer for one token."""
        return 2 * self.kv_layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def state_bytes_per_sequence(self) -> int:
        """The linear-attention layers' conv and recurrent state of one sequence, whatever its length (0 on a
        KV-only model)."""
        return self.linear.state_bytes(self.dtype_bytes) if self.linear else 0

    @property
    def feature_bytes_per_video_token(self) -> int:
        """A running request holds its video's features and the EVS-kept copy of them (all of them at q = 0)."""
        return 2 * self.feature_levels * self.feature_dim * self.dtype_bytes

    @property
    def feature_bytes_per_audio_token(self) -> int:
        """A running request holds its soundtrack's features once: EVS keeps every row, without a copy."""
        return self.text_hidden * self.dtype_bytes

    def audio_bytes(self, tokens: int) -> int:
        """Peak activations of the audio tower over `tokens` audio tokens (0 for a model that does not hear)."""
        return self.audio.forward_bytes(tokens, self.dtype_bytes) if self.audio and tokens else 0

    def cache_summary(self) -> str:
        """What one request keeps, in a few words: "KV 147456 bytes/token", or on a hybrid model
        "state 49.5 MiB/sequence + KV 32768 bytes/token (8 of 32 layers)"."""
        kv = f"KV {self.kv_bytes_per_token} bytes/token"
        if not self.linear:
            return kv
        return (f"state {self.state_bytes_per_sequence / MIB:.1f} MiB/sequence + {kv} "
                f"({self.kv_layers} of {self.text_layers} layers)")

    def vit_bytes(self, patches: int) -> int:
        """Peak activations of one ViT forward over `patches` patch rows: the float32 pixels and their cast,
        one layer's residual, norm, attention and MLP tensors (4 * hidden + 2 * MLP wide), and the merged
        output of every feature level, which lives until the forward ends."""
        per_patch = (FLOAT32_BYTES * self.patch_values
                     + self.dtype_bytes * (self.patch_values + 4 * self.vision_hidden + 2 * self.vision_intermediate))
        outputs = self.dtype_bytes * self.feature_levels * self.feature_dim * (patches // self.merge_patches)
        return patches * per_patch + outputs

    def prefill_bytes(self, tokens: int) -> int:
        """Peak activations of one prefill over `tokens` tokens at one layer (the worst kind of layer):
        - an attention layer and its MLP: input embeddings, residual, norm output and attention output
          (4 * hidden), and the gated MLP's gate, up and product (3 * MLP). On a mixture of experts, the
          grouped experts kernel also holds each token's hidden state once per chosen expert as its input,
          output, weighted and reordered copy (4 * experts_per_token * hidden). Attention itself is
          O(tokens) (flash / memory-efficient kernels: no mask on a single-row prefill), and only the last
          position's logits are computed (one Qwen3.5-9B full-attention layer and its MLP, measured like
          the linear one: 103 KB a token, against the 106 KB counted here);
        - a linear-attention layer: LinearAttentionDims.prefill_bytes_per_token, more than twice as much
          on Qwen3.5, since its delta rule runs in float32 (transformers' torch implementation)."""
        per_token = self.dtype_bytes * (4 * self.text_hidden + 3 * self.text_intermediate
                                        + 4 * self.experts_per_token * self.text_hidden)
        if self.linear:
            per_token = max(per_token, self.linear.prefill_bytes_per_token(self.text_hidden, self.dtype_bytes))
        return tokens * per_token


def _mlp_width(text) -> tuple[int, int]:
    """(MLP width a token passes through, experts per token) of a text config: intermediate_size on a dense
    model; on a mixture of experts (moe_intermediate_size), num_experts_per_tok routed experts plus the
    shared expert if any (Qwen3.5 / 3.6 MoE), or the dense width where some layers stay dense (Qwen3-VL MoE's
    mlp_only_layers or decoder_sparse_step), whichever is wider."""
    routed = getattr(text, "moe_intermediate_size", None)
    if not routed or not (getattr(text, "num_experts", 0) or getattr(text, "n_routed_experts", 0)):
        return text.intermediate_size, 0
    experts = text.num_experts_per_tok
    shared = (getattr(text, "shared_expert_intermediate_size", None)  # Qwen3.5 / 3.6 MoE
              or getattr(text, "moe_shared_expert_intermediate_size", None) or 0)  # Nemotron-H
    width = experts * routed + shared
    some_dense = getattr(text, "mlp_only_layers", None) or (getattr(text, "decoder_sparse_step", None) or 1) > 1
    if some_dense:
        width = max(width, text.intermediate_size)
    return width, experts


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
    counts the whole row). spare_tokens: KV slots a growing cache allocates ahead (engine/lm_state.py
    GrowingLayer.SPARE_TOKENS). vit_patch_budget: the ViT forward budget in patches. reserved_bytes: device
    memory held by the feature and prefix caches at their bounds. margin_fraction: of the free memory,
    kept back. kv_copies: of the decode batch's KV and recurrent state alive while it is rebuilt (module
    docstring).
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
    logs and tests.
    """

    free_bytes: int | None
    kv_bytes_per_token: int
    state_bytes_per_sequence: int
    cache_summary: str
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
            return f"memory plan: none ({self.reasons[0]}); {self.cache_summary}, {self._running()} decoding together"
        return (f"memory plan: {self.free_bytes / GIB:.1f} GiB free, {self.cache_summary}, "
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
    return Plan(free_bytes=None, kv_bytes_per_token=dims.kv_bytes_per_token,
                state_bytes_per_sequence=dims.state_bytes_per_sequence, cache_summary=dims.cache_summary(),
                max_video_tokens=None, max_request_tokens=None, max_running=max_running, reasons=(why,))


def plan_memory(dims: ModelDims, free_bytes: int, settings: PlanSettings) -> Plan:
    """The limits under which N * row(V) + one(V) <= free * (1 - margin) - reserved (module docstring)."""
    s = settings
    usable = int(free_bytes * (1 - s.margin_fraction)) - s.reserved_bytes
    audio = s.planned_audio_tokens
    other_tokens = audio + s.text_tokens + s.new_tokens + s.spare_tokens

    def row_bytes(video: int) -> int:
        return (s.kv_copies * (dims.kv_bytes_per_token * (video + other_tokens) + dims.state_bytes_per_sequence)
                + dims.feature_bytes_per_video_token * video + dims.feature_bytes_per_audio_token * audio)

    def one_forward_bytes(video: int) -> int:
        return max(dims.vit_bytes(max(s.vit_patch_budget, video * dims.merge_patches)), dims.audio_bytes(audio),
                   dims.prefill_bytes(video + audio + s.text_tokens + s.new_tokens))

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
        running_note = (f"{rows_fit} requests of {planned:,} video tokens fit"
                        + (f", capped at the configured {s.max_running}" if rows_fit > s.max_running else ""))
    else:
        max_running = 1
        max_video = max(0, largest_video(1))
        running_note = (f"not even one request of {planned:,} video tokens fits: one request at a time, "
                        f"with at most {max_video:,} video tokens")
    heard = f"{audio:,} audio, " if audio else ""
    audio_forward = f"audio {dims.audio_bytes(audio) / GIB:.2f} GiB, " if audio else ""
    reasons = (
        f"free {free_bytes / GIB:.1f} GiB, less a {s.margin_fraction:.0%} margin and {s.reserved_bytes / GIB:.1f} "
        f"GiB for the feature and prefix caches: {usable / GIB:.1f} GiB usable",
        *_cache_reasons(dims, s.kv_copies),
        f"one request of {planned:,} video tokens (+{heard}{s.text_tokens} text, {s.new_tokens} new, {s.spare_tokens} "
        f"spare): {row_bytes(planned) / GIB:.2f} GiB of {'state, ' if dims.linear else ''}KV and features",
        f"one forward at a time: ViT {dims.vit_bytes(max(s.vit_patch_budget, planned * dims.merge_patches)) / GIB:.2f} "
        f"GiB, {audio_forward}prefill {dims.prefill_bytes(planned + audio + s.text_tokens + s.new_tokens) / GIB:.2f} GiB",
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
    )


def _cache_reasons(dims: ModelDims, kv_copies: int) -> tuple[str, ...]:
    """The reasons lines of what a request keeps: its KV, and on a hybrid model its linear-attention state."""
    copies = f"x{kv_copies} while the decode batch is rebuilt"
    layers = f"{dims.kv_layers} of {dims.text_layers} layers" if dims.linear else f"{dims.kv_layers} layers"
    kv = (f"KV cache: {dims.kv_bytes_per_token} bytes per token (2 x {layers} x {dims.kv_heads} KV heads x "
          f"{dims.head_dim} x {dims.dtype_bytes} bytes), {copies}")
    if not dims.linear:
        return (kv,)
    linear = dims.linear
    state = (f"linear-attention state: {dims.state_bytes_per_sequence / MIB:.1f} MiB per sequence ({linear.layers} "
             f"layers x (conv {linear.conv_dim} x {linear.conv_kernel} x {dims.dtype_bytes} bytes + recurrent "
             f"{linear.value_heads} x {linear.key_head_dim} x {linear.value_head_dim} x {FLOAT32_BYTES} bytes)), "
             f"{copies}; the prefix cache's snapshots of it count inside its bound")
    return (state, kv)


def measured_free_bytes(device) -> int:
    """Device memory this process can still allocate: what the driver reports free plus what torch's
    caching allocator holds but does not use (loading leaves some behind)."""
    import torch

    free, _total = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def engine_settings(config, planned_video_tokens: int, vit_patch_budget: int,
                    planned_audio_tokens: int = 0) -> PlanSettings:
    """The settings an engine under `config` (EngineConfig) plans with."""
    from .lm_state import GrowingLayer

    return PlanSettings(
        planned_video_tokens=planned_video_tokens,
        planned_audio_tokens=planned_audio_tokens,
        max_running=config.max_running,
        spare_tokens=GrowingLayer.SPARE_TOKENS,
        vit_patch_budget=vit_patch_budget,
        reserved_bytes=config.feature_cache_bytes + config.prefix_cache_bytes,
    )


def engine_plan(loaded, config, planned_video_tokens: int, vit_patch_budget: int,
                planned_audio_tokens: int = 0) -> Plan:
    """The plan for a freshly loaded model under `config` (EngineConfig); see the module docstring.
    planned_audio_tokens: the longest soundtrack's, on a model that hears."""
    dims = ModelDims.from_config(loaded.model.config, dtype_bytes=loaded.dtype.itemsize)
    free_bytes = config.memory_budget_bytes
    if free_bytes is None:
        if loaded.device.type != "cuda":
            return unbounded_plan(dims, config.max_running, f"{loaded.device.type}: requests are not bounded by memory")
        free_bytes = measured_free_bytes(loaded.device)
    return plan_memory(dims, free_bytes,
                       engine_settings(config, planned_video_tokens, vit_patch_budget, planned_audio_tokens))


def checkpoint_config(model: str):
    """The config of `model`, read without building anything: random:<checkpoint> from its stored spec
    (engine/random_checkpoints.py), anything else through AutoConfig, offline: a local folder, or a Hub id
    already in the local cache. Raises UnknownCheckpoint, OSError or ValueError when there is none."""
    from transformers import AutoConfig

    from .random_checkpoints import checkpoint_spec, is_random, spec_config

    if is_random(model):
        return spec_config(checkpoint_spec(model))
    return AutoConfig.from_pretrained(model, local_files_only=True)


def checkpoint_plan(config, free_bytes: int, engine_config=None) -> Plan:
    """The plan a GPU engine would make for the model of `config` (a *ForConditionalGeneration config) with
    `free_bytes` free after loading: bfloat16, the GPU's default sampling (engine/config.py GPU_FRAME_SAMPLING) as
    the planned video, the GPU's ViT patch budget, and `engine_config`'s (EngineConfig, default: the
    defaults) max_running, cache bounds and longest soundtrack, as engine_plan. Nothing is built or measured."""
    import torch

    from .config import GPU_FRAME_SAMPLING, EngineConfig, video_tokens
    from .scheduler import vit_patch_budget

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
