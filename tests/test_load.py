"""Load: 16 concurrent gradio_client users for 3 rounds against one launched app, a third of them
cancelling mid-stream (issue 11, item 6), with 2 live sessions beside them each round (issue 31): WebSocket
clients of /v1/live streaming a clip at its own pace and asking about it.

One real demo (the tiny model on CPU, launched in this process by tests/app_harness.py) serves 16
gradio_client users, each with its own Client (its own session), each asking about its own small clip.
Every round all 16 ask at once; users 2, 5, 8, 11 and 14 ask for a long answer and cancel it
(`Job.cancel()`) once its first words have arrived. After each round the test waits for the engine to
be idle and records what the app holds: resident memory of this process (the app runs in it), the live
engine `Request` objects, the files in the app's temp folder (a GRADIO_TEMP_DIR of its own).

What must hold:
- every request that was not cancelled completes, with every key of engine.STATS_KEYS present and set
  (but PENDING_KEYS, present and not yet filled by the engine);
- each cancel reaches the engine: that request ends cancelled, mid-answer, and no other is cancelled;
- the engine ends every round with no running requests; the reader processes alive (this process's
  children running engine/reading/reader_process.py, sampled every 20 ms through the rounds) never outnumber the
  pool's configured size, and at the end of each round they are exactly the pool's;
- no engine Request outlives its answer (the frames, pixel tensors and KV it holds would be a leak);
- resident memory after round 3 is within 10 % of after round 1 (round 1 pays for first-use allocations
  and fills the caches; rounds 2 and 3 ask the same and must not add to it);
- the temp folder does not grow after round 1 (see test docstring for why that is the bound).
- a scrape of the app's /metrics counts every request of the three rounds by how it ended;
- every live session gets every frame it was sent and answers its question with full stats, and once its
  socket closes the session is closed (its state freed by the worker); the engine's book of sessions keeps
  the last closed ones until the next opening, so at most a round's LiveSession objects stay reachable.

Sizing: the engine's admission queue (64) and Gradio's queue (64) both hold all 16 users, and 16 is the
engine's max_running, so no user is answered "busy"; the test checks that precondition instead of
accepting busy answers. Clips are 2-2.5 s at 160x120 or 128x96 (4 sampled frames, 2 temporal groups)
and answers 8 tokens, so a round takes 10-20 s on 2 busy cores and the test about a minute; the cancelled
answers ask for 512 tokens, far more than a round lasts, so a cancel that did not reach the engine shows
as a request that ran on.
"""

import asyncio
import gc
import json
import struct
import threading
import time
from pathlib import Path

import pytest
import websockets
from gradio_client import Client, handle_file
from gradio_client.utils import Status

import ui.layout
from app_harness import launched_app, outcomes, scrape_metrics, wait_until
from engine import STATS_KEYS
from engine.live.session import LiveSession
from engine.reading.pool import default_size
from engine.scheduling.request import Request
from live_helpers import jpeg_frames
from reader_processes import reader_children

USERS = 16
ROUNDS = 3
CANCELLERS = frozenset(range(2, USERS, 3))  # 2, 5, 8, 11, 14: a third of the users
ANSWER_TOKENS = 8
CANCEL_TOKENS = 2048  # far more than a round lasts: a cancel that is lost decodes them all
RSS_TOLERANCE = 0.10
ROUND_TIMEOUT_S = 120
KINDS = ("moving_object", "pan", "scene_cut", "static")
# Stats keys the engine lists but does not fill yet: sampled_fps arrives with issue 11 item 1 (long videos,
# owned by engine/reading/video.py's current work). Still required to be present; drop it from here once it lands.
PENDING_KEYS = frozenset({"sampled_fps"})
LIVE_USERS = 2  # within max_live_sessions (4)
LIVE_SECONDS = 3.0  # each live user's clip, streamed at its 8 fps: 6 sampled frames, 3 groups


