"""`ReplicatedEngine`: the engine interface the UI uses, served by engine replicas on Ray Serve.

    engine = ReplicatedEngine(EngineConfig(model=..., device="cuda"), replicas=4)   # or RAY_ADDRESS=...
    stream = engine.submit(video="clip.mp4", question="What happens?")   # an engine.stream.Stream
    ...
    engine.shutdown()

`submit` checks the request as `Engine.submit` does (the same InputError / BusyError sentences), returns
a real `engine.stream.Stream` at once, and a background event loop feeds it from the deployment handle's
streaming response. Cancelling the stream cancels the call, which cancels the request on its replica.
Read-only properties (`model_info`, `default_frame_sampling`, ...) are fetched once from a replica.

When a replica dies mid-answer, or sends nothing for the progress deadline (a stopped or hung process),
its requests end with REPLICA_LOST (a BusyError: the UI shows it, the OpenAI route answers 429, a retry is
right); a call that fails before its replica said hello never started there, and is sent once more to a live
replica. Cancelling a stream reaches its call at once (replicas/calls.py), whatever the message rate.
"""

import asyncio
import contextlib
import itertools
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import ray
from ray import serve

from engine.config import EngineConfig, FrameSampling, FrameSamplingLimits, GenerationParams
from engine.errors import (
    QUEUE_FULL,
    RESTARTING,
    SERVER_FAULT,
    SHUTTING_DOWN,
    BusyError,
    InputError,
)
from engine.front.checks import check_request, media_paths
from engine.front.metrics import Metrics
from engine.front.shares import ClientShare, ClientShares
from engine.memory.plan import Plan
from engine.stream import Stream

from .calls import REPLICA_LOST, Placement, ReplicaLost, end_cancelled, fail_unfinished, read_call
from .cluster import ReplicasUnavailable, connect, deploy
from .deployment import DEPLOYMENT_NAME, engine_app
from .live import LiveCalls
from .routing import DEFAULT_SPILL_AFTER, media_key
from .videos import VideoSender

log = logging.getLogger(__name__)

# Replicas route a call by its one upload's digest; several in one question are served by a single engine.
DEFAULT_APP_NAME = "evs"
# A call with no message for this long (seconds) is on a replica that stopped: its requests end with
# REPLICA_LOST. Replicas send ALIVE every 2 s while their engine works, so it need only outlast the longest
# single engine iteration (a prefill); --replica-deadline-s / EVS_REPLICA_DEADLINE_S.
DEFAULT_DEADLINE_S = 20.0
# Bytes of shipped videos kept in the object store for follow-up questions (when videos go as bytes).
SHIPPED_VIDEO_CACHE_BYTES = 2 << 30


@dataclass
class _Job:
    """One submitted request until its call is made."""

    stream: Stream
    media: tuple[str, ...]  # the uploads' paths, in the prompt's order
    question: str
    params: GenerationParams
    history: list[tuple[str, str]]


