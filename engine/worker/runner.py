"""The tensor side of an iteration: vision forwards, EVS, prefill and the shared decode step.

Only the worker thread calls it, so nothing here is locked. It owns the device state: the vision
encoder and its feature cache, the prefix KV cache and the decode batch.
"""

import time

import torch

from engine.families.base import Family
from engine.prompt.pruned import prune_prompt
from engine.scheduling.request import Request
from engine.scheduling.scheduler import WorkWeights
from engine.state.decode_batch import DecodeBatch
from engine.state.lm_state import LINEAR, LMState, layer_kinds, new_cache, state_of
from engine.state.prefix_cache import PrefixCache, prefix_key

from .live import LiveRunner
from .lm import LMInput, embed_prompt, embed_tokens, lm_logits
from .vision import VisionEncoder


def eos_token_ids(loaded) -> set[int]:
    ids = loaded.model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if loaded.processor.tokenizer.eos_token_id is not None:
        ids.add(loaded.processor.tokenizer.eos_token_id)
    return ids


def work_weights(model, family: Family) -> WorkWeights:
    """Cost of a vision patch against a prompt token, as the parameters each passes through."""
    vision = sum(p.numel() for module in family.vision_modules(model) for p in module.parameters())
    language = sum(p.numel() for p in family.text_model(model).parameters())
    return WorkWeights(per_patch=vision / language, per_token=1.0)


