"""What a model costs in device memory, read from its config: KV bytes per token, a hybrid model's
linear-attention state per sequence, features per video and audio token, and the activations of one ViT,
audio-tower or prefill forward. Plain arithmetic on config numbers; the plan (plan.py) adds them up.
"""

from dataclasses import dataclass

from ..families.registry import video_geometry

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
            return cls(
                layers=layers,
                key_heads=text.linear_num_key_heads,
                value_heads=text.linear_num_value_heads,
                key_head_dim=text.linear_key_head_dim,
                value_head_dim=text.linear_value_head_dim,
                conv_kernel=text.linear_conv_kernel_dim,
            )
        return cls(
            layers=layers,
            key_heads=text.n_groups,
            value_heads=text.mamba_num_heads,
            key_head_dim=text.ssm_state_size,
            value_head_dim=text.mamba_head_dim,
            conv_kernel=text.conv_kernel,
            chunk=text.chunk_size,
            float32_keys=2,
            float32_values=6,
        )

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
        return cls(
            hidden=audio.hidden_size,
            heads=audio.num_attention_heads,
            intermediate=audio.intermediate_size,
            mel_bins=audio.num_mel_bins,
            conv_channels=audio.subsampling_conv_channels,
            subsampling_factor=audio.subsampling_factor,
        )

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
        layer = scores + dtype_bytes * (
            tokens * (4 * self.hidden + 2 * self.intermediate) + 2 * tokens * 2 * self.hidden
        )
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
        channels = (
            getattr(vision, "in_channels", None)
            or getattr(vision, "in_chans", None)
            or getattr(vision, "num_channels", 3)
        )
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
        return (
            f"state {self.state_bytes_per_sequence / MIB:.1f} MiB/sequence + {kv} "
            f"({self.kv_layers} of {self.text_layers} layers)"
        )

    def vit_bytes(self, patches: int) -> int:
        """Peak activations of one ViT forward over `patches` patch rows: the float32 pixels and their cast,
        one layer's residual, norm, attention and MLP tensors (4 * hidden + 2 * MLP wide), and the merged
        output of every feature level, which lives until the forward ends."""
        per_patch = FLOAT32_BYTES * self.patch_values + self.dtype_bytes * (
            self.patch_values + 4 * self.vision_hidden + 2 * self.vision_intermediate
        )
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
        per_token = self.dtype_bytes * (
            4 * self.text_hidden + 3 * self.text_intermediate + 4 * self.experts_per_token * self.text_hidden
        )
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
    shared = (
        getattr(text, "shared_expert_intermediate_size", None)  # Qwen3.5 / 3.6 MoE
        or getattr(text, "moe_shared_expert_intermediate_size", None)
        or 0
    )  # Nemotron-H
    width = experts * routed + shared
    some_dense = getattr(text, "mlp_only_layers", None) or (getattr(text, "decoder_sparse_step", None) or 1) > 1
    if some_dense:
        width = max(width, text.intermediate_size)
    return width, experts