def rss_bytes() -> int:
    """Resident memory of this process (the app runs in it), from /proc/self/status."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def live_requests() -> int:
    # type() rather than isinstance(): isinstance reads __class__, which some lazy modules answer with a warning
    return sum(1 for obj in gc.get_objects() if type(obj) is Request)


def live_sessions() -> tuple[int, int]:
    """(LiveSessions reachable, of which still open)."""
    sessions = [obj for obj in gc.get_objects() if type(obj) is LiveSession]
    return len(sessions), sum(1 for session in sessions if not session.stats()["closed"])


async def live_user(url: str, frames: list[tuple[float, bytes]], question: str) -> tuple[dict, dict]:
    """One /v1/live client: the frames at their own pace, then the question; (the answer's done message, the
    session's stats then). Errors fail it."""
    async with websockets.connect(url) as socket:
        start = time.monotonic()
        for t_s, image in frames:
            await asyncio.sleep(max(0.0, start + t_s - time.monotonic()))
            await socket.send(struct.pack(">d", t_s) + image)
        await socket.send(
            json.dumps({"type": "ask", "id": "q", "question": question, "params": {"max_new_tokens": ANSWER_TOKENS}})
        )
        done = None
        while True:
            message = json.loads(await asyncio.wait_for(socket.recv(), ROUND_TIMEOUT_S))
            assert message["type"] != "error", message
            if message["type"] == "done":
                done = message
                await socket.send(json.dumps({"type": "stats"}))
            elif message["type"] == "stats" and done is not None:
                return done, message


class LiveUsers(threading.Thread):
    """The round's live users, each in its own event loop on this thread: `results` once joined."""

    def __init__(self, url: str, frames: list[list[tuple[float, bytes]]], round_number: int):
        super().__init__(daemon=True)
        self.url, self.frames, self.round_number = url, frames, round_number
        self.results: list = []

    def run(self) -> None:
        async def all_users():
            return await asyncio.gather(
                *(
                    live_user(self.url, own, f"What moves? (live {user}, round {self.round_number})")
                    for user, own in enumerate(self.frames)
                ),
                return_exceptions=True,
            )

        self.results = asyncio.run(all_users())


def temp_files(folder: Path) -> dict[str, int]:
    """Every file under the app's temp folder, relative path -> size."""
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def loaded_app(tmp_path_factory, tiny_cache_dir):
    """The harness's app with a temp folder of its own, as app.py gives it one (GRADIO_TEMP_DIR is read
    when the demo is built and launched), so its size is this app's alone."""
    temp_dir = tmp_path_factory.mktemp("gradio-temp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRADIO_TEMP_DIR", str(temp_dir))
        with launched_app(tiny_cache_dir) as running:
            yield running, temp_dir


@pytest.fixture(scope="module")
def user_clips(clip):
    """One clip per user: 4 kinds x 2 lengths x 2 sizes, all distinct bytes."""
    variants = [(seconds, size) for seconds in (2.0, 2.5) for size in ((160, 120), (128, 96))]
    clips = [clip(kind, seconds=seconds, size=size) for kind in KINDS for seconds, size in variants]
    assert len(set(clips)) == USERS
    return clips


class ReaderCount(threading.Thread):
    """Counts this engine's reader processes every 50 ms, from /proc (not from the pool's own books):
    `most` is the largest count seen. others: readers of other engines in this process."""

    def __init__(self, others: set[int]):
        super().__init__(daemon=True)
        self.others, self.most, self.stopped = others, 0, threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.05):
            self.most = max(self.most, len(reader_children() - self.others))