class ModelRunner:
    def __init__(self, loaded, family: Family, config):
        self.model = loaded.model
        self.family = family
        self.vision = VisionEncoder(self.model, family, loaded.name, config.feature_cache_bytes)
        self.layer_kinds = layer_kinds(self.model.config.text_config)
        self.prefix = PrefixCache(config.prefix_cache_bytes)
        self.batch = DecodeBatch()
        self.eos_ids = eos_token_ids(loaded)
        self.weights = work_weights(self.model, family)
        self.live = LiveRunner(
            self.model, family, self.layer_kinds, config.vision_reuse, family.pixel_levels(loaded.processor)
        )

    def missing(self, request: Request) -> dict[tuple, int]:
        return self.vision.missing(request)

    def encode(self, requests: list[Request], on_forward, live=()) -> None:
        """Features for every request of a chunk the scheduler chose and the live groups riding it, in one vision
        forward (each group's units to encode decided first, in its stream's order)."""
        self.live.plan(live)
        self.vision.encode(requests, on_batch=on_forward, live=live)

    def prune(self, request: Request) -> None:
        start = time.perf_counter()
        params = request.params
        request.pruned = prune_prompt(
            request.prompt,
            request.features,
            params.pruning_rate,
            params.pruning_method,
            [plan.candidates for plan in request.plans],
        )
        request.stats.evs_s = time.perf_counter() - start

    def prefill(self, request: Request) -> torch.Tensor:
        """Run the request's pruned prompt (its uncached part) through the language model, unpadded and alone,
        into a cache of its own (request.kv); returns the last position's logits, (V,) float32.

        A hybrid model's prompt runs in segments that end where a later request may continue it: the end of
        [system + media] (another question on the same media) and the start of the answer's opening (a follow-up
        quoting this answer). The recurrent state at each such end is kept as a snapshot (engine/state/lm_state.py)."""
        start = time.perf_counter()
        if request.live is not None:  # a question asked of a live session: its session's state, forked
            cache, begin = self.live.fork(request)
        pruned = request.pruned
        length = pruned.input_ids.numel()
        if request.live is None:
            request.prefix_key = prefix_key(
                tuple(request.feature_keys),
                request.params.pruning_method,
                request.params.pruning_rate,
                pruned.input_ids[: pruned.prefix_len],
            )
            cache, begin, request.snapshots = self.prefix.lookup(
                request.prefix_key, pruned.input_ids, pruned.prefix_len
            )
        hit = cache is not None and request.live is None
        if cache is None:
            cache = new_cache(self.layer_kinds)
        resumable = (pruned.prefix_len, pruned.reply_start) if LINEAR in self.layer_kinds else ()
        ends = sorted({end for end in resumable if begin < end < length} | {length})
        segment_begin = begin
        for end in ends:
            logits = self._forward(cache, pruned, segment_begin, end)
            if end < length:
                request.snapshots[end] = state_of(cache).snapshot()
            segment_begin = end
        stats = request.stats
        stats.prefix_cache_hit, stats.prefill_tokens = hit, length - begin
        stats.prefill_s, stats.decode_batch_max = time.perf_counter() - start, 1
        request.tokens_seen = length
        request.next_position = pruned.next_position
        request.kv = cache
        if not hit and request.live is None:  # requests arriving meanwhile on the same video reuse at least this prompt
            self.prefix.store(request.prefix_key, pruned.input_ids, state_of(cache), request.snapshots)
        return logits[0]

    def _forward(self, cache, pruned, begin: int, end: int) -> torch.Tensor:
        """The pruned prompt's tokens begin..end appended to cache; (1, V) logits of the last. A segment from
        the start carries every medium and soundtrack (a split never falls inside them); any later one is
        text."""
        positions = pruned.positions[:, None, begin:end].to(self.model.device)
        if begin > 0:
            text = embed_tokens(self.model, pruned.input_ids[begin:end])
            return lm_logits(self.model, self.family, LMInput(text[None], positions), cache)
        embeds = embed_prompt(
            self.model, pruned.input_ids[:end], pruned.visual_mask[:end], pruned.features, pruned.audio_mask[:end]
        )
        visual_mask = pruned.visual_mask[None, :end].to(self.model.device)
        batch = LMInput(embeds[None], positions, None, visual_mask, pruned.features.deepstack)
        return lm_logits(self.model, self.family, batch, cache)

    def join(self, request: Request) -> None:
        """The prefilled request becomes a row of the decode batch."""
        self.batch.add(request.id, request.kv)
        request.kv = None

    def decode_step(self, rows: list[Request]) -> torch.Tensor:
        """One token for every row of the batch; rows in batch order. Returns (B, V) float32 logits."""
        assert [r.id for r in rows] == self.batch.keys, "rows must be the decode batch, in its order"
        device = self.model.device
        tokens = torch.tensor([r.last_token for r in rows], device=device)
        one_d = torch.tensor([r.tokens_seen for r in rows], device=device)
        mrope = torch.tensor([r.next_position for r in rows], device=device)
        positions = torch.stack([one_d, mrope, mrope, mrope])[:, :, None]  # (4, B, 1)
        batch = LMInput(embed_tokens(self.model, tokens)[:, None], positions, self.batch.step_mask())
        logits = lm_logits(self.model, self.family, batch, self.batch.cache)
        for request in rows:
            request.tokens_seen += 1
            request.next_position += 1
        return logits

    def leave(self, requests: list[Request], remember: bool) -> None:
        """Requests end: their rows leave the decode batch (one rebuild for all) and their state is freed.
        With remember, each one's conversation state is stored for a follow-up (`_remember`)."""
        rows = {r.id for r in requests if r.id in self.batch.keys}
        for request in requests:
            state = self.batch.row_state(request.id) if request.id in rows else None
            if state is None and request.kv is not None:
                state = state_of(request.kv)
            if remember and state is not None and request.pruned is not None and request.live is None:
                self._remember(request, state)
            request.kv, request.snapshots = None, {}
        self.batch.remove(rows)

    def _remember(self, request: Request, state: LMState) -> None:
        """Store what a follow-up can continue: the prompt and the answer tokens fed back so far (a cancelled
        request's too: its partial answer is what a follow-up will quote), with `state` after them. Where the
        family opens the answer with text its chat template leaves out of an earlier turn (Qwen3.5's think
        block), a follow-up parts from this conversation at the answer's opening, so only the prompt up to
        `reply_start` is kept, with the state there: none of the answer's state is worth its bytes."""
        pruned, snapshots = request.pruned, request.snapshots
        fed_back = request.tokens_seen - pruned.input_ids.numel()
        answer = torch.tensor(request.detokenizer.token_ids[:fed_back], dtype=pruned.input_ids.dtype)
        conversation = torch.cat([pruned.input_ids, answer])
        cut = pruned.reply_start
        if cut < pruned.input_ids.numel() and (cut in snapshots or not state.has_recurrent):
            conversation, state = conversation[:cut], state.prefix(cut, snapshots.get(cut))
            snapshots = {n: snap for n, snap in snapshots.items() if n < cut}
        self.prefix.store(request.prefix_key, conversation, state, snapshots)

    def drop_batch(self) -> None:
        """Forget the decode batch without touching the device (after a fault it may be out of memory)."""
        self.batch = DecodeBatch()
