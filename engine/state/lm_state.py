"""The language model's state for one or more sequences: keys and values for attention layers, a constant
recurrent state for linear-attention layers (Qwen3.5's Gated DeltaNet, Nemotron-H's Mamba-2: both a conv state
of the last inputs of a short causal convolution and a float32 recurrent state, kept alike by transformers'
LinearAttentionLayer), nothing for layers without a sequence mixer (Nemotron-H's MoE and MLP layers), and their
conversion to and from the transformers `Cache` a forward appends to.

The two kinds of layer need different rules, and this module is where they differ:
- KV grows by one slot a token and can be cut back to any shorter prefix; rows of different lengths share a
  batch by left padding, since a masked slot is never attended to (it holds zeros all the same: a softmax
  weight of 0 times NaN would be NaN).
- A recurrent state has no token axis: it is the whole past folded into fixed-size tensors, so it can only
  resume from the exact end of what it has seen (`resumable_at`), and rows stack along the batch axis with
  no padding at all. A prefill segment must never be padded behind a non-empty state: the decay is not
  masked and pads enter the conv window (tests/test_hybrid_state.py shows the error). The runner prefills
  every row alone, unpadded, and resumes follow-ups from snapshots (engine/state/prefix_cache.py).
"""

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DummyLayer, DynamicLayer, LinearAttentionLayer

ATTENTION, LINEAR, STATELESS = "full_attention", "linear_attention", "stateless"
# Layer types (config.layer_types) that mix nothing along the sequence, so keep no state: Nemotron-H's.
_STATELESS_TYPES = ("moe", "mlp")


class GrowingLayer(DynamicLayer):
    """A KV layer that appends into spare capacity in place.

    transformers' DynamicLayer concatenates on every update, copying the whole cache each decode step
    (measured: 39% of a batch-8 decode step on CPU). Here `keys`/`values` are views of the first
    `length` slots of (B, heads, capacity, head_dim) buffers that grow by SPARE_TOKENS when full.
    """

    SPARE_TOKENS = 256

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._key_buffer = self._value_buffer = None
        length = self.get_seq_length()
        end = length + key_states.shape[-2]
        if self._key_buffer is None or end > self._key_buffer.shape[-2]:
            self._key_buffer = self._grown(self.keys, key_states, end + self.SPARE_TOKENS)
            self._value_buffer = self._grown(self.values, value_states, end + self.SPARE_TOKENS)
        self._key_buffer[:, :, length:end] = key_states
        self._value_buffer[:, :, length:end] = value_states
        self.keys = self._key_buffer[:, :, :end]
        self.values = self._value_buffer[:, :, :end]
        return self.keys, self.values

    @classmethod
    def holding(cls, key_buffer: torch.Tensor, value_buffer: torch.Tensor, length: int) -> "GrowingLayer":
        """A layer whose KV is the first `length` slots of (B, heads, capacity, head_dim) buffers; the next
        tokens go into the slots after them."""
        layer = cls()
        layer.lazy_initialization(key_buffer, value_buffer)
        layer._key_buffer, layer._value_buffer = key_buffer, value_buffer
        layer.keys, layer.values = key_buffer[:, :, :length], value_buffer[:, :, :length]
        return layer

    @staticmethod
    def _grown(old: torch.Tensor, new: torch.Tensor, capacity: int) -> torch.Tensor:
        buffer = new.new_empty(new.shape[0], new.shape[1], capacity, new.shape[3])
        if old.numel():
            buffer[:, :, : old.shape[-2]] = old
        return buffer


@dataclass(frozen=True)
class KV:
    """An attention layer's keys and values, each (B, heads, S, head_dim)."""

    keys: torch.Tensor
    values: torch.Tensor


@dataclass(frozen=True)
class Recurrent:
    """A linear-attention layer's state after the last token it saw: conv (B, conv_dim, kernel) in the model
    dtype, the last inputs of its causal conv; ssm float32, (B, value_heads, key_dim, value_dim) for Gated
    DeltaNet, (B, mamba_heads, mamba_head_dim, ssm_state_size) for Mamba-2."""

    conv: torch.Tensor
    ssm: torch.Tensor


