"""The scheduler's decisions on plain requests: pipelined chunks, the order within a burst, budgets.

The scheduler is bookkeeping over request fields only (no tensors), so these requests carry just the
fields it reads; tests/test_pipeline.py checks the same behaviour through a real engine.
"""

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from engine.config import EngineConfig, GenerationParams, vit_patch_budget
from engine.scheduling.scheduler import Scheduler, WorkWeights, vision_chunks
from engine.scheduling.stage import Stage
from engine.stats import Stats

_ids = iter(range(1, 10_000))


@dataclass(eq=False)
class Plain:
    """A request as the scheduler sees it: patches to encode, prompt tokens, rate, video key; `more`: further
    media, (key, patches) each."""

    patches: int
    prompt_tokens: int
    video_tokens: int
    video: str
    q: float = 0.0
    more: tuple = ()
    id: int = field(default_factory=lambda: next(_ids))
    stage: Stage = Stage.QUEUED
    live: object = None  # a question asked of a live session carries its LiveQuestion here

    def __post_init__(self):
        self.prompt = SimpleNamespace(input_ids=[0] * self.prompt_tokens)
        self.stats = Stats(video_tokens_total=self.video_tokens)
        self.params = GenerationParams(pruning_rate=self.q)
        self.media = [(self.video, self.patches), *self.more]
        self.stream = SimpleNamespace(cancelled=False)
        self.pruned = None

    def encode(self, kept_tokens: int | None = None) -> None:
        self.pruned = SimpleNamespace(input_ids=[0] * (kept_tokens or self.prompt_tokens))


DEFAULT_WEIGHTS = WorkWeights()


def scheduler(cached=(), max_running=16, vit=100, prefill=1000, weights=DEFAULT_WEIGHTS) -> Scheduler:
    return Scheduler(
        max_running,
        vit,
        prefill,
        weights,
        missing=lambda r: {key: patches for key, patches in r.media if key not in cached},
    )


def run_encode(s: Scheduler, chunk: list[Plain]) -> None:
    for request in chunk:
        request.encode()
        s.encoded(request)


def test_a_chunk_is_prefilled_before_the_next_is_encoded():
    s = scheduler(vit=100)
    burst = [Plain(60, 30, 20, f"v{i}") for i in range(3)]
    for request in burst:
        s.add(request)
    assert s.admit() == burst and all(r.stage is Stage.ENCODING for r in burst)
    first = s.encode_chunk()
    assert first == burst[:1]  # 60 + 60 patches would pass the budget of 100
    run_encode(s, first)
    assert s.encode_chunk() == []  # its prompt waits for prefill first
    assert s.prefill_batch() == first
    s.decoding(first[0])
    assert s.encode_chunk() == burst[1:2]


def test_shortest_work_first_within_a_burst_and_arrival_order_across_bursts():
    s = scheduler(vit=10_000)
    long, short, mid = Plain(900, 500, 400, "long"), Plain(100, 80, 50, "short"), Plain(400, 200, 150, "mid")
    for request in (long, short, mid):
        s.add(request)
    assert s.admit() == [short, mid, long]
    later = Plain(10, 10, 5, "tiny")
    s.add(later)
    s.admit()
    assert s.encoding == [short, mid, long, later]  # a later burst never overtakes an earlier one


def test_work_counts_tokens_left_after_pruning_and_nothing_for_cached_features():
    s = scheduler(cached={"cached"}, weights=WorkWeights(per_patch=0.5, per_token=1.0))
    assert s.remaining_work(Plain(100, 80, 60, "fresh", q=0.5)) == pytest.approx(100 * 0.5 + (80 - 30))
    assert s.remaining_work(Plain(100, 80, 60, "cached", q=0.0)) == pytest.approx(80)


def test_requests_on_the_same_video_ride_along_and_cached_ones_cost_nothing():
    s = scheduler(cached={"seen"}, vit=100)
    a, b, c, again, seen = (
        Plain(60, 30, 20, "a"),
        Plain(60, 30, 20, "b"),
        Plain(60, 30, 20, "c"),
        Plain(60, 30, 20, "a", q=0.9),
        Plain(60, 30, 20, "seen"),
    )
    for request in (a, b, c, again, seen):
        s.add(request)
    s.admit()
    # seen (cached) and again (q = 0.9) are the cheapest; a costs nothing once again's video is in the
    # chunk, while b would pass the budget.
    assert s.encode_chunk() == [seen, again, a]
    assert s.encoding == [seen, again, a, b, c]


