"""`ReplicatedEngine`: the engine interface the UI uses, served by engine replicas on Ray Serve.

    engine = ReplicatedEngine(EngineConfig(model=..., device="cuda"), replicas=4)   # or RAY_ADDRESS=...
    stream = engine.submit(video="clip.mp4", question="What happens?")   # an engine.stream.Stream
    ...
    engine.shutdown()

`submit` checks the request as `Engine.submit` does (the same InputError / BusyError sentences), returns
a real `engine.stream.Stream` at once, and a background event loop feeds it from the deployment handle's
streaming response. Cancelling the stream cancels the call, which cancels the request on its replica.
Read-only properties (`model_info`, `default_frame_sampling`, ...) are fetched once from a replica.

When a replica dies mid-answer, its requests end with REPLICA_LOST (a BusyError: the UI shows it, the
OpenAI route answers 429, a retry is right); a call that fails before its replica said hello never
started there, and is sent once more to a live replica.
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
from ray.exceptions import RayActorError
from ray.serve.exceptions import RequestCancelledError

from engine.config import EngineConfig, FrameSampling, FrameSamplingLimits, GenerationParams
from engine.errors import (
    LIVE_SESSION_LOST,
    QUEUE_FULL,
    RESTARTING,
    SERVER_FAULT,
    SHUTTING_DOWN,
    BusyError,
    InputError,
    SessionLost,
)
from engine.front.checks import check_live_settings, check_request, media_paths
from engine.front.metrics import Metrics
from engine.memory.plan import Plan
from engine.stats import Stats
from engine.stream import Event, Stream

from .deployment import DEPLOYMENT_NAME, engine_app
from .live import RemoteLiveSession
from .routing import DEFAULT_SPILL_AFTER
from .videos import VideoSender
from .wire import ERROR, HELLO, error_from_wire, event_from_wire

log = logging.getLogger(__name__)

REPLICA_LOST = "The server restarted part of its capacity; please ask again."
# Replicas route a call by its one upload's digest; several in one question are served by a single engine.
SEVERAL_MEDIA = "This server answers about one video or picture at a time; please ask about them one by one."
DEFAULT_APP_NAME = "evs"
REPO_ROOT = Path(__file__).resolve().parent.parent
# How often a waiting call looks at its streams' cancel flags (seconds): Stream.cancel() only sets a
# flag, as the engine's worker reads it each step.
CANCEL_POLL_S = 0.1
# Bytes of shipped videos kept in the object store for follow-up questions (when videos go as bytes).
SHIPPED_VIDEO_CACHE_BYTES = 2 << 30
LIVE_OPEN_TIMEOUT_S = 60.0


class ReplicaLost(BusyError):
    """The replica answering this request died; asking again reaches a live one."""


class ReplicasUnavailable(RuntimeError):
    """The replicas could not be started (too few GPUs, a model that does not load); one sentence."""


@dataclass(frozen=True)
class Placement:
    """Where a request is being answered: the Serve replica id, its process id, its Ray node id."""

    replica: str
    pid: int
    node: str


@dataclass
class _Job:
    """One submitted request until its call is made."""

    stream: Stream
    video: str
    question: str
    params: GenerationParams
    history: list[tuple[str, str]]


class ReplicatedEngine:
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
    ):
        if not isinstance(replicas, int) or replicas < 1:
            raise ValueError(f"replicas must be a whole number of at least 1, not {replicas!r}")
        self.config = config or EngineConfig()
        self.replica_count = replicas
        self.app_name = app_name
        self._deployed = False  # this object deployed its Serve app (and removes it)
        address = address or os.environ.get("RAY_ADDRESS") or None
        self._connected = not ray.is_initialized()  # this object connected to Ray (and disconnects)
        if self._connected:
            ray.init(**_init_options(address, num_cpus, quiet))
        # A cluster this object started is this app's alone: shutdown stops Serve and Ray with it.
        self._own_cluster = self._connected and address is None
        try:
            self._start(address, ship_bytes, cpus_per_replica, spill_after, warm_up_clip)
        except BaseException:
            self._stop_serving()  # nothing left running after a failed start
            raise
        self._ids = itertools.count(1)
        self._admission = threading.BoundedSemaphore(self.config.max_queue * replicas)
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
            warm_up_clip=warm_up_clip,
        )
        self._deployed = True
        try:
            handle = serve.run(app, name=self.app_name, route_prefix=None)
        except Exception as error:
            why = _deploy_failure(self.app_name, error)
            raise ReplicasUnavailable(f"The engine replicas did not start: {why}") from None
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
    ) -> Stream:
        """Engine.submit's contract: returns at once; InputError / BusyError for what is wrong now,
        everything about the video itself through the stream.

        The checks here are Engine.submit's that need only the config (the same sentences, at once);
        the ones that need the model's tokenizer (question and history length in tokens) run on the
        replica, and their InputError arrives through the stream.
        """
        paths, params, history = self._admit(video, question, params, history, media)
        try:
            with self._lock:
                job = _Job(
                    Stream(next(self._ids), on_end=self.metrics.ended), str(paths[0]), question.strip(), params, history
                )
                if self._held is not None:
                    self._held.append(job)
                    return job.stream
        except BaseException:  # no job holds the slot taken for it: it goes back
            self._admission.release()
            raise
        self._send([job])
        return job.stream

    def _admit(
        self, video, question: str, params: GenerationParams | None, history, media=None
    ) -> tuple[list, GenerationParams, list]:
        """(upload paths, params, history) of a request checked as Engine.submit checks it, with an admission slot
        taken; the refusal counted and raised otherwise."""
        try:
            params = params or GenerationParams()
            paths = media_paths(video, media)
            history = check_request(
                paths, question, params, history, self.config, self.frame_sampling_limits, self.model_info["max_media"]
            )
            if len(paths) > 1:
                raise InputError(SEVERAL_MEDIA)
            with self._lock:
                if self._closed:
                    raise BusyError(RESTARTING)
                if not self._admission.acquire(blocking=False):
                    raise BusyError(QUEUE_FULL)
        except (InputError, BusyError) as error:
            self.metrics.refused(error)
            raise
        return paths, params, history

    @contextlib.contextmanager
    def paused(self, timeout_s: float = 120.0):
        """Engine.paused's contract: requests submitted inside the block start together. Here they are
        sent on exit, one call per video, so each video's requests reach its replica as one burst that
        replica serves with one read of the video and one ViT forward. (timeout_s is accepted for the same
        signature; nothing here waits.)"""
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
                by_video: dict[str, list[_Job]] = {}
                for job in held:
                    by_video.setdefault(job.video, []).append(job)
                for jobs in by_video.values():
                    self._send(jobs)

    def _send(self, jobs: list[_Job]) -> None:
        """Start the call for `jobs`; their slots go back when it ends, or at once when it cannot start (the
        client's loop has stopped), their streams failed."""
        serving = self._serve(jobs)
        try:
            future = asyncio.run_coroutine_threadsafe(serving, self._loop)
        except Exception:
            log.exception("sending %d requests failed", len(jobs))
            serving.close()
            for job in jobs:
                self._admission.release()
                job.stream.fail(BusyError(RESTARTING))
            return
        future.add_done_callback(lambda _: [self._admission.release() for _ in jobs])

    async def _serve(self, jobs: list[_Job]) -> None:
        """Make the call for `jobs` (one video) and feed their streams until each has ended."""
        task = asyncio.current_task()
        self._open[task] = len(jobs)
        streams = [job.stream for job in jobs]
        try:
            try:
                digest = await asyncio.to_thread(self._videos.digest, jobs[0].video)
                video = await asyncio.to_thread(self._videos.payload, jobs[0].video, digest)
            except InputError as error:
                _fail_unfinished(streams, error)
                return
            requests = [{"question": j.question, "params": j.params, "history": j.history} for j in jobs]
            for _attempt in range(2):
                response = self._calls.answer.remote(digest=digest, video=video, requests=requests)
                started = await self._call(response, streams)
                if started or all(s.finished or s.cancelled for s in streams):
                    break
                log.warning("a replica died before starting a call; sending it again")
            else:
                _fail_unfinished(streams, ReplicaLost(REPLICA_LOST))
        except asyncio.CancelledError:  # shutdown
            _fail_unfinished(streams, RuntimeError(SHUTTING_DOWN))
            raise
        except Exception:  # a bug here: the streams still end, with a sentence
            log.exception("serving a call failed")
            _fail_unfinished(streams, RuntimeError(SERVER_FAULT))
        finally:
            self._open.pop(task, None)
            _end_cancelled(streams)

    async def _call(self, response, streams: list[Stream]) -> bool:
        """One deployment call (`response`, the streaming handle's answer to it), its messages pushed to
        `streams`. Returns whether a replica started on it (said hello); False only when it failed before that,
        so that sending it again is safe.

        The call's last ending message (done or error) is held until the call has ended on its replica:
        a caller that asks again as soon as its answer is complete then finds that replica's queue
        without it (Ray Serve counts a call against its replica until the replica's generator returns).
        """
        placement = None
        last = None  # (stream, message) of the call's last ending message, until the call ends

        def deliver(stream: Stream, message: dict) -> None:
            if message["kind"] == ERROR:
                stream.fail(error_from_wire(message))
            else:
                stream.push(event_from_wire(message))

        try:
            while True:
                message = await _next_unless_cancelled(response, streams)
                if message is None:
                    break
                if message["kind"] == HELLO:
                    placement = Placement(message["replica"], message["pid"], message["node"])
                    self._remember(streams, placement)
                    continue
                stream = streams[message["index"]]
                ends = message["kind"] in ("done", ERROR)
                if ends and all(other.finished for other in streams if other is not stream):
                    last = (stream, message)
                else:
                    deliver(stream, message)
        except (_Cancelled, asyncio.CancelledError) as cancelled:
            response.cancel()  # the replica's generator is cancelled, and cancels its engine requests
            if isinstance(cancelled, asyncio.CancelledError):
                raise
            return True
        except RequestCancelledError:
            return True
        except RayActorError:
            if placement is None:
                return False
            if last is not None:  # its answer was complete: only the call's end was lost
                deliver(*last)
                last = None
            log.warning("replica %s (pid %d) died with requests in flight", placement.replica, placement.pid)
            _fail_unfinished(streams, ReplicaLost(REPLICA_LOST))
            return True
        finally:
            if last is not None:  # a complete answer (or its error) is delivered whatever ended the call
                deliver(*last)
        # A call that ended without ending a request is a bug on the replica's side.
        _fail_unfinished(streams, RuntimeError(SERVER_FAULT))
        return True

    # --- live sessions (replicas/live.py) --------------------------------------------------------------
    def open_live(self, params: GenerationParams | None = None) -> RemoteLiveSession:
        """Engine.open_live's contract: a session on one replica, which every later call of the session reaches.
        The replicas take turns (each holds its own state and its own max_live_sessions); a replica with all its
        sessions open passes to the next. BusyError when every one is full (or the engine is shutting down),
        InputError for bad settings."""
        params = params or GenerationParams()
        try:
            check_live_settings(params, self.config, self.frame_sampling_limits)
            with self._lock:
                if self._closed:
                    raise BusyError(RESTARTING)
            ids = self.replicas()
            first = next(self._live_turn) % max(1, len(ids))
            full = None
            for replica in ids[first:] + ids[:first]:
                # pinned there by the router, as every later call of the session will be
                reply = self.handle.open_live.remote(session=f"{replica}/", params=params).result(
                    timeout_s=LIVE_OPEN_TIMEOUT_S
                )
                if reply.get("kind") != ERROR:
                    break
                error = error_from_wire(reply)
                if not isinstance(error, BusyError):
                    raise error
                full = full if isinstance(error, SessionLost) else error  # SessionLost: that replica is gone
            else:
                raise full or BusyError(RESTARTING)
        except (InputError, BusyError):
            self.metrics.live_session("refused")
            raise
        self.metrics.live_session("opened")
        return RemoteLiveSession(self, reply["session"], reply["replica"], params, self.config.max_video_source_pixels)

    def ask_live(self, session: str, question: str, history=(), params: GenerationParams | None = None) -> Stream:
        """A question about a live session, streamed from its replica as an upload's answer (LiveSession.ask)."""
        _, params, history = self._admit(f"live session {session}", question, params, history)
        try:
            stream = Stream(next(self._ids), on_end=self.metrics.ended)
            future = asyncio.run_coroutine_threadsafe(
                self._serve_live(session, question.strip(), history, params, stream), self._loop
            )
        except BaseException:  # nothing was sent: the slot taken for it goes back
            self._admission.release()
            raise
        future.add_done_callback(lambda _: self._admission.release())
        return stream

    async def _serve_live(self, session: str, question: str, history, params, stream: Stream) -> None:
        task = asyncio.current_task()
        self._open[task] = 1
        try:
            response = self._calls.live_ask.remote(session=session, question=question, history=history, params=params)
            if not await self._call(response, [stream]):  # failed before its replica said hello: that one is gone
                _fail_unfinished([stream], SessionLost(LIVE_SESSION_LOST))
        except asyncio.CancelledError:  # shutdown
            _fail_unfinished([stream], RuntimeError(SHUTTING_DOWN))
            raise
        except Exception:
            log.exception("a live question failed")
            _fail_unfinished([stream], RuntimeError(SERVER_FAULT))
        finally:
            self._open.pop(task, None)
            _end_cancelled([stream])

    def _remember(self, streams: list[Stream], placement: Placement) -> None:
        for stream in streams:
            self._placements[stream.request_id] = placement
        while len(self._placements) > 4096:
            self._placements.popitem(last=False)

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


class _Cancelled(Exception):
    """Every stream of a call was cancelled by its reader."""


async def _next_unless_cancelled(response, streams: list[Stream]) -> dict | None:
    """The call's next message (None at its end); raises _Cancelled once every unfinished stream
    has been cancelled by its reader."""
    pending = asyncio.ensure_future(response.__anext__())
    # Once abandoned, its outcome (often RequestCancelledError) is nobody's: read it so asyncio does not log it.
    pending.add_done_callback(lambda task: task.cancelled() or task.exception())
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=CANCEL_POLL_S)
            if done:
                try:
                    return pending.result()
                except StopAsyncIteration:
                    return None
            unfinished = [stream for stream in streams if not stream.finished]
            if unfinished and all(stream.cancelled for stream in unfinished):
                raise _Cancelled
    finally:
        if not pending.done():
            pending.cancel()