class ReplicatedEngine(LiveCalls):
    """`replicas` copies of `Engine(config)` behind Ray Serve, used like one Engine.

    address: a Ray cluster to join (None: RAY_ADDRESS when set, else a new local cluster of this
    machine). ship_bytes: send videos through the object store instead of by path; None: by path only on
    a one-node cluster reached without an address (this machine's), else as bytes, since a path here may
    not exist on the replica's node.
    cpus_per_replica: each CPU replica's share (None: the cluster's CPUs divided evenly); ignored on
    GPUs, where each replica takes one. spill_after: ongoing requests on a video's home replica past
    which another takes it (replicas/routing.py). num_cpus: the local cluster's CPUs (None: all).
    quiet: keep the replicas' logs out of this process's output (tests, benchmarks). warm_up_clip: a
    video each replica answers once before it takes requests (app.py's built-in clip). app_name: the
    Serve application's name; one ReplicatedEngine per name in a cluster (a second would replace it).
    Raises ReplicasUnavailable when the replicas do not start; nothing is left running then.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        replicas: int = 2,
        *,
        address: str | None = None,
        ship_bytes: bool | None = None,
        cpus_per_replica: float | None = None,
        spill_after: int = DEFAULT_SPILL_AFTER,
        num_cpus: int | None = None,
        quiet: bool = False,
        warm_up_clip: str | Path | None = None,
        app_name: str = DEFAULT_APP_NAME,
        deadline_s: float = DEFAULT_DEADLINE_S,
    ):
        if not isinstance(replicas, int) or replicas < 1:
            raise ValueError(f"replicas must be a whole number of at least 1, not {replicas!r}")
        if not deadline_s > 0:
            raise ValueError(f"deadline_s must be above 0, not {deadline_s!r}")
        self.config = config or EngineConfig()
        self.replica_count = replicas
        self.app_name = app_name
        self.deadline_s = float(deadline_s)
        self._deployed = False  # this object deployed its Serve app (and removes it)
        address = address or os.environ.get("RAY_ADDRESS") or None
        self._connected = not ray.is_initialized()  # this object connected to Ray (and disconnects)
        if self._connected:
            connect(address, num_cpus, quiet)  # ReplicasUnavailable: nothing was started
        # A cluster this object started is this app's alone: shutdown stops Serve and Ray with it.
        self._own_cluster = self._connected and address is None
        try:
            self._start(address, ship_bytes, cpus_per_replica, spill_after, warm_up_clip)
        except BaseException:
            self._stop_serving()  # nothing left running after a failed start
            raise
        self._ids = itertools.count(1)
        self._admission = threading.BoundedSemaphore(self.config.max_queue * replicas)
        self._shares = ClientShares(self.config.max_client_requests)
        self._lock = threading.Lock()
        self._closed = False
        self._held: list[_Job] | None = None  # jobs submitted inside paused(), sent on its exit
        self._open: dict[asyncio.Task, int] = {}  # calls under way -> their requests
        self._placements: OrderedDict[int, Placement] = OrderedDict()  # request id -> where, recent ones
        self._live_turn = itertools.count()  # which replica the next live session is offered to first
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="evs-replica-calls", daemon=True)
        self._thread.start()
        # Counted here, where this client's streams end: every request it hands out, whichever replica
        # answers it. Queue depth and GPU memory are each replica's own and are not gathered.
        self.metrics = Metrics(running=lambda: self.running_requests)

    def _start(
        self,
        address: str | None,
        ship_bytes: bool | None,
        cpus_per_replica: float | None,
        spill_after: int,
        warm_up_clip,
    ) -> None:
        """Deploy the replicas, wait until they answer, and read what every replica shares."""
        replicas = self.replica_count
        local = address is None and len([n for n in ray.nodes() if n["Alive"]]) == 1
        gpus = self._use_gpus()
        if not gpus:
            cpus_per_replica = cpus_per_replica or ray.cluster_resources().get("CPU", 1) / replicas
        serve.start(proxy_location="Disabled")
        app = engine_app(
            self.config,
            replicas,
            gpus=gpus,
            cpus_per_replica=cpus_per_replica or 1,
            spill_after=spill_after,
            deadline_s=self.deadline_s,
            warm_up_clip=warm_up_clip,
        )
        self._deployed = True
        handle = deploy(app, self.app_name, DEPLOYMENT_NAME, replicas)
        self.handle = handle  # unary calls (a live session's); answers stream through _calls
        self._calls = handle.options(stream=True)
        self._about = handle.describe.remote().result()
        self._videos = VideoSender(
            ship_bytes=not local if ship_bytes is None else ship_bytes,
            max_file_bytes=self.config.max_file_bytes,
            cache_bytes=SHIPPED_VIDEO_CACHE_BYTES,
        )

    # --- what the UI reads ------------------------------------------------------------------------
    @property
    def model_info(self) -> dict:
        """The replicas' model_info (they all load the same model), plus `replicas`: how many."""
        return {**self._about["model_info"], "replicas": self.replica_count}

    @property
    def default_frame_sampling(self) -> FrameSampling:
        return self._about["default_frame_sampling"]

    @property
    def frame_sampling_limits(self) -> FrameSamplingLimits:
        return self._about["frame_sampling_limits"]

    @property
    def memory_plan(self) -> Plan:
        """One replica's plan (each replica serves under its own)."""
        return self._about["memory_plan"]

    @property
    def system_prompt(self) -> str:
        return self._about["system_prompt"]

    @property
    def running_requests(self) -> int:
        """Requests submitted through this client and not yet ended, over all replicas."""
        return sum(list(self._open.values()))  # list(): a C-level copy, safe while the loop adds calls

    @property
    def ship_bytes(self) -> bool:
        """Whether videos travel as bytes through the object store (else by path)."""
        return self._videos.ship_bytes

    @ship_bytes.setter
    def ship_bytes(self, value: bool) -> None:
        self._videos.ship_bytes = bool(value)

    def replicas(self) -> list[str]:
        """The ids of the replica actors alive now, sorted (the names the router hashes over)."""
        # Serve names each replica's actor SERVE_REPLICA::<app>#<deployment>#<replica id>.
        prefix = f"SERVE_REPLICA::{self.app_name}#{DEPLOYMENT_NAME}#"
        names = ray.util.list_named_actors(all_namespaces=True)
        return sorted(n["name"][len(prefix) :] for n in names if n["name"].startswith(prefix))

    def placement(self, request_id: int) -> Placement | None:
        """Where the request is answered, once its replica has started on it (recent requests only)."""
        return self._placements.get(request_id)

    # --- requests ---------------------------------------------------------------------------------
    def submit(
        self,
        video: str | Path | None = None,
        question: str | None = None,
        params: GenerationParams | None = None,
        history: list[tuple[str, str]] | tuple = (),
        media: Sequence[str | Path] | None = None,
        client: str | None = None,
    ) -> Stream:
        """Engine.submit's contract: returns at once; InputError / BusyError for what is wrong now (the client's
        share counted here, over every replica), everything about the video itself through the stream.

        The checks here are Engine.submit's that need only the config (the same sentences, at once);
        the ones that need the model's tokenizer (question and history length in tokens) run on the
        replica, and their InputError arrives through the stream.
        """
        paths, params, history, share = self._admit(video, question, params, history, media, client)

        def ended(stream: Stream) -> None:
            share.release()
            self.metrics.ended(stream)

        try:
            with self._lock:
                stream = Stream(next(self._ids), on_end=ended)
                job = _Job(stream, tuple(str(path) for path in paths), question.strip(), params, history)
                if self._held is not None:
                    self._held.append(job)
                    return job.stream
        except BaseException:  # no job holds the slot and the share taken for it: they go back
            self._admission.release()
            share.release()
            raise
        self._send([job])
        return job.stream

    def _admit(
        self, video, question: str, params: GenerationParams | None, history, media=None, client: str | None = None
    ) -> tuple[list, GenerationParams, list, ClientShare]:
        """(upload paths, params, history, the client's share) of a request checked as Engine.submit checks it, with
        an admission slot and a place in the client's share taken; the refusal counted and raised otherwise."""
        try:
            params = params or GenerationParams()
            paths = media_paths(video, media)
            history = check_request(
                paths, question, params, history, self.config, self.frame_sampling_limits, self.model_info["max_media"]
            )
            with self._lock:
                if self._closed:
                    raise BusyError(RESTARTING)
                share = self._shares.take(client)
                if not self._admission.acquire(blocking=False):
                    share.release()
                    raise BusyError(QUEUE_FULL)
        except (InputError, BusyError) as error:
            self.metrics.refused(error)
            raise
        return paths, params, history, share

    @contextlib.contextmanager
    def paused(self, timeout_s: float = 120.0):
        """Engine.paused's contract: requests submitted inside the block start together. Here they are
        sent on exit, one call per video (or list of media), so each video's requests reach its replica as one
        burst that replica serves with one read of the video and one ViT forward; a burst larger than one replica's
        queue (max_queue: overlapping pauses add up) goes as several calls, which the router places where
        there is room. (timeout_s is accepted for the same signature; nothing here waits.)"""
        with self._lock:
            outer = self._held is not None
            if not outer:
                self._held = []
        try:
            yield self
        finally:
            if not outer:
                with self._lock:
                    held, self._held = self._held, None
                by_media: dict[tuple[str, ...], list[_Job]] = {}
                for job in held:
                    by_media.setdefault(job.media, []).append(job)
                most = self.config.max_queue
                for jobs in by_media.values():
                    for start in range(0, len(jobs), most):
                        self._send(jobs[start : start + most])

    def _send(self, jobs: list[_Job]) -> None:
        """Start the call for `jobs`; their slots go back when it ends (_serve), or at once when it cannot start
        (the client's loop has stopped), their streams failed."""
        serving = self._serve(jobs)
        try:
            asyncio.run_coroutine_threadsafe(serving, self._loop)
        except Exception:
            log.exception("sending %d requests failed", len(jobs))
            serving.close()
            for job in jobs:
                self._admission.release()
                job.stream.fail(BusyError(RESTARTING))
            return

    async def _serve(self, jobs: list[_Job]) -> None:
        """Make the call for `jobs` (about the same media: each upload goes by path or as bytes, the call routed by
        their media_key) and feed their streams until each has ended; then give back their
        queue slots, just before running_requests stops counting them."""
        task = asyncio.current_task()
        self._open[task] = len(jobs)
        streams = [job.stream for job in jobs]
        try:
            try:
                media = []
                for path in jobs[0].media:
                    digest = await asyncio.to_thread(self._videos.digest, path)
                    media.append({"digest": digest, **await asyncio.to_thread(self._videos.payload, path, digest)})
            except InputError as error:
                fail_unfinished(streams, error)
                return
            requests = [{"question": j.question, "params": j.params, "history": j.history} for j in jobs]
            key = media_key([medium["digest"] for medium in media])
            for _attempt in range(2):
                response = self._calls.answer.remote(digest=key, media=media, requests=requests)
                started = await read_call(response, streams, self.deadline_s, self._placed(streams))
                if started or all(s.finished or s.cancelled for s in streams):
                    break
                log.warning("a replica died before starting a call; sending it again")
            else:
                fail_unfinished(streams, ReplicaLost(REPLICA_LOST))
        except asyncio.CancelledError:  # shutdown
            fail_unfinished(streams, RuntimeError(SHUTTING_DOWN))
            raise
        except Exception:  # a bug here: the streams still end, with a sentence
            log.exception("serving a call failed")
            fail_unfinished(streams, RuntimeError(SERVER_FAULT))
        finally:
            for _ in jobs:  # before the call stops counting: whoever sees it gone finds its slots free
                self._admission.release()
            self._open.pop(task, None)
            end_cancelled(streams)

    def _placed(self, streams: list[Stream]):
        """What read_call tells once the call's replica said hello: where these streams are answered."""

        def remember(placement: Placement) -> None:
            for stream in streams:
                self._placements[stream.request_id] = placement
            while len(self._placements) > 4096:
                self._placements.popitem(last=False)

        return remember

    # --- the end ----------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop taking requests, cancel the ones in flight, remove the replicas, and stop Ray if this
        object started it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            asyncio.run_coroutine_threadsafe(self._cancel_calls(), self._loop).result(timeout=30)
        except Exception:
            log.warning("calls still under way at shutdown did not end in time")
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._stop_serving()

    async def _cancel_calls(self) -> None:
        tasks = list(self._open)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=20)

    def _stop_serving(self) -> None:
        try:
            if self._own_cluster:
                serve.shutdown()
            elif self._deployed:  # a shared cluster: remove only this app
                serve.delete(self.app_name)
        finally:
            if self._connected:
                ray.shutdown()

    def _use_gpus(self) -> bool:
        """One GPU per replica when the config asks for CUDA, or says auto and the cluster has GPUs.
        Raises ReplicasUnavailable (one sentence) when it asks for more GPUs than the cluster has."""
        gpus = int(ray.cluster_resources().get("GPU", 0))
        device = self.config.device
        if device == "cpu" or (device == "auto" and gpus == 0):
            return False
        if gpus < self.replica_count:
            raise ReplicasUnavailable(
                f"{self.replica_count} replicas need {self.replica_count} GPUs, one each; the Ray cluster has {gpus}."
            )
        return True

    def __enter__(self) -> "ReplicatedEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