def run_round(
    clients: list[Client], clips: list[Path], spy, round_number: int, others: set[int], live: LiveUsers
) -> list[dict]:
    """All users ask at once, the live users stream beside them; the cancellers cancel once their first words
    arrive. Returns the stats of the answers that completed, and checks the engine side of each request.
    others: readers of other engines in this process."""
    first_stream = len(spy.streams)
    live.start()
    jobs = []
    for user, (client, video) in enumerate(zip(clients, clips)):
        tokens = CANCEL_TOKENS if user in CANCELLERS else ANSWER_TOKENS
        jobs.append(
            client.submit(
                handle_file(str(video)),
                f"What happens here? (user {user})",
                0.3 + 0.1 * (user % 5),
                max_new_tokens=tokens,
                api_name="/ask",
            )
        )

    waiting = set(CANCELLERS)
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    while waiting and time.monotonic() < deadline:
        for user in list(waiting):
            if any(update[0] for update in jobs[user].outputs()):  # the answer has its first words
                jobs[user].cancel()
                waiting.discard(user)
        time.sleep(0.02)
    assert not waiting, f"round {round_number}: users {sorted(waiting)} never saw their first words"

    stats = []
    for user, job in enumerate(jobs):
        if user in CANCELLERS:
            continue
        answer, user_stats, _, _ = job.result(timeout=ROUND_TIMEOUT_S)
        assert answer, f"round {round_number}, user {user}: empty answer"
        assert set(STATS_KEYS) <= set(user_stats), f"round {round_number}, user {user}: keys missing"
        missing = [key for key in STATS_KEYS if user_stats[key] is None and key not in PENDING_KEYS]
        assert not missing, f"round {round_number}, user {user}: stats without {missing}"
        assert user_stats["generated_tokens"] == ANSWER_TOKENS
        stats.append(user_stats)
    for user in CANCELLERS:
        assert wait_until(jobs[user].done, timeout_s=30), f"round {round_number}: a cancelled job never ended"
        assert jobs[user].status().code == Status.CANCELLED

    # The engine side: one stream per user, every one ended; exactly the cancellers' were cancelled,
    # mid-answer (some tokens, not all asked: how many depends on how busy the machine is while the cancel travels).
    assert wait_until(lambda: len(spy.streams) - first_stream == USERS, timeout_s=30)
    streams = spy.streams[first_stream:]
    assert wait_until(lambda: all(s.finished for s in streams), timeout_s=60), "a request never ended"
    cancelled = [s for s in streams if s.cancelled]
    assert len(cancelled) == len(CANCELLERS), f"round {round_number}: {len(cancelled)} requests cancelled"
    for stream in cancelled:
        generated = stream.result().stats["generated_tokens"]
        assert 1 <= generated < CANCEL_TOKENS, f"round {round_number}: a cancelled request made {generated}"
    live.join(ROUND_TIMEOUT_S)
    assert not live.is_alive(), f"round {round_number}: a live user never got its answer"
    for user, result in enumerate(live.results):
        assert not isinstance(result, BaseException), f"round {round_number}, live user {user}: {result!r}"
        done, session = result
        assert set(STATS_KEYS) <= set(done["stats"]) and done["stats"]["ttft_s"] > 0
        assert session["frames_received"] == len(live.frames[user]), session  # every frame it was sent
    assert wait_until(lambda: spy.engine.running_requests == 0, timeout_s=30), "requests still running"
    readers = spy.engine.readers
    assert wait_until(lambda: reader_children() - others == readers.pids(), timeout_s=10), "a reader outside the pool"
    return stats