def _fail_unfinished(streams: list[Stream], error: Exception) -> None:
    for stream in streams:
        if not stream.finished:
            stream.fail(error)


def _end_cancelled(streams: list[Stream]) -> None:
    """A cancelled request ends as the engine ends one: a done event, with stats not measured."""
    for stream in streams:
        if stream.cancelled and not stream.finished:
            stream.push(Event("done", stats=Stats().as_dict()))


def _init_options(address: str | None, num_cpus: int | None, quiet: bool) -> dict:
    """ray.init's arguments: join `address`, or start a local cluster whose workers import this repo."""
    options = {"log_to_driver": not quiet, "include_dashboard": False}
    if address is not None:
        return {**options, "address": address}
    # The replicas unpickle EngineConfig and import engine/ and replicas/ from this checkout, whatever
    # the directory the app was started from.
    python_path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {
        **options,
        "address": "local",
        "num_cpus": num_cpus,
        "runtime_env": {"env_vars": {"PYTHONPATH": python_path}},
    }


def _deploy_failure(app_name: str, error: BaseException) -> str:
    """Why the replicas did not start, in one line: the replica's own exception (the last line of the
    deployment's status message, which ends with the constructor's traceback), else Serve's error."""
    try:
        message = serve.status().applications[app_name].deployments[DEPLOYMENT_NAME].message
    except Exception:
        message = ""
    return _last_line(message) if message.strip() else _last_line(error)


def _last_line(error: BaseException | str) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__
