"""Server-wide numbers in Prometheus form, for `GET /metrics`.

Each engine (and each ReplicatedEngine) holds its own registry, not prometheus_client's global one, so
several engines in one process (tests, benchmarks) count apart. A request is counted once, where its
stream ends (`Stream.on_end`), and a refused submit where `submit` raises: the same two places for
the single engine and for the replicated client, which therefore counts every request it hands out
without asking its replicas.
"""

import contextlib
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine.errors import BusyError, InputError
from engine.stream import Stream

OUTCOMES = ("answered", "refused", "cancelled", "failed")
# Seconds: a tiny model on CPU answers in tenths, a long video on a GPU in tens.
TIME_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)


class Metrics:
    """queued, running: read at scrape time (None: not known here, the gauge is left out).
    gpu_bytes: GPU memory in use, where this process holds a GPU."""

    def __init__(
        self,
        running: Callable[[], int],
        queued: Callable[[], int] | None = None,
        gpu_bytes: Callable[[], int] | None = None,
    ):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("evs_requests", "Requests by how they ended", ["outcome"], registry=r)
        for outcome in OUTCOMES:  # every outcome shows from the first scrape, at 0
            self.requests.labels(outcome)
        Gauge(
            "evs_running_requests",
            "Requests decoding (one engine), or sent to a replica and not ended (replicas)",
            registry=r,
        ).set_function(running)
        if queued is not None:
            Gauge("evs_queue_depth", "Requests submitted and not yet taken by the worker", registry=r).set_function(
                queued
            )
        if gpu_bytes is not None:
            Gauge("evs_gpu_memory_bytes", "GPU memory allocated by this process", registry=r).set_function(gpu_bytes)
        self.ttft = Histogram("evs_ttft_seconds", "Submit to first generated token", buckets=TIME_BUCKETS, registry=r)
        self.total = Histogram(
            "evs_answer_seconds", "Submit to the end of an answered request", buckets=TIME_BUCKETS, registry=r
        )
        self.video_tokens = Counter(
            "evs_video_tokens", "Video tokens before EVS (in) and after it (kept)", ["stage"], registry=r
        )
        self.feature_cache = Counter(
            "evs_feature_cache_lookups", "Vision feature cache lookups", ["result"], registry=r
        )
        self.prefix_cache = Counter("evs_prefix_cache_lookups", "Prefix KV cache lookups", ["result"], registry=r)
        self.vit_batch = Histogram(
            "evs_vit_batch_requests", "Requests sharing one vision forward", buckets=BATCH_BUCKETS, registry=r
        )
        self._counting = True

    @contextlib.contextmanager
    def uncounted(self):
        """Requests refused or ending inside the block are not counted: the start's warm-up request, before the
        server takes any user's (so no user's request can end inside it), is nobody's."""
        self._counting = False
        try:
            yield
        finally:
            self._counting = True

    def refused(self) -> None:
        """submit raised InputError or BusyError: no stream was made."""
        if self._counting:
            self.requests.labels("refused").inc()

    def ended(self, stream: Stream) -> None:
        """The stream is ending (done or error): count it by outcome, and what it measured."""
        if not self._counting:
            return
        error = stream.error
        if error is not None:
            # As at submit: what the user is asked to fix (a bad video) or to retry (a replica's full queue,
            # or a replica lost, which is a BusyError too) is refused; anything else is the server's fault.
            self.requests.labels("refused" if isinstance(error, (InputError, BusyError)) else "failed").inc()
        else:
            answered = not stream.cancelled
            self.requests.labels("answered" if answered else "cancelled").inc()
            if answered and stream.stats.get("total_s") is not None:
                self.total.observe(stream.stats["total_s"])
        self._observe(stream.stats or {})

    def _observe(self, stats: dict) -> None:
        """What the request measured before it ended (a cancelled one may have measured some of it)."""
        if stats.get("ttft_s") is not None:
            self.ttft.observe(stats["ttft_s"])
        if stats.get("video_tokens_kept") is not None:
            self.video_tokens.labels("in").inc(stats["video_tokens_total"])
            self.video_tokens.labels("kept").inc(stats["video_tokens_kept"])
        for cache, key in ((self.feature_cache, "vit_cache_hit"), (self.prefix_cache, "prefix_cache_hit")):
            if stats.get(key) is not None:
                cache.labels("hit" if stats[key] else "miss").inc()
        if stats.get("vit_batch_requests"):  # 0 on a feature cache hit: no forward ran
            self.vit_batch.observe(stats["vit_batch_requests"])

    def exposition(self) -> tuple[bytes, str]:
        """(body, content type) of a scrape in Prometheus' text format."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