def test_one_video_over_the_budget_is_encoded_alone():
    s = scheduler(vit=10)
    big, small = Plain(50, 30, 20, "big"), Plain(5, 40, 30, "small")
    s.add(big)
    s.admit()
    s.add(small)
    s.admit()
    assert s.encode_chunk() == [big]


def test_vision_chunks_keep_each_forward_within_the_budget_and_a_larger_video_alone():
    assert vision_chunks([40, 50, 20, 150, 30, 30], 100) == [[0, 1], [2], [3], [4, 5]]
    assert vision_chunks([], 100) == []


def test_the_patch_budget_is_the_configs_else_the_devices():
    assert vit_patch_budget(EngineConfig(), "cpu") == 4096 and vit_patch_budget(EngineConfig(), "cuda") == 65536
    assert vit_patch_budget(EngineConfig(vit_patch_budget=1), "cuda") == 1


def test_prefill_batch_spends_the_token_budget_but_takes_at_least_one_prompt():
    s = scheduler(vit=10_000, prefill=100)
    burst = [Plain(10, 70, 20, f"v{i}") for i in range(3)]
    for request in burst:
        s.add(request)
    s.admit()
    run_encode(s, s.encode_chunk())
    assert s.prefill_batch() == burst[:1]  # 70 + 70 > 100, and at least one
    for request in burst:
        request.pruned.input_ids = [0] * 40
    assert s.prefill_batch() == burst[:2]


def test_admission_stops_at_the_running_limit_and_remove_finds_every_stage():
    s = scheduler(max_running=2, vit=10_000)
    burst = [Plain(10, 10, 5, f"v{i}") for i in range(3)]
    for request in burst:
        s.add(request)
    assert len(s.admit()) == 2 and list(s.waiting) == burst[2:]
    run_encode(s, s.encode_chunk())
    s.decoding(burst[0])
    for request in burst:
        s.remove(request)
    assert list(s) == [] and s.idle


def test_a_later_request_on_a_video_in_the_chunk_joins_its_forward():
    s = scheduler(vit=100)
    first, other, same_video = Plain(60, 30, 20, "x"), Plain(60, 40, 20, "y"), Plain(60, 90, 20, "x")
    for request in (first, other, same_video):
        s.add(request)
    s.admit()
    assert s.encoding == [first, other, same_video]
    assert s.encode_chunk() == [first, same_video]


def test_a_request_with_several_media_brings_only_those_no_earlier_request_brings():
    """A asked alone and A with B in one burst: the second request brings B only (A is in the first), so
    both fit one forward of 100 patches; a third needing C, which passes the budget, waits, and so does
    any later request whose media are not all in the chunk, even one on A."""
    s = scheduler(vit=100)
    alone, pair = Plain(40, 30, 20, "A"), Plain(40, 60, 40, "A", more=(("B", 50),))
    third, also_c = Plain(40, 30, 20, "C"), Plain(40, 60, 40, "A", more=(("C", 40),))
    for request in (alone, pair, third, also_c):
        s.add(request)
    s.admit()
    s.encoding[:] = [alone, pair, third, also_c]
    assert s.encode_chunk() == [alone, pair]
    assert s.remaining_work(pair) == pytest.approx(90 + 60)
    s2 = scheduler(cached={"A"}, vit=100)
    assert s2.remaining_work(pair) == pytest.approx(50 + 60)  # A's features are cached: B alone to encode


def test_live_groups_take_at_most_half_the_forward_while_uploads_wait_and_all_of_it_otherwise():
    s = scheduler(vit=100)
    assert s.live_share([30, 30, 30, 30]) == 3  # no upload waits: the whole budget
    assert s.live_share([150, 10]) == 1  # at least one group, even one over the budget
    s.add(Plain(60, 30, 20, "v0"))
    s.admit()
    assert s.live_share([30, 30, 30]) == 1  # uploads wait: 50 patches of the 100
    assert s.encode_chunk(live_patches=30) == s.encoding  # and the first upload goes whatever is left


def test_a_live_question_waits_without_holding_up_uploads_then_skips_encoding():
    ready = {"live": False}
    s = Scheduler(
        16, 100, 1000, WorkWeights(), missing=lambda r: dict(r.media), ready=lambda r: r.live is None or ready["live"]
    )
    question = Plain(0, 0, 0, "live", live=SimpleNamespace(tail_tokens=12))
    upload = Plain(60, 30, 20, "v0")
    s.add(question), s.add(upload)
    assert s.admit() == [upload] and list(s.waiting) == [question]
    ready["live"] = True
    assert s.admit() == [question] and question.stage is Stage.PREFILLING and s.encoding == [upload]
    assert s.prefill_tokens(question) == 12 and s.remaining_work(question) == 12