# None: a layer that keeps no state (an MoE or MLP layer of Nemotron-H).
Layer = KV | Recurrent | None
# The recurrent layers' state at one point of a sequence, None at attention layers.
Snapshot = tuple[Recurrent | None, ...]


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True)
class LMState:
    """Per language-model layer, in model order, a KV or a Recurrent of the same B sequences, or None.

    tokens: the KV's token axis S (every served model has an attention layer, `layer_kinds`); for a batch, the
    padded length.
    """

    layers: tuple[Layer, ...]

    @property
    def tokens(self) -> int:
        return next(layer.keys.shape[2] for layer in self.layers if isinstance(layer, KV))

    @property
    def device(self) -> torch.device:
        return next(_tensors(layer)[0].device for layer in self.layers if layer is not None)

    @property
    def has_recurrent(self) -> bool:
        return any(isinstance(layer, Recurrent) for layer in self.layers)

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(*_tensors(layer)) for layer in self.layers if layer is not None)

    def prefix(self, length: int, snapshot: Snapshot | None = None) -> "LMState":
        """The state after the first `length` tokens: KV cut back (views), recurrent layers from `snapshot` (taken
        after exactly those tokens), or this state's own when `length` is where it ends. ValueError otherwise:
        a recurrent state cannot be cut back."""
        if length > self.tokens or (snapshot is None and self.has_recurrent and length != self.tokens):
            raise ValueError(f"a recurrent state of {self.tokens} tokens cannot resume after {length}")
        cut = self._map(lambda kv: KV(kv.keys[:, :, :length], kv.values[:, :, :length]), lambda r: r)
        return cut if snapshot is None else cut.with_recurrent(snapshot)

    def clone(self) -> "LMState":
        """Owned copies, so the state pins no larger batch tensor and later in-place updates leave it alone."""
        return self._map(
            lambda kv: KV(kv.keys.clone(), kv.values.clone()), lambda r: Recurrent(r.conv.clone(), r.ssm.clone())
        )

    def snapshot(self) -> Snapshot:
        """Owned copies of the recurrent layers (None at attention layers): what resuming here needs beside KV."""
        return tuple(
            Recurrent(layer.conv.clone(), layer.ssm.clone()) if isinstance(layer, Recurrent) else None
            for layer in self.layers
        )

    def with_recurrent(self, snapshot: Snapshot) -> "LMState":
        """This state's KV with the recurrent layers of `snapshot` (taken at this state's token count)."""
        return LMState(tuple(saved if saved is not None else layer for layer, saved in zip(self.layers, snapshot)))

    def _map(self, on_kv, on_recurrent) -> "LMState":
        """Each KV layer through on_kv, each Recurrent through on_recurrent; stateless layers stay None."""
        return LMState(
            tuple(
                on_kv(layer) if isinstance(layer, KV) else on_recurrent(layer) if layer else None
                for layer in self.layers
            )
        )

    def row(self, i: int, tokens: int) -> "LMState":
        """Sequence i alone, without its left padding: its last `tokens` KV slots (views)."""
        return self._map(
            lambda kv: KV(kv.keys[i : i + 1, :, -tokens:], kv.values[i : i + 1, :, -tokens:]),
            lambda r: Recurrent(r.conv[i : i + 1], r.ssm[i : i + 1]),
        )


def _tensors(layer: Layer) -> tuple[torch.Tensor, torch.Tensor]:
    return (layer.keys, layer.values) if isinstance(layer, KV) else (layer.conv, layer.ssm)


def snapshot_nbytes(snapshot: Snapshot) -> int:
    return sum(_nbytes(layer.conv, layer.ssm) for layer in snapshot if layer is not None)


def layer_kinds(text_config) -> tuple[str, ...]:
    """ATTENTION, LINEAR or STATELESS per language-model layer; every layer attends in the KV-only families."""
    kinds = getattr(text_config, "layer_types", None) or [ATTENTION] * text_config.num_hidden_layers
    kinds = [STATELESS if kind in _STATELESS_TYPES else kind for kind in kinds]
    unknown = set(kinds) - {ATTENTION, LINEAR, STATELESS}
    if unknown:
        raise ValueError(f"layer types {sorted(unknown)} are not served")
    if ATTENTION not in kinds:  # transformers' own masks and generate need one; so does the batch's padding
        raise ValueError("a language model without a full-attention layer is not served")
    return tuple(kinds)