def test_sixteen_users_three_rounds_with_cancels_stay_bounded(loaded_app, user_clips, clip):
    """16 users x 3 rounds, a third cancelling, 2 live sessions beside them: answers complete with full stats,
    cancels reach the engine, and memory, live requests and sessions and the temp folder do not grow after
    round 1.

    Why these bounds. Rounds 2 and 3 repeat round 1 (same users, clips, questions and q), so everything
    the app needs for them already exists after round 1: sampled frames, ViT features and the
    conversation KV are cached (bounded caches), and Gradio stores uploads and frame pictures under the
    hash of their content. Anything that still grows is per-request residue:
    - resident memory: within 10 % of round 1 (the issue's bound; it absorbs allocator noise of a process
      holding torch, Gradio and 16 clients, and catches a leak of some MB per request);
    - live engine Requests: none once the round is over (a finished request must be unreachable; each
      holds its frames, pixel tensors and KV, so this finds a leak RSS is too coarse to see);
    - temp folder: no file appears after round 1 and its bytes do not grow. A per-request file (a unique
      name per answer) would only go when app.py's cleaner reaches its age, an hour by default, so the
      folder would grow with traffic (54 new files a round here: 2 pictures per answer, saved twice).
    """
    (running, temp_dir), spy = loaded_app, loaded_app[0].spy
    assert spy.engine.config.max_queue >= USERS and spy.engine.config.max_running >= USERS
    assert ui.layout.QUEUE_MAX_SIZE >= USERS  # so nobody is told "busy": all 16 are served
    downloads = temp_dir.parent / "client-downloads"  # clients' copies of the frame pictures, kept apart
    clients = [Client(running.url, verbose=False, download_files=str(downloads)) for _ in range(USERS)]

    readers = spy.engine.readers
    assert wait_until(lambda: readers.idle == readers.size, timeout_s=60)
    others = reader_children() - readers.pids()
    count = ReaderCount(others)
    count.start()
    live_url = running.url.replace("http://", "ws://").rstrip("/") + "/v1/live"
    live_frames = [jpeg_frames(clip(kind, seconds=LIVE_SECONDS, size=(160, 120))) for kind in KINDS[:LIVE_USERS]]
    gc.collect()
    earlier = live_requests()  # what earlier tests in this process still hold is not this app's to answer for
    earlier_sessions = live_sessions()  # closed ones of earlier tests' engines may still be reachable
    after = []
    try:
        for round_number in range(1, ROUNDS + 1):
            start = time.monotonic()
            stats = run_round(
                clients, user_clips, spy, round_number, others, LiveUsers(live_url, live_frames, round_number)
            )
            assert len(stats) == USERS - len(CANCELLERS)
            # The worker drops its last iteration's locals on its next idle step (every 0.1 s): wait for
            # that rather than count a request it is still letting go of; a leaked one never goes.
            wait_until(lambda: live_requests() == earlier, timeout_s=5)
            # A closed socket's session is closed on a worker thread, just after the socket goes.
            wait_until(lambda: live_sessions()[1] == earlier_sessions[1], timeout_s=10)
            gc.collect()
            after.append(
                dict(
                    rss=rss_bytes(),
                    requests=live_requests() - earlier,
                    files=temp_files(temp_dir),
                    sessions=tuple(now - before for now, before in zip(live_sessions(), earlier_sessions)),
                    seconds=time.monotonic() - start,
                )
            )
            print(
                f"round {round_number}: {after[-1]['seconds']:.1f} s, RSS {after[-1]['rss'] / 2**20:.0f} MiB, "
                f"{after[-1]['requests']} live requests, {after[-1]['sessions'][1]} live sessions open, "
                f"{len(after[-1]['files'])} temp files "
                f"({sum(after[-1]['files'].values()) / 2**10:.0f} KiB)"
            )
    finally:
        count.stopped.set()
        for client in clients:
            client.close()
    count.join()
    assert 0 < count.most <= readers.size == (spy.engine.config.video_readers or default_size()), count.most

    live = [a["requests"] for a in after]
    assert live == [0] * ROUNDS, f"engine Requests still reachable after each round: {live}"
    sessions = [a["sessions"] for a in after]
    assert all(open_ == 0 and reachable <= LIVE_USERS for reachable, open_ in sessions), (
        f"LiveSessions (reachable, open) after each round: {sessions}"
    )
    first, last = after[0], after[-1]
    assert last["rss"] <= first["rss"] * (1 + RSS_TOLERANCE), (
        f"RSS grew from {first['rss'] / 2**20:.0f} MiB after round 1 to {last['rss'] / 2**20:.0f} MiB after "
        f"round {ROUNDS}"
    )
    assert first["files"], "round 1 left no uploads or pictures in the temp folder: the check would be vacuous"
    new_files = sorted(set(last["files"]) - set(first["files"]))
    assert not new_files, f"{len(new_files)} temp files appeared after round 1, e.g. {new_files[:3]}"
    assert sum(last["files"].values()) <= sum(first["files"].values())

    # The server's own numbers say the same: every request of every round, by how it ended.
    served = outcomes(scrape_metrics(running.url))
    assert served == {
        "answered": (USERS - len(CANCELLERS) + LIVE_USERS) * ROUNDS,
        "refused": 0,
        "cancelled": len(CANCELLERS) * ROUNDS,
        "failed": 0,
    }, served
