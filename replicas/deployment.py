"""The Ray Serve deployment: one Engine per replica, every event streamed back as plain data.

Each replica is a Ray actor holding one `engine.Engine` (one GPU each on GPUs, a share of the CPUs on a
CPU). `answer` is a streaming method: the client iterates it through a deployment handle, and the
replica's engine streams are read with `aevents()` on the replica's event loop, so a waiting request
holds no thread. Messages are those of replicas/wire.py.
"""

import asyncio
import contextlib
import dataclasses
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import ray
import torch
from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.schema import LoggingConfig

from engine import Engine, EngineConfig, InputError, LiveSession, Watch
from engine.errors import LIVE_SESSION_LOST, SessionLost
from engine.front.door import cancel_unfinished, merged, request_params
from engine.stream import Stream

from .router import VideoAffinityRouter
from .videos import VideoFiles
from .wire import ALIVE, HELLO, error_to_wire, event_to_wire

log = logging.getLogger(__name__)

DEPLOYMENT_NAME = "EngineReplica"
# Serve asks each replica's check_health this often (seconds), and takes a check not answered within the
# timeout as failed; three failures in a row (Serve's own threshold) and the replica is replaced, its calls
# ending with the client's "ask again" sentence. check_health answers at once unless the engine is past
# repair, so a stopped or hung process is found in about 3 x (period + timeout) = 21 s, and a stalled engine
# worker (a hung device) about 3 periods after its stall passes the progress deadline.
HEALTH_CHECK_PERIOD_S = 2.0
HEALTH_CHECK_TIMEOUT_S = 5.0
# Without another message for this long (seconds), a call sends ALIVE, while the engine's worker turns: the
# client's progress deadline (replicas/client.py) then measures a replica that stopped, not a long wait.
TICK_S = 2.0
WARM_UP_QUESTION = "Which way does the shape move?"
WARM_UP_NEW_TOKENS = 8
WARM_UP_TIMEOUT_S = 600.0
# A model that does not load (missing, too large for the GPU) will not load on a retry either.
CONSTRUCTOR_RETRIES = 2
# Serve waits this long (seconds) for a stopping replica's calls to end. The client cancels its calls
# before it removes the replicas, so there is nothing to wait for then; Serve's default is 20 s.
GRACEFUL_SHUTDOWN_TIMEOUT_S = 5.0


