"""Server-wide numbers in Prometheus form, for `GET /metrics`.

Each engine (and each ReplicatedEngine) holds its own registry, not prometheus_client's global one, so
several engines in one process (tests, benchmarks) count apart. A request is counted once, where its
stream ends (`Stream.on_end`), a refused submit where `submit` raises (the same two places for the single
engine and for the replicated client, which therefore counts every request it hands out without asking its
replicas), and a request a route refuses before the engine sees it (its body or message) by that route, as
refused at the front door: so the outcomes add up to the requests received. Live sessions are counted apart
from questions (`evs_live_sessions_total`).
"""

import contextlib
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine.errors import BusyError, InputError
from engine.stream import Stream

OUTCOMES = ("answered", "refused", "cancelled", "failed")
# Where a refusal was decided: the front door (a route's own checks of the body or message, before the engine
# sees it) or the engine (submit, a live question, or the upload's read, through the stream); and why: the
# caller's mistake (bad_input) or a full server (busy: the queue, the live sessions, a restart).
REFUSED_WHERE = ("front_door", "engine")
REFUSED_REASONS = ("bad_input", "busy")
# How a live session's ask to open ended (opened or refused), and how an opened one ended: closed by its user, or
# lost (ended by the server: a fault, the shutdown, its replica gone).
LIVE_EVENTS = ("opened", "refused", "closed", "lost")
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
        self.refusals = Counter(
            "evs_refusals",
            "Refused requests by where and why (they add up to outcome=refused)",
            ["where", "reason"],
            registry=r,
        )
        for where in REFUSED_WHERE:
            for reason in REFUSED_REASONS:
                self.refusals.labels(where, reason)
        self.live_sessions = Counter(
            "evs_live_sessions",
            "Live sessions asked for (opened, refused) and how opened ones ended",
            ["event"],
            registry=r,
        )
        for event in LIVE_EVENTS:
            self.live_sessions.labels(event)
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

    def refused(self, error: BaseException | None = None, where: str = "engine", busy: bool | None = None) -> None:
        """A request refused before a stream was made: submit (or a live question) raised `error`, an InputError
        or BusyError (where "engine"), or a route refused the body or message (where "front_door"; busy: whether
        it was for a full server, else read from `error`). An error is counted once: a route that passes on an
        error the engine raised (and counted) does not count it again."""
        if error is not None:
            if getattr(error, "counted_refusal", False):
                return
            error.counted_refusal = True
        if not self._counting:
            return
        busy = isinstance(error, BusyError) if busy is None else busy
        self.requests.labels("refused").inc()
        self.refusals.labels(where, "busy" if busy else "bad_input").inc()

    def failed(self) -> None:
        """A route failed on a request before the engine took it (a server fault: the caller read SERVER_FAULT)."""
        if self._counting:
            self.requests.labels("failed").inc()

    def live_session(self, event: str) -> None:
        """A live session asked for was opened or refused, or an opened one was closed or lost (LIVE_EVENTS)."""
        if self._counting:
            self.live_sessions.labels(event).inc()

    def ended(self, stream: Stream) -> None:
        """The stream is ending (done or error): count it by outcome, and what it measured."""
        if not self._counting:
            return
        error = stream.error
        if error is not None:
            # As at submit: what the user is asked to fix (a bad video) or to retry (a replica's full queue,
            # or a replica lost, which is a BusyError too) is refused; anything else is the server's fault.
            if isinstance(error, (InputError, BusyError)):
                error.counted_refusal = True  # a route that passes the stream's error on does not count it again
                self.requests.labels("refused").inc()
                self.refusals.labels("engine", "busy" if isinstance(error, BusyError) else "bad_input").inc()
            else:
                self.requests.labels("failed").inc()
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
