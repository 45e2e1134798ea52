"""The decode batch's KV bookkeeping: in-place appends, left padding on join, trimming on leave.
(Recurrent layers: tests/test_hybrid_state.py.)"""

import pytest
import torch

from engine.state.decode_batch import DecodeBatch
from engine.state.lm_state import ATTENTION, KV, GrowingLayer, LMState, cache_of, new_cache, state_of


@pytest.fixture
def poisoned_fresh_memory():
    """Every fresh tensor (torch.empty, new_empty) filled with NaN for the test, through torch's own deterministic
    mode, so that a slot the code leaves unwritten reads as NaN, never as zeros by luck: the allocator often
    hands back stale memory, but sometimes pages that are zero."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    assert torch.empty(4).isnan().all()
    try:
        yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


def cache_from_tensors(tensors):
    return cache_of(LMState(tuple(KV(k, v) for k, v in tensors)))


def cache_tensors(cache):
    return [(layer.keys, layer.values) for layer in state_of(cache).layers]


def kv(batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, 2, length, 4, generator=generator) for _ in range(2))


def test_growing_layer_equals_concatenation_across_regrowth():
    cache = new_cache((ATTENTION,))
    pieces = [kv(1, n, seed) for seed, n in enumerate([5, 1, GrowingLayer.SPARE_TOKENS, 1, 3])]
    for keys, values in pieces:
        got_k, got_v = cache.update(keys, values, 0)
    assert torch.equal(got_k, torch.cat([k for k, _ in pieces], dim=2))
    assert torch.equal(got_v, torch.cat([v for _, v in pieces], dim=2))
    assert cache.get_seq_length() == sum(k.shape[2] for k, _ in pieces)


@pytest.mark.usefixtures("poisoned_fresh_memory")
def test_join_left_pads_and_leave_trims():
    batch = DecodeBatch()
    short, long = kv(1, 3, 0), kv(1, 7, 1)
    batch.add("short", cache_from_tensors([short]))
    batch.add("long", cache_from_tensors([long]))
    keys, _ = cache_tensors(batch.cache)[0]
    assert keys.shape[2] == 7
    assert batch.attention_mask.tolist() == [[0, 0, 0, 0, 1, 1, 1], [1] * 7]
    assert torch.equal(keys[0, :, 4:], short[0][0]) and torch.equal(keys[1], long[0][0])
    batch.step_mask()
    batch.cache.update(*kv(2, 1, 2), 0)
    batch.remove({"long"})
    keys, _ = cache_tensors(batch.cache)[0]
    assert batch.keys == ["short"] and batch.attention_mask.tolist() == [[1, 1, 1, 1]]
    assert keys.shape[2] == 4 and torch.equal(keys[0, :, :3], short[0][0])
    batch.remove({"short"})
    assert len(batch) == 0 and batch.cache is None


@pytest.mark.usefixtures("poisoned_fresh_memory")
def test_rows_of_different_lengths_keep_their_own_kv_when_others_leave():
    """Four rows of 5, 9, 3 and 6 tokens, two decode steps, then the longest and the first leave: every row left
    holds exactly its own prompt and steps, right-aligned, with zeros (never stale numbers) in its padding.
    Pins a leave (`DecodeBatch.remove`) that does not zero the padding of the rows that stay; with fresh
    buffers poisoned, every run sees it, not only those where the allocator hands back non-zero memory."""
    batch, prompts = DecodeBatch(), {}
    for seed, (name, length) in enumerate([("a", 5), ("b", 9), ("c", 3), ("d", 6)]):
        prompts[name] = kv(1, length, seed)
        batch.add(name, cache_from_tensors([prompts[name]]))
    steps = [kv(4, 1, 10 + step) for step in range(2)]
    for keys, values in steps:
        batch.step_mask()
        batch.cache.update(keys, values, 0)
    batch.remove({"b"})
    batch.remove({"a"})
    keys, values = cache_tensors(batch.cache)[0]
    assert batch.keys == ["c", "d"] and keys.shape[2] == values.shape[2] == 6 + 2
    assert batch.attention_mask.tolist() == [[0, 0, 0, 1, 1, 1, 1, 1], [1] * 8]
    for row, (name, old_row) in enumerate([("c", 2), ("d", 3)]):  # each one's row before the others left
        alone = batch.row_state(name).layers[0]
        for got, own_alone, prompt, stepped in (
            (keys, alone.keys, prompts[name][0], [k for k, _ in steps]),
            (values, alone.values, prompts[name][1], [v for _, v in steps]),
        ):
            own = torch.cat([prompt[0], *(step[old_row] for step in stepped)], dim=1)  # (heads, tokens, dim)
            assert torch.equal(own_alone[0], own) and torch.equal(got[row, :, -own.shape[1] :], own)
            assert not got[row, :, : got.shape[2] - own.shape[1]].any()


def test_prefix_cache_reuses_the_longest_shared_start():
    from engine.state.prefix_cache import PrefixCache

    cache = PrefixCache(max_bytes=1 << 20)
    stored_ids = torch.tensor([1, 2, 3, 4, 5, 6])
    keys, values = kv(1, 6, 0)
    cache.store("k", stored_ids, LMState((KV(keys, values),)), {})
    reused_cache, reused, _ = cache.lookup("k", torch.tensor([1, 2, 3, 4, 9, 9, 9]), min_len=3)
    assert reused == 4 and torch.equal(cache_tensors(reused_cache)[0][0], keys[:, :, :4])
    _, whole, _ = cache.lookup("k", stored_ids.clone(), min_len=3)
    assert whole == 5  # one token is always left to prefill, for its logits
    assert cache.lookup("k", torch.tensor([1, 2, 7, 7]), min_len=3) == (None, 0, {})
    assert cache.lookup("other", stored_ids, min_len=1) == (None, 0, {})