class EngineReplica:
    """One replica: the engine, and where its shipped videos are written.

    cpu_threads: torch's intra-op threads here (the replica's CPU share); None leaves torch's default.
    warm_up_clip: a video answered once before Serve sends this replica any request, so that no user
    pays its cold start, a replacement replica's included (skipped where the file is not on this node).
    deadline_s: the progress deadline: an engine worker that has not turned for this long fails the health check.
    """

    def __init__(
        self,
        config: EngineConfig,
        cpu_threads: int | None = None,
        warm_up_clip: str | None = None,
        deadline_s: float = 20.0,
    ):
        if cpu_threads:
            torch.set_num_threads(cpu_threads)
        self.engine = Engine(config)
        self.deadline_s = deadline_s
        device = self.engine.loaded.device
        # Probed on a stream of its own: on the worker's it would wait behind a long prefill's kernels.
        self._probe_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        if warm_up_clip and Path(warm_up_clip).is_file():
            # A replica that cannot answer this cannot answer users: failing here fails the start.
            params = request_params(self.engine, max_new_tokens=WARM_UP_NEW_TOKENS)
            self.engine.submit(warm_up_clip, WARM_UP_QUESTION, params).result(WARM_UP_TIMEOUT_S)
        self.name = serve.get_replica_context().replica_tag
        self.pid = os.getpid()
        self.node = ray.get_runtime_context().get_node_id()
        self.files = VideoFiles()
        self.live: dict[str, LiveSession] = {}  # the live sessions this replica holds, by "<replica>/<id>"
        self.watches: dict[tuple[str, int], Watch] = {}  # their watches, by (session, watch id)

    def describe(self) -> dict:
        """What the client's `model_info`, `default_frame_sampling` and the other read-only properties return."""
        engine = self.engine
        return {
            "model_info": engine.model_info,
            "default_frame_sampling": engine.default_frame_sampling,
            "frame_sampling_limits": engine.frame_sampling_limits,
            "memory_plan": engine.memory_plan,
            "system_prompt": engine.system_prompt,
            "replica": self.name,
            "pid": self.pid,
            "node": self.node,
        }

    def check_health(self) -> None:
        """Serve's health check: raising makes Serve replace this replica. The engine's worker keeps
        serving after a failed iteration, so a dead worker thread, a worker that has not turned within the
        progress deadline (a hung device), or a device that no longer runs a one-element kernel (a sticky
        CUDA error fails every later iteration) is past repair here."""
        if not self.engine.healthy:
            raise RuntimeError("the engine's worker thread has stopped")
        if (stalled_s := self.engine.stalled_s) > self.deadline_s:
            raise RuntimeError(f"the engine's worker has not moved for {stalled_s:.0f} s")
        if self._probe_stream is not None:
            with torch.cuda.stream(self._probe_stream):
                probe = torch.ones(1, device=self.engine.loaded.device) + 1
                self._probe_stream.synchronize()
                if probe.item() != 2:
                    raise RuntimeError("the GPU returned a wrong result")

    def _turning(self) -> bool:
        """Whether the engine's worker has turned within the last tick: what ALIVE vouches for."""
        return self.engine.stalled_s < TICK_S

    async def answer(self, digest: str, media: list[dict], requests: list[dict]):
        """Stream the answers to `requests` (each {"question", "params", "history"}) about the same uploads.

        digest: the router's key (replicas/routing.py media_key); media: one dict per upload, in the prompt's
        order, {"digest", "path"} or {"digest", "ref", "suffix"} (replicas/videos.py). Several requests are
        submitted inside `Engine.paused()`, so they share one read of each upload and one ViT forward, as a local
        engine's burst does. ALIVE between messages.
        """
        async for message in ticking(self._answer(media, requests), self._turning, TICK_S):
            yield message

    async def _answer(self, media: list[dict], requests: list[dict]):
        yield {"kind": HELLO, "replica": self.name, "pid": self.pid, "node": self.node}
        streams: dict[int, Stream] = {}
        failed: list[tuple[int, BaseException]] = []
        submitting = None
        for medium in media:
            self.files.hold(medium["digest"], medium)
        try:
            paths = [await self.files.acquire(medium["digest"], medium) for medium in media]
            submitting = asyncio.ensure_future(asyncio.to_thread(self._submit, paths, requests, streams, failed))
            # shield: a cancelled call must not abandon the thread's later submissions (see finally)
            await asyncio.shield(submitting)
            for index, error in failed:
                yield error_to_wire(index, error)
            async with contextlib.aclosing(merged(streams)) as events:
                async for index, event, error in events:
                    yield error_to_wire(index, error) if error is not None else event_to_wire(index, event, self.name)
        finally:
            cancel_unfinished(streams)
            if submitting is not None and not submitting.done():
                submitting.add_done_callback(lambda _: cancel_unfinished(streams))
            for medium in media:
                self.files.release(medium["digest"], medium)

    # --- live sessions (docs/live.md, "Past one GPU"): every call names its session, which the router pins here
    def open_live(self, session: str, params) -> dict:
        """Open a live session here (session: "<this replica>/", which pinned the call here): {"session":
        "<replica>/<id>", "replica", "pid", "node"}, or an error message."""
        try:
            if session.split("/")[0] != self.name:  # meant for a replica that is gone: the client tries another
                raise SessionLost(LIVE_SESSION_LOST)
            opened = self.engine.open_live(params)
        except Exception as error:  # InputError / BusyError: their sentence to the client
            return error_to_wire(0, error)
        key = f"{self.name}/{opened.id}"
        self.live[key] = opened
        return {"session": key, "replica": self.name, "pid": self.pid, "node": self.node}

    async def live_push(self, session: str, frame, t_s: float) -> dict | None:
        """LiveSession.push on the session's thread pool (the HF processor runs there); None, or an error."""
        return await self._on_session(session, lambda live: live.push(frame, t_s))

    async def live_stats(self, session: str) -> dict:
        """{"stats": LiveSession.stats()}, or an error."""
        return await self._on_session(session, lambda live: {"stats": live.stats()})

    async def live_recent(self, session: str) -> dict:
        """{"picture": LiveSession.recent_picture()} (an EvsPicture or None), or an error."""
        return await self._on_session(session, lambda live: {"picture": live.recent_picture()})

    async def live_wait(self, session: str, timeout_s: float | None) -> dict:
        """{"caught_up": LiveSession.wait(timeout_s)}, or an error."""
        return await self._on_session(session, lambda live: {"caught_up": live.wait(timeout_s)})

    async def live_close(self, session: str) -> None:
        """Close the session (its state is freed at the engine's next step, its watches end); nothing when it is
        not here."""
        live = self.live.pop(session, None)
        if live is not None:
            live.close()
        self.watches = {key: watch for key, watch in self.watches.items() if key[0] != session}

    async def live_watch(self, session: str, question: str, params) -> dict:
        """LiveSession.watch: {"watch": its id}, or an error."""

        def watch(live: LiveSession) -> dict:
            opened = live.watch(question, params)
            self.watches = {key: w for key, w in self.watches.items() if not w.ended}
            self.watches[session, opened.id] = opened
            return {"watch": opened.id}

        return await self._on_session(session, watch)

    async def live_watch_events(self, session: str, watch: int, seen: int, timeout_s: float) -> dict:
        """Watch.events_after(seen, timeout_s) of one of the session's watches, with its stats: {"events",
        "total", "stats"}, or an error."""

        def events(_live: LiveSession) -> dict:
            held = self._watch(session, watch)
            new, total = held.events_after(seen, timeout_s)
            return {"events": new, "total": total, "stats": held.stats()}

        return await self._on_session(session, events)

    async def live_unwatch(self, session: str, watch: int) -> dict | None:
        """Watch.close of one of the session's watches; an error when it has none of that id open."""
        return await self._on_session(session, lambda _live: self._watch(session, watch, open_only=True).close())

    def _watch(self, session: str, watch: int, open_only: bool = False) -> Watch:
        held = self.watches.get((session, watch))
        if held is None or (open_only and held.ended):
            raise InputError(f"This live session has no open watch {watch}.")
        return held

    async def _on_session(self, session: str, call):
        """call(LiveSession) in a thread, its result returned; an error (the session's sentence, or SessionLost
        where this replica does not hold it: a replacement, or the call came after its holder died) as a
        message."""
        try:
            live = self.live.get(session)
            if live is None:
                raise SessionLost(LIVE_SESSION_LOST)
            return await asyncio.to_thread(call, live)
        except Exception as error:
            return error_to_wire(0, error)

    async def live_ask(self, session: str, question: str, history: list, params):
        """LiveSession.ask, streamed as `answer` streams an upload's request (index 0), ALIVE between messages."""
        async for message in ticking(self._live_ask(session, question, history, params), self._turning, TICK_S):
            yield message

    async def _live_ask(self, session: str, question: str, history: list, params):
        yield {"kind": HELLO, "replica": self.name, "pid": self.pid, "node": self.node}
        streams: dict[int, Stream] = {}
        try:
            live = self.live.get(session)
            if live is None:
                raise SessionLost(LIVE_SESSION_LOST)
            streams[0] = await asyncio.to_thread(live.ask, question, history, params)
        except Exception as error:
            yield error_to_wire(0, error)
            return
        try:
            async with contextlib.aclosing(merged(streams)) as events:
                async for index, event, error in events:
                    yield error_to_wire(index, error) if error is not None else event_to_wire(index, event, self.name)
        finally:
            cancel_unfinished(streams)

    def _submit(self, paths: list[str], requests: list[dict], streams: dict, failed: list) -> None:
        """Submit every request (under paused() when there are several), filling `streams` as it goes;
        a request the engine refuses (InputError, BusyError) goes to `failed`. Blocks: run in a thread."""

        def submit_all():
            for index, request in enumerate(requests):
                try:
                    streams[index] = self.engine.submit(
                        question=request["question"], params=request["params"], history=request["history"], media=paths
                    )
                except Exception as error:  # InputError / BusyError carry their sentence to the client
                    failed.append((index, error))

        if len(requests) == 1:
            submit_all()
            return
        with _burst_lock, self.engine.paused():
            submit_all()

    def __del__(self):
        files = getattr(self, "files", None)
        if files is not None:
            files.close()


