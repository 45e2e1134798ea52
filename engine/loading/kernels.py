"""PyTorch's own varlen attention kernel for the Qwen vision towers, for GPUs without the flash_attn package.

The Qwen3-VL and Qwen2.5-VL ViTs attend within segments of the packed token sequence: one segment per
temporal group (frame pair) of every video in the batch, and for Qwen2.5-VL's windowed blocks one per
spatial window. transformers' vision attention has two ways to run that:

- when the vision config's attention implementation is a "flash" one, it makes ONE call per layer with
  `cu_seq_lens_q/k` (the segment boundaries) and `max_length_q/k`, i.e. a varlen call;
- for any other implementation (sdpa, eager) it splits q/k/v at the boundaries and makes one call per
  segment per layer, which on a GPU is a long chain of small launches.

torch ships `torch.nn.attention.varlen.varlen_attn` (FlashAttention built into PyTorch, CUDA, fp16/bf16,
sm80+). This module registers it with transformers' AttentionInterface under `TORCH_VARLEN`, whose name
contains "flash" on purpose so the ViT takes its varlen branch (transformers tests for that substring).

Only the vision tower uses it; the language model keeps sdpa. The engine's prefill and decode give the
language model explicit padded attention masks and positions (engine/worker/lm.py, engine/state/decode_batch.py), which
the sdpa path handles as is, while a varlen kernel would need the batch unpadded and a KV cache laid out
for it. So `install` sets the kernel on `config.vision_config` only, after the model is built with sdpa
(transformers would try to fetch any unknown "flash"-named implementation as a Hub kernel at build time).
"""

import importlib
from collections.abc import Callable

import torch
from transformers import AttentionInterface, PreTrainedModel

TORCH_VARLEN = "torch_flash_varlen"


def torch_varlen_available() -> bool:
    """Whether this torch has `torch.nn.attention.varlen.varlen_attn` (it runs on CUDA only)."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def _torch_varlen_kernel(query, key, value, cu_seq_q, cu_seq_k, max_q: int, max_k: int, scale: float | None):
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale)


# The one varlen call behind TORCH_VARLEN, looked up at call time so that CPU tests can stand in a
# pure-torch reference (the CUDA kernel does not run on CPU). Signature:
# (q, k, v: (T, H, D); cu_seq_q, cu_seq_k: (N+1,) int32 segment starts and total; max_q, max_k: int,
# longest segment; scale) -> (T, H, D); non-causal attention within each segment.
kernel: Callable[..., torch.Tensor] = _torch_varlen_kernel


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    is_causal: bool | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | None = None,
    max_length_q: int | None = None,
    max_length_k: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: query, key, value (1, H, T, D), all segments of all videos packed
    along T; cu_seq_lens_q/k (N+1,) int32 boundaries; max_length_q/k the longest segment (python int, so
    no host sync here). Returns ((1, T, H, D), None), the layout transformers' flash functions return.

    Serves the non-causal, unmasked, dropout-free attention of the vision towers only; anything else
    raises rather than computing the wrong thing.
    """
    if cu_seq_lens_q is None or cu_seq_lens_k is None or max_length_q is None or max_length_k is None:
        raise ValueError(f"{TORCH_VARLEN} needs cu_seq_lens_q/k and max_length_q/k (vision towers only)")
    if attention_mask is not None or is_causal or dropout:
        raise ValueError(f"{TORCH_VARLEN} serves non-causal, unmasked, dropout-free vision attention only")
    if query.shape[0] != 1:
        raise ValueError(f"{TORCH_VARLEN} expects one packed sequence, got batch {query.shape[0]}")
    # (1, H, T, D) -> (T, H, D). The kernel wants a dense layout; value comes out of a strided qkv split.
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))
    out = kernel(
        q,
        k,
        v,
        cu_seq_lens_q.to(torch.int32),
        cu_seq_lens_k.to(torch.int32),
        int(max_length_q),
        int(max_length_k),
        scaling,
    )
    return out.unsqueeze(0), None


AttentionInterface.register(TORCH_VARLEN, varlen_attention_forward)


def built_implementation(attn: str) -> str:
    """The attn_implementation to build a model with when its vision tower is to run `attn`: sdpa for
    TORCH_VARLEN (the language model's kernel; `install` switches the vision tower afterwards), else `attn`."""
    return "sdpa" if attn == TORCH_VARLEN else attn


def install(model: PreTrainedModel, attn: str) -> None:
    """Point the vision tower of a built Qwen-VL `model` at `attn` when that is TORCH_VARLEN; a no-op
    otherwise. The language model keeps the implementation it was built with."""
    if attn != TORCH_VARLEN:
        return
    # A dict updates only the named sub-config (and the submodel that owns it); the text config and the
    # top-level config keep theirs.
    model.set_attn_implementation({"vision_config": TORCH_VARLEN})
    if model.config.vision_config._attn_implementation != TORCH_VARLEN:
        raise RuntimeError(f"transformers did not set {TORCH_VARLEN} on the vision tower")


def linear_attention_kernels(device: torch.device) -> str:
    """What runs a hybrid model's linear-attention (Gated DeltaNet) layers, as transformers picks it when the
    model's module is imported: flash-linear-attention's Triton kernels for the delta rule when `fla` imports,
    causal-conv1d's CUDA kernels for the short convolution when `causal_conv1d` does, else pure torch for each.

    On a CPU a Triton kernel cannot run CPU tensors, yet transformers would still pick it: the CPU environment
    keeps both packages out (tests/test_attention.py checks it), and here they are named as they stand."""
    delta = "flash-linear-attention (Triton)" if _importable("fla") else "torch"
    conv = "causal-conv1d (CUDA)" if _importable("causal_conv1d") else "torch"
    note = "" if device.type == "cuda" or delta == conv == "torch" else "; these kernels need CUDA tensors"
    return f"delta rule {delta}, short convolution {conv}{note}"


def mamba_kernels(device: torch.device) -> str:
    """What runs a hybrid model's Mamba-2 layers (Nemotron-H), as transformers picks it: mamba-ssm's kernels for
    the selective scan when `mamba_ssm` imports, causal-conv1d's for the short convolution when `causal_conv1d`
    does, else its pure-torch reference for each (which the CPU environment keeps to, as for Gated DeltaNet)."""
    scan = "mamba-ssm (CUDA)" if _importable("mamba_ssm") else "torch"
    conv = "causal-conv1d (CUDA)" if _importable("causal_conv1d") else "torch"
    note = "" if device.type == "cuda" or scan == conv == "torch" else "; these kernels need CUDA tensors"
    return f"selective scan {scan}, short convolution {conv}{note}"


def _importable(module: str) -> bool:
    """Whether `module` imports, as transformers tries it (a package that is present but fails to import is
    not used: transformers falls back to torch)."""
    try:
        importlib.import_module(module)
    except Exception:
        return False
    return True