def new_cache(kinds: tuple[str, ...]) -> Cache:
    """An empty cache: KV layers that append in place, recurrent layers as transformers keeps them, and a
    placeholder where a layer keeps nothing (transformers indexes the cache by layer)."""
    make = {ATTENTION: GrowingLayer, LINEAR: LinearAttentionLayer, STATELESS: DummyLayer}
    return Cache(layers=[make[kind]() for kind in kinds])


def state_of(cache: Cache) -> LMState:
    """The tensors a forward left in cache (views of it)."""
    layers = []
    for layer in cache.layers:
        if isinstance(layer, DummyLayer):
            layers.append(None)
        elif isinstance(layer, LinearAttentionLayer):
            layers.append(Recurrent(layer.conv_states[0], layer.recurrent_states[0]))
        else:
            layers.append(KV(layer.keys, layer.values))
    return LMState(tuple(layers))


def cache_of(state: LMState) -> Cache:
    """A cache holding a copy of state, ready to be appended to: the forward writes the copy, never a stored
    state (the linear layers update theirs in place)."""
    return batch_cache([state], state.tokens)


def batch_cache(states: list[LMState], length: int) -> Cache:
    """The sequences of several states as one batch, in a cache ready to be appended to: each KV layer
    left-padded with zeros to `length` tokens and written once, straight into growable buffers; the recurrent
    states concatenated along the batch axis (no token axis, so nothing to pad), owned by the cache.

    Stacking first and copying into the buffers after moved every byte of the batch three times, which made
    a join at 7 rows of random-qwen3-vl-50m on 2 CPU cores as slow as a decode step (44 ms)."""
    kinds = tuple(ATTENTION if isinstance(layer, KV) else LINEAR if layer else STATELESS for layer in states[0].layers)
    cache = new_cache(kinds)
    for index, parts in enumerate(zip(*(state.layers for state in states))):
        if parts[0] is None:
            continue
        if isinstance(parts[0], KV):
            cache.layers[index] = GrowingLayer.holding(
                _right_aligned([p.keys for p in parts], length),
                _right_aligned([p.values for p in parts], length),
                length,
            )
        else:
            _fill_recurrent(cache.layers[index], torch.cat([p.conv for p in parts]), torch.cat([p.ssm for p in parts]))
    return cache


def _right_aligned(tensors: list[torch.Tensor], length: int) -> torch.Tensor:
    """(sum of B, heads, length + SPARE_TOKENS, head_dim) holding each (B_i, heads, S_i, head_dim) of `tensors` in
    its rows, ending at slot `length`, zeros before it (a masked slot must still hold a finite number: a
    softmax weight of 0 times NaN is NaN)."""
    first = tensors[0]
    buffer = first.new_empty(
        sum(t.shape[0] for t in tensors), first.shape[1], length + GrowingLayer.SPARE_TOKENS, first.shape[3]
    )
    row = 0
    for tensor in tensors:
        rows, start = tensor.shape[0], length - tensor.shape[2]
        assert start >= 0, "a row longer than the batch"
        buffer[row : row + rows, :, :start] = 0
        buffer[row : row + rows, :, start:length] = tensor
        row += rows
    return buffer


def _fill_recurrent(layer: LinearAttentionLayer, conv: torch.Tensor, ssm: torch.Tensor) -> None:
    """Put a state into an empty LinearAttentionLayer as if a forward had left it there."""
    layer.conv_states[0], layer.recurrent_states[0] = conv, ssm
    layer.conv_kernel_size[0] = conv.shape[-1]
    layer.dtype, layer.device = conv.dtype, conv.device
    layer.is_conv_states_initialized[0] = layer.is_recurrent_states_initialized[0] = True
    layer.has_previous_state[0] = True