# Two bursts at once would end each other's pause early and split into several ViT forwards.
_burst_lock = threading.Lock()


async def ticking(messages: AsyncIterator[dict], alive: Callable[[], bool], period_s: float) -> AsyncIterator[dict]:
    """`messages` as they come, and {"kind": ALIVE} after every `period_s` without one, when alive(). Closing this
    closes `messages` (a cancelled call cancels its requests there)."""
    pending = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(messages.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=period_s)
            if not done:
                if alive():
                    yield {"kind": ALIVE}
                continue
            finished, pending = pending, None
            try:
                message = finished.result()
            except StopAsyncIteration:
                return
            yield message
    finally:
        if pending is not None and not pending.done():
            pending.cancel()  # raises CancelledError inside `messages`, whose finally cancels its requests
            with contextlib.suppress(BaseException):
                await pending
        await messages.aclose()


def engine_app(
    config: EngineConfig,
    replicas: int,
    *,
    gpus: bool,
    cpus_per_replica: float,
    spill_after: int,
    deadline_s: float,
    warm_up_clip: str | None = None,
):
    """The bound Serve application: `replicas` engines, one GPU each when `gpus`, else
    `cpus_per_replica` CPUs each (torch then runs that many threads, at least one), routed by video and the
    requests each has under way (at most the config's max_queue each); each answers `warm_up_clip` once before
    it takes requests, and fails its health check when its worker stalls past `deadline_s`. Unless the config
    sets video_readers, each replica reads videos with its share of the cores."""
    actor_options = {"num_gpus": 1} if gpus else {"num_cpus": cpus_per_replica}
    cpu_threads = None if gpus else max(1, int(cpus_per_replica))
    if config.video_readers is None:
        # Each replica's reader pool takes its share of the host's cores, not all of them: replicas x cores
        # reader processes would only contend for the same cores.
        share = cpu_threads or (os.cpu_count() or 1) // replicas
        config = dataclasses.replace(config, video_readers=max(1, share))
    deployment = serve.deployment(EngineReplica).options(
        name=DEPLOYMENT_NAME,
        num_replicas=replicas,
        ray_actor_options=actor_options,
        # Serve counts calls until their streams end; a call holds one request or a burst, and the router
        # counts those against max_queue (replicas/router.py), so Serve's count never binds first.
        max_ongoing_requests=config.max_queue,
        health_check_period_s=HEALTH_CHECK_PERIOD_S,
        health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S,
        max_constructor_retry_count=CONSTRUCTOR_RETRIES,
        graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_TIMEOUT_S,
        graceful_shutdown_wait_loop_s=0.5,
        request_router_config=RequestRouterConfig(
            request_router_class=VideoAffinityRouter,
            request_router_kwargs={"spill_after": spill_after, "capacity": config.max_queue},
        ),
        logging_config=LoggingConfig(enable_access_log=False),
    )
    return deployment.bind(config, cpu_threads, None if warm_up_clip is None else str(warm_up_clip), deadline_s)
