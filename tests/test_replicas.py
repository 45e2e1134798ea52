"""Engine replicas on Ray Serve (replicas/): one local Ray cluster of 2 tiny-model replicas on the CPU for
the module, checked against a single in-process Engine.

Same answers as one engine (token ids, logits, the EVS picture), one video or several media in a question; a
video always reaches its home replica
and its follow-up hits that replica's prefix cache; videos spread over both replicas; a burst stays one
ViT forward; a busy home spills to the other replica; videos sent as bytes; bad input gets the engine's
sentence; the UI works unchanged on top; cancel reaches the replica at once, through the Engine API and the
app's Stop; two bursts about one video spill to the other replica rather than be refused; killing a replica's
process mid-answer fails only its requests, with one sentence; a stopped (SIGSTOP) replica's caller is told within
the progress deadline while its video's next question goes to the other replica. Without Ray: the routing rule,
and the single-engine path never importing Ray. A few minutes on 2 cores, most of it starting the cluster and
waiting for the faults to be noticed.
"""

import asyncio
import contextlib
import io
import json
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import ray
import torch
import websockets

from assets.clips import write_clip
from engine import Engine, EngineConfig, FrameSampling, GenerationParams, InputError
from engine.errors import NO_VIDEO, RESTARTING, BusyError
from engine.reading.video import UNREADABLE, file_sha256
from replicas import LIVE_SESSION_LOST, REPLICA_LOST, ReplicaLost, ReplicasUnavailable, ReplicatedEngine, SessionLost
from replicas.routing import home_of, ranks
from replicas.videos import VideoSender

REPO = Path(__file__).resolve().parent.parent
FRAME_SAMPLING = FrameSampling(fps=4.0, max_frames=8, max_pixels_per_frame=160 * 128)
KINDS = ("moving_object", "pan", "scene_cut", "static")
TIMEOUT_S = 120
SPILL_AFTER = 2
BURST_QUEUE = 8  # each replica's engine queue: two bursts of 6 about one video need both replicas
LONG_TOKENS = 1500  # an answer long enough to cancel mid-stream (about 4 s of the tiny model on 2 cores)
WARM_UP_CLIP = REPO / "assets" / "examples" / "shape_moving.mp4"  # app.py's; each replica answers it first


def params(q: float = 0.5, new_tokens: int = 8, **extra) -> GenerationParams:
    return GenerationParams(pruning_rate=q, max_new_tokens=new_tokens, ignore_eos=True, **extra)


# --- the routing rule (no Ray) -------------------------------------------------------------------------
def test_home_is_stable_and_only_a_removed_replicas_videos_move():
    digests = [f"{i:064x}" for i in range(200)]
    three = ["a", "b", "c"]
    homes = {d: home_of(d, three) for d in digests}
    assert homes == {d: home_of(d, list(reversed(three))) for d in digests}  # order of the list is no input
    assert set(homes.values()) == set(three)
    moved = {d: home_of(d, ["a", "c"]) for d in digests}
    assert all(moved[d] == homes[d] for d in digests if homes[d] != "b")


def test_a_home_without_room_for_the_whole_call_spills_to_the_most_room():
    """Load in requests, as the engine counts its queue: a burst is one call of several requests."""
    digest = "f" * 64
    home = home_of(digest, ["r1", "r2"])
    other = "r2" if home == "r1" else "r1"
    assert ranks(digest, {"r1": 0, "r2": 0}, size=6, capacity=8, spill_after=16) == [[home], [other]]
    # A second burst of 6 while the home has 6 under way: its engine queue (8) cannot take it, the other can.
    assert ranks(digest, {home: 6, other: 0}, size=6, capacity=8, spill_after=16) == [[other], [home]]
    assert ranks(digest, {home: 6, other: 0}, size=1, capacity=8, spill_after=16) == [[home], [other]]
    assert ranks(digest, {home: 4, other: 0}, size=1, capacity=64, spill_after=4) == [[other], [home]]
    assert ranks(None, {"r1": 3, "r2": 1}, size=1, capacity=8, spill_after=16) == [["r2"], ["r1"]]
    # A replica that did not answer a probe goes last, even as the video's home.
    assert ranks(digest, {home: 0, other: 5}, size=1, capacity=8, spill_after=16, unresponsive={home}) == [
        [other],
        [home],
    ]


def test_an_upload_over_the_limit_is_refused_before_it_is_read(clip):
    path = clip("static", seconds=1.0)
    with pytest.raises(InputError, match=r"^The video is .*; the limit is .*\.$"):
        VideoSender(ship_bytes=True, max_file_bytes=100, cache_bytes=1 << 20).digest(path)


def test_the_single_engine_path_never_imports_ray():
    code = "import sys, app, ui, engine; assert 'ray' not in sys.modules, 'ray was imported'"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


# --- a local cluster of 2 replicas -------------------------------------------------------------------
@pytest.fixture(scope="module")
def config(tiny_cache_dir) -> EngineConfig:
    return EngineConfig(
        model="tiny-random",
        device="cpu",
        cache_dir=tiny_cache_dir,
        frame_sampling=FRAME_SAMPLING,
        max_queue=BURST_QUEUE,
    )


@pytest.fixture(scope="module")
def one_thread():
    """Each replica has one CPU and runs torch on one thread; the reference engine must too, since a
    float32 sum split over other threads rounds differently."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def reference(config, one_thread):
    """The single engine, in this process (built first, so the tiny model is on disk for the replicas)."""
    with Engine(config) as engine:
        yield engine


@pytest.fixture(scope="module")
def replicated(config, reference):
    # spill_after=2: a third request on a video whose home is busy with two goes elsewhere; and a
    # request that ended must stop counting on its replica, or sequential questions would spill too.
    engine = ReplicatedEngine(
        config, replicas=2, num_cpus=2, quiet=True, spill_after=SPILL_AFTER, warm_up_clip=WARM_UP_CLIP
    )
    try:
        yield engine
    finally:
        engine.shutdown()
        assert not ray.is_initialized()


class Videos:
    """Byte-distinct clips made on demand, each never asked about before, with its home replica by the
    routing rule over the live replicas (so a test can ask for one clip on each replica)."""

    def __init__(self, folder: Path, replica_ids: list[str]):
        self.folder, self.replica_ids, self.made = folder, replica_ids, 0
        self.unused: dict[str, list[Path]] = {replica: [] for replica in replica_ids}
        self.home: dict[Path, str] = {}

    def take(self, replica: str | None = None) -> Path:
        """A fresh clip (on `replica` when given)."""
        while not (self.unused[replica] if replica else any(self.unused.values())):
            i = self.made
            self.made += 1
            path = write_clip(
                self.folder / f"clip{i}.mp4", KINDS[i % 4], seconds=2.0 + 0.25 * (i // 4), fps=8, size=(160, 120)
            )
            self.home[path] = home_of(file_sha256(path), self.replica_ids)
            self.unused[self.home[path]].append(path)
        pool = self.unused[replica] if replica else max(self.unused.values(), key=len)
        return pool.pop(0)

    def pair(self) -> list[Path]:
        """Two fresh clips, one on each replica."""
        return [self.take(replica) for replica in self.replica_ids]

    def refresh(self, replica_ids: list[str]) -> None:
        """The replicas changed (one was replaced): homes from now on are over these."""
        self.replica_ids = replica_ids
        self.unused = {replica: [] for replica in replica_ids}


@pytest.fixture(scope="module")
def videos(replicated, tmp_path_factory) -> Videos:
    ids = replicated.replicas()
    assert len(ids) == 2
    return Videos(tmp_path_factory.mktemp("replica-clips"), ids)


def test_answers_equal_the_single_engine(replicated, reference, videos):
    asked = params(0.5, 12, return_logits=True)
    for video in videos.pair():
        local = reference.submit(video, "What moves?", asked)
        remote = replicated.submit(video, "What moves?", asked)
        local_events, remote_events = list(local), list(remote)
        expected, answer = local.result(), remote.result(TIMEOUT_S)
        assert answer.stats["replica"] == videos.home[video]
        assert answer.token_ids == expected.token_ids and answer.text == expected.text
        np.testing.assert_array_equal(answer.logits, expected.logits)
        assert [e.kind for e in remote_events] == [e.kind for e in local_events]
        local_picture = next(e.evs for e in local_events if e.kind == "evs")
        picture = next(e.evs for e in remote_events if e.kind == "evs")
        assert picture.grid_thw == local_picture.grid_thw and picture.timestamps_s == local_picture.timestamps_s
        np.testing.assert_array_equal(picture.kept_mask, local_picture.kept_mask)
        np.testing.assert_array_equal(picture.frames, local_picture.frames)
        stats = {k: v for k, v in answer.stats.items() if not k.endswith("_s") and k != "replica"}
        assert stats == {k: v for k, v in expected.stats.items() if not k.endswith("_s")}


def test_several_media_answer_as_the_single_engine_on_their_home(replicated, reference, videos, tmp_path):
    """Two clips and a picture in one question (each a file of its own, going by path or as bytes): the same
    token ids, logits and per-medium stats as one engine, answered by the home of the three uploads together;
    the same media asked again go there again and reuse its caches; each upload alone keeps its own home."""
    from PIL import Image

    from replicas.routing import media_key

    picture = tmp_path / "picture.png"
    Image.fromarray(np.arange(96 * 64 * 3, dtype=np.uint8).reshape(64, 96, 3)).save(picture)
    media = [*videos.pair(), picture]
    home = home_of(media_key([file_sha256(path) for path in media]), videos.replica_ids)
    asked = params(0.5, 10, return_logits=True)
    for ship_bytes in (False, True):
        replicated.ship_bytes = ship_bytes
        try:
            expected = reference.submit(media=media, question="What differs?", params=asked).result(TIMEOUT_S)
            answer = replicated.submit(media=media, question="What differs?", params=asked).result(TIMEOUT_S)
        finally:
            replicated.ship_bytes = False
        assert answer.stats["replica"] == home
        assert answer.token_ids == expected.token_ids and answer.text == expected.text
        np.testing.assert_array_equal(answer.logits, expected.logits)
        assert [m["kind"] for m in answer.stats["media"]] == ["video", "video", "image"]
        assert answer.stats["media"] == expected.stats["media"]
    # Asked twice on one replica: the second time its features come from that replica's cache.
    assert answer.stats["vit_cache_hit"]
    assert media_key([file_sha256(media[0])]) == file_sha256(media[0])


def test_a_video_stays_on_its_replica_and_its_follow_up_hits_the_prefix_cache(replicated, videos):
    video = videos.take()
    first = replicated.submit(video, "What happens?", params()).result(TIMEOUT_S)
    history = [("What happens?", first.text)]
    follow = replicated.submit(video, "Which colour is it?", params(), history=history).result(TIMEOUT_S)
    again = [replicated.submit(video, f"Question {i}?", params(new_tokens=2)).result(TIMEOUT_S) for i in range(3)]
    served = {answer.stats["replica"] for answer in (first, follow, *again)}
    assert served == {videos.home[video]}
    assert not first.stats["prefix_cache_hit"] and not first.stats["vit_cache_hit"]
    assert follow.stats["prefix_cache_hit"] and follow.stats["vit_cache_hit"]


def test_videos_spread_over_both_replicas(replicated, videos):
    pair = videos.pair()
    streams = [replicated.submit(video, "What happens?", params()) for video in pair]
    served = [stream.result(TIMEOUT_S).stats["replica"] for stream in streams]
    assert served == [videos.home[video] for video in pair]
    assert len(set(served)) == 2


def test_a_burst_on_one_video_shares_its_replicas_vit_forward(replicated, videos):
    video = videos.take()
    with replicated.paused():  # compare mode: q = 0 and the chosen q together
        streams = [replicated.submit(video, "What happens?", params(q)) for q in (0.0, 0.7)]
    answers = [stream.result(TIMEOUT_S) for stream in streams]
    assert [a.stats["vit_batch_requests"] for a in answers] == [2, 2]
    assert {a.stats["replica"] for a in answers} == {videos.home[video]}
    assert answers[0].stats["video_tokens_kept"] > answers[1].stats["video_tokens_kept"]


def test_bytes_through_the_object_store_give_the_same_answer(replicated, reference, videos):
    video = videos.take()
    expected = reference.submit(video, "What moves?", params()).result()
    replicated.ship_bytes = True
    try:
        answer = replicated.submit(video, "What moves?", params()).result(TIMEOUT_S)
    finally:
        replicated.ship_bytes = False
    assert answer.token_ids == expected.token_ids and answer.stats["replica"] == videos.home[video]


def test_bad_videos_get_the_engines_sentence(replicated, tmp_path):
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(InputError, match=f"^{UNREADABLE}$"):
        replicated.submit(junk, "What moves?", params()).result(TIMEOUT_S)
    with pytest.raises(InputError, match=f"^{NO_VIDEO}$"):
        replicated.submit(tmp_path / "gone.mp4", "What moves?", params()).result(TIMEOUT_S)
    with pytest.raises(InputError, match="Please type a question"):
        replicated.submit(junk, "  ", params())


@pytest.fixture(scope="module")
def replicated_app(replicated):
    """The page, /ask, /sweep and the OpenAI routes launched on the replicas, as app.py launches them; its URL."""
    import ui
    from app_harness import free_port

    max_file_bytes = 10_000_000
    demo = ui.build_demo(replicated, max_file_bytes=max_file_bytes)
    try:
        _, url, _ = demo.launch(
            prevent_thread_lock=True,
            server_name="127.0.0.1",
            server_port=free_port(),
            quiet=True,
            app_kwargs={"routes": ui.openai_routes(replicated, max_file_bytes)},
            **ui.launch_kwargs(max_file_bytes),
        )
        yield url
    finally:
        demo.close()


def test_the_ui_serves_through_the_replicas_unchanged(replicated_app, videos):
    from gradio_client import Client, handle_file

    video = videos.take()
    client = Client(replicated_app, verbose=False)
    # Gradio copies the upload to its own folder: another path, the same bytes, the same home.
    answer, stats, figures, _ = client.predict(
        handle_file(str(video)), "What moves?", 0.7, max_new_tokens=6, compare=True, api_name="/ask"
    )
    assert answer and stats["replica"] == videos.home[video] == stats["compare"]["stats"]["replica"]
    assert set(figures) == {"tokens_per_group", "dissimilarity"}
    # The sweep (on a video not encoded yet) is one burst, paused(): one call, one ViT forward.
    table, _, _ = client.predict(
        handle_file(str(videos.take())), "What changes?", "0, 0.5, 0.9", max_new_tokens=4, api_name="/sweep"
    )
    vit_column = table["headers"].index(next(h for h in table["headers"] if "ViT forward" in h))
    assert [row[vit_column] for row in table["data"]] == [3, 3, 3]


def test_stop_in_the_app_frees_the_slot_at_once(replicated_app, replicated, videos):
    """The page's Stop is gradio_client's job.cancel(): the request's slot is free long before its answer would
    have ended (9.0 s behind replicas when the cancel waited for a quiet moment between tokens, 0.05 s on one
    engine). Compared with the whole answer's time in the same run, not a fixed number of seconds."""
    from gradio_client import Client, handle_file

    from app_harness import wait_until

    client = Client(replicated_app, verbose=False)
    video = handle_file(str(videos.take()))
    started = time.monotonic()
    answer, stats, _, _ = client.predict(video, "Talk.", 0.5, max_new_tokens=LONG_TOKENS, api_name="/ask")
    whole_s = time.monotonic() - started
    assert stats["generated_tokens"] == LONG_TOKENS
    assert wait_until(lambda: replicated.running_requests == 0, timeout_s=30)
    job = client.submit(video, "Talk for a long time.", 0.5, max_new_tokens=LONG_TOKENS, api_name="/ask")
    assert wait_until(lambda: any(update[0] for update in job.outputs()), timeout_s=TIMEOUT_S)
    assert replicated.running_requests == 1
    stopped = time.monotonic()
    job.cancel()
    assert wait_until(lambda: replicated.running_requests == 0, timeout_s=TIMEOUT_S)
    freed_s = time.monotonic() - stopped
    print(f"Stop freed the slot in {freed_s:.2f} s; the whole answer took {whole_s:.2f} s")
    assert freed_s < whole_s / 3, (freed_s, whole_s)


def test_more_replicas_than_gpus_is_one_sentence_and_leaves_the_others_serving(replicated, config, videos):
    cuda = EngineConfig(model=config.model, device="cuda", cache_dir=config.cache_dir)
    with pytest.raises(ReplicasUnavailable, match=r"^2 replicas need 2 GPUs, one each; the Ray cluster has 0\.$"):
        ReplicatedEngine(cuda, replicas=2, app_name="evs-gpu")
    assert replicated.submit(videos.take(), "What moves?", params()).result(TIMEOUT_S).stats["generated_tokens"] == 8


def wait_for_text(replicated, stream, timeout_s: float = TIMEOUT_S):
    """The first answer event has arrived (the request is decoding); returns where it runs."""
    deadline = time.monotonic() + timeout_s
    for event in stream:
        if event.kind == "text":
            return replicated.placement(stream.request_id)
        assert time.monotonic() < deadline
    raise AssertionError("the stream ended before any text")


def test_a_cancel_reaches_the_replica_at_once_and_no_piece_follows_it(replicated, videos):
    """A 1,500-token answer cancelled after 3 pieces: the stream ends at once, with at most a few pieces already on
    their way before the cancel (561 to 985 pieces came after it, for 3.4 to 4.3 s, when the client looked at its
    cancel flags only between quiet moments); and the replica has dropped the request."""
    video = videos.take()
    started = time.monotonic()
    whole = replicated.submit(video, "Tell me everything.", params(new_tokens=LONG_TOKENS)).result(TIMEOUT_S)
    whole_s = time.monotonic() - started
    assert whole.stats["generated_tokens"] == LONG_TOKENS
    long = replicated.submit(video, "Tell me everything again.", params(new_tokens=LONG_TOKENS))
    events, pieces = iter(long), 0
    for event in events:
        pieces += event.kind == "text"
        if pieces == 3:
            break
    cancelled = time.monotonic()
    long.cancel()
    after = [event.kind for event in events]
    ended_s = time.monotonic() - cancelled
    pieces_after = after.count("text")
    print(f"cancel ended the stream in {ended_s:.3f} s, {pieces_after} pieces after it; whole answer {whole_s:.2f} s")
    assert after[-1] == "done" and after.count("text") <= 20
    assert long.result().cancelled
    assert ended_s < whole_s / 4, (ended_s, whole_s)
    # Had the long request stayed on its replica, it would still be decoding beside this one.
    short = replicated.submit(video, "What moves?", params(new_tokens=4)).result(TIMEOUT_S)
    assert short.stats["decode_batch_max"] == 1


def test_a_fault_between_taking_a_slot_and_sending_gives_the_slot_back(replicated, videos, monkeypatch):
    """More requests than the client has queue slots, each failing after its slot was taken: a fault making the
    request's stream (it raises out of submit) and the client's call loop gone (each stream fails with the
    restarting sentence). Every slot comes back: the next request is answered, where it was refused as busy
    once the leaked slots had filled the queue."""
    video = videos.take()
    slots = replicated.config.max_queue * replicated.replica_count

    def broken_stream(*args, **kwargs):
        raise RuntimeError("a fault while the request is made")

    with monkeypatch.context() as patched:
        patched.setattr("replicas.client.Stream", broken_stream)
        for _ in range(slots + 1):
            with pytest.raises(RuntimeError, match="a fault"):
                replicated.submit(video, "What moves?", params(new_tokens=2))
    gone = asyncio.new_event_loop()
    gone.close()
    with monkeypatch.context() as patched:
        patched.setattr(replicated, "_loop", gone)
        for _ in range(slots + 1):
            with pytest.raises(BusyError, match=re.escape(RESTARTING)):
                replicated.submit(video, "What moves?", params(new_tokens=2)).result(TIMEOUT_S)
    assert replicated.submit(video, "What moves?", params(new_tokens=2)).result(TIMEOUT_S).stats["generated_tokens"]


def test_metrics_count_every_request_the_client_hands_out_exactly(replicated, videos, tmp_path):
    """GET /metrics behind --replicas: the client counts where its streams end, whichever replica answered
    (tests/test_metrics.py is the single engine's twin). Counted as differences: the module's engine is shared."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from app import metrics_route
    from app_harness import outcomes, parse_metrics

    http = TestClient(FastAPI(routes=[metrics_route(replicated)]))

    def scrape() -> dict[tuple, float]:
        response = http.get("/metrics")
        assert response.status_code == 200
        return parse_metrics(response.text)

    assert wait_until_idle(replicated)
    before = scrape()
    long = replicated.submit(videos.take(), "Tell me everything.", params(new_tokens=4000))
    wait_for_text(replicated, long)
    long.cancel()
    assert long.result(TIMEOUT_S).cancelled
    with pytest.raises(InputError):  # refused by the client at submit
        replicated.submit(videos.take(), "What moves?", params(q=1.5))
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(InputError):  # refused by a replica, through the stream
        replicated.submit(junk, "What moves?", params()).result(TIMEOUT_S)
    # Answered last, one on each replica: a cancelled call may still count on its replica for a moment,
    # and the next test needs the replicas' queues empty; an answer is delivered once its call has ended.
    for stream in [replicated.submit(video, "What moves?", params(new_tokens=2)) for video in videos.pair()]:
        stream.result(TIMEOUT_S)
    assert wait_until_idle(replicated)  # the client's calls close a moment after their last stream ends
    after = scrape()

    counted = {outcome: after_value - outcomes(before)[outcome] for outcome, after_value in outcomes(after).items()}
    assert counted == {"answered": 2, "refused": 2, "cancelled": 1, "failed": 0}
    grew = {
        name: after[(name, ())] - before[(name, ())] for name in ("evs_ttft_seconds_count", "evs_answer_seconds_count")
    }
    assert grew["evs_answer_seconds_count"] == 2
    # The cancelled request's TTFT is counted when the replica's done event, with its stats, reaches the
    # client before the client ends the stream itself with stats not measured (client.py, _end_cancelled).
    assert grew["evs_ttft_seconds_count"] in (2, 3)
    assert after[("evs_running_requests", ())] == 0
    assert ("evs_queue_depth", ()) not in after  # each replica's own, not gathered by the client


def wait_until_idle(replicated, timeout_s: float = TIMEOUT_S) -> bool:
    """No request of an earlier test still open on the client."""
    deadline = time.monotonic() + timeout_s
    while replicated.running_requests and time.monotonic() < deadline:
        time.sleep(0.05)
    return not replicated.running_requests


def test_a_busy_home_sends_the_next_request_to_the_other_replica(replicated, videos):
    video = videos.take()
    home = videos.home[video]
    busy = [replicated.submit(video, f"Long {i}?", params(new_tokens=300)) for i in range(SPILL_AFTER)]
    assert {wait_for_text(replicated, stream).replica for stream in busy} == {home}
    spilled = replicated.submit(video, "What moves?", params(new_tokens=2)).result(TIMEOUT_S)
    assert spilled.stats["replica"] != home
    assert all(stream.result(TIMEOUT_S).stats["generated_tokens"] == 300 for stream in busy)
    # Answered requests no longer count against their replica: the video goes home again.
    back = replicated.submit(video, "What moves?", params(new_tokens=2)).result(TIMEOUT_S)
    assert back.stats["replica"] == home


def test_two_bursts_about_one_video_fill_both_replicas_and_none_is_refused(replicated, videos):
    """Two bursts of 6 about one video, max_queue 8 on each of 2 replicas: the second cannot fit beside the first
    on the video's home, so it goes whole to the other replica (8 answered and 4 refused busy when the router
    counted calls, a burst being one call, while the engine counts requests). Then one burst of 12 (overlapping
    pauses add up): more than one replica's queue, so it goes as two calls."""
    for sizes in ([6, 6], [12]):
        video = videos.take()
        streams = []
        for size in sizes:
            with replicated.paused():
                streams += [replicated.submit(video, f"Question {i}?", params(new_tokens=4)) for i in range(size)]
        answers = [stream.result(TIMEOUT_S) for stream in streams]  # a BusyError would be raised here
        assert all(answer.stats["generated_tokens"] == 4 for answer in answers)
        assert {answer.stats["replica"] for answer in answers} == set(videos.replica_ids), sizes
        assert wait_until_idle(replicated)


def test_a_killed_replica_fails_only_its_requests(replicated, videos):
    doomed_video, other_video = videos.pair()
    doomed = replicated.submit(doomed_video, "Tell me everything.", params(new_tokens=4000))
    other = replicated.submit(other_video, "Tell me everything.", params(new_tokens=400))
    where = wait_for_text(replicated, doomed)
    assert where.replica == videos.home[doomed_video]
    assert wait_for_text(replicated, other).replica != where.replica
    assert not other.finished
    os.kill(where.pid, signal.SIGKILL)
    with pytest.raises(ReplicaLost, match=f"^{REPLICA_LOST}$"):
        doomed.result(TIMEOUT_S)
    survived = other.result(TIMEOUT_S)
    assert survived.stats["generated_tokens"] == 400
    # The next question on the lost replica's video is answered (by the survivor, or by the replacement).
    again = replicated.submit(doomed_video, "What moves?", params()).result(TIMEOUT_S)
    assert again.stats["generated_tokens"] == 8 and again.stats["replica"] != where.replica


def wait_for_replicas(replicated, videos, timeout_s: float = 240.0) -> None:
    """Both replicas running again (a replaced one has started and answered its warm-up), and the test videos'
    homes counted over them."""
    from ray import serve
    from ray.serve.schema import DeploymentStatus

    from replicas.deployment import DEPLOYMENT_NAME

    def healthy() -> bool:
        deployment = serve.status().applications[replicated.app_name].deployments[DEPLOYMENT_NAME]
        return deployment.status == DeploymentStatus.HEALTHY and deployment.replica_states.get("RUNNING") == 2

    deadline = time.monotonic() + timeout_s
    while not healthy():
        assert time.monotonic() < deadline, "the replicas did not come back"
        time.sleep(0.5)
    videos.refresh(replicated.replicas())


def test_a_stopped_replica_tells_its_caller_and_its_videos_go_elsewhere_meanwhile(replicated, videos):
    """A replica stopped (SIGSTOP) three tokens into an answer: its caller reads the "ask again" sentence within the
    progress deadline (20 s; 188.6 s before, when only Ray's health check noticed), and a question about the same
    video sent meanwhile is answered by the other replica, before the caller is told."""
    wait_for_replicas(replicated, videos)  # the replica killed in the test before is back
    video = videos.take()
    long = replicated.submit(video, "Tell me everything.", params(new_tokens=4000))
    where = wait_for_text(replicated, long)
    os.kill(where.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        meanwhile = replicated.submit(video, "What moves?", params()).result(TIMEOUT_S)
        answered_s = time.monotonic() - stopped
        with pytest.raises(ReplicaLost, match=f"^{REPLICA_LOST}$"):
            long.result(TIMEOUT_S)
        told_s = time.monotonic() - stopped
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(where.pid, signal.SIGKILL)  # Serve replaces it either way; nothing of it may linger
    print(f"the caller was told after {told_s:.1f} s; the question meanwhile was answered after {answered_s:.1f} s")
    assert meanwhile.stats["generated_tokens"] == 8 and meanwhile.stats["replica"] != where.replica
    assert answered_s < told_s
    assert told_s < 30  # the bound: the deadline (20 s) or the health check (about 21 s), whichever first


# --- live sessions: pinned to the replica that holds their state ---------------------------------------
def live_frames(seed: int):
    from live_helpers import clip_frames

    return clip_frames(seed, fps=2, seconds=4.0)


def test_a_live_session_stays_on_its_replica_and_answers_as_the_single_engine(replicated, reference):
    asked = params(0.5, 6, return_logits=True)
    with replicated.open_live(asked) as remote, reference.open_live(asked) as local:
        for index, frame in enumerate(live_frames(1_000_040)):
            for live in (remote, local):
                live.push(frame, index / 2)
                assert live.wait(TIMEOUT_S)
        answers = [remote.ask("What moves?").result(TIMEOUT_S) for _ in range(2)]
        expected = local.ask("What moves?").result(TIMEOUT_S)
        assert remote.stats()["video_tokens_total"] == local.stats()["video_tokens_total"] == 4 * 4
        pictures = remote.recent_picture(), local.recent_picture()  # the Live tab's pruning picture
        for part in ("frames", "kept_mask", "dissimilarity"):
            np.testing.assert_array_equal(getattr(pictures[0], part), getattr(pictures[1], part))
        assert pictures[0].timestamps_s == pictures[1].timestamps_s and pictures[0].grid_thw == (4, 2, 2)
    assert {answer.stats["replica"] for answer in answers} == {remote.replica}
    for answer in answers:
        assert answer.token_ids == expected.token_ids
        np.testing.assert_array_equal(answer.logits, expected.logits)
    with pytest.raises(InputError, match="closed"):
        remote.push(live_frames(1_000_040)[0], 9.0)
    with replicated.open_live(asked) as another, pytest.raises(InputError, match="capture time"):
        another.push(live_frames(1_000_040)[0], float("nan"))


def test_a_watch_behind_the_replicas_answers_as_the_single_engine_and_ends_with_its_session(replicated, reference):
    """A watch on a replica's session (RemoteWatch): the same events as a watch on the single engine's, and
    iterating it ends when its session closes, as a local watch's iteration does (it raised SessionEnded)."""
    asked = params(0.5, 2)
    events = []
    for engine in (replicated, reference):
        with engine.open_live(asked) as live:
            watch = live.watch("What moves?", params=asked)
            for index, frame in enumerate(live_frames(1_000_041)):
                live.push(frame, index / 2)
                assert live.wait(TIMEOUT_S)
            assert watch.wait_idle(live.stats()["frames_sampled"] // 2, TIMEOUT_S)  # 2 frames a group
            events.append([(event.group, event.answer) for event in watch.poll()])
            ended = threading.Event()
            iterating = threading.Thread(target=lambda w=watch, e=ended: (list(w), e.set()), daemon=True)
            iterating.start()
        iterating.join(TIMEOUT_S)
        assert ended.is_set(), "iterating the watch did not end with its session"
    assert events[0] == events[1] and events[0]


def jpeg(frame: np.ndarray) -> bytes:
    from PIL import Image

    data = io.BytesIO()
    Image.fromarray(frame).save(data, "JPEG", quality=90)
    return data.getvalue()


@pytest.fixture
def live_socket_url(replicated):
    """`/v1/live` served by uvicorn in this process, on the replicas (as app.py serves it behind --replicas)."""
    import uvicorn
    from fastapi import FastAPI

    import ui
    from app_harness import free_port, wait_until

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(FastAPI(routes=ui.live_routes(replicated)), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert wait_until(lambda: server.started, TIMEOUT_S)
    try:
        yield f"ws://127.0.0.1:{port}/v1/live"
    finally:
        server.should_exit = True
        thread.join(TIMEOUT_S)


async def next_of(socket, kind: str) -> dict:
    """The next message of `kind` (the stats sent every second, and others, passed over)."""
    while True:
        message = json.loads(await asyncio.wait_for(socket.recv(), TIMEOUT_S))
        if message["type"] == kind:
            return message


def test_a_bad_frame_behind_the_replicas_does_not_stall_another_sockets_answer(live_socket_url, monkeypatch):
    """Every RemoteLiveSession.stats call (a Ray call, which may wait up to a minute for its replica) is held while
    socket A sends a frame that is not an image and socket B asks its question: B's answer comes. The bad frame's
    branch used to call stats on the server's event loop, which stalled every socket until it returned."""
    from replicas.live import RemoteLiveSession
    from ui.live_frames import NOT_AN_IMAGE

    released = threading.Event()
    stats = RemoteLiveSession.stats

    def held_stats(self):
        assert released.wait(TIMEOUT_S)
        return stats(self)

    monkeypatch.setattr(RemoteLiveSession, "stats", held_stats)
    frames = live_frames(1_000_042)

    async def scenario() -> float:
        async with websockets.connect(live_socket_url) as a, websockets.connect(live_socket_url) as b:
            for index, frame in enumerate(frames[:4]):
                await b.send(struct.pack(">d", index / 2) + jpeg(frame))
            await a.send(struct.pack(">d", 0.0) + b"not an image")
            assert (await next_of(a, "error"))["message"] == NOT_AN_IMAGE
            asked = time.monotonic()
            await b.send(
                json.dumps({"type": "ask", "id": "q1", "question": "What moves?", "params": {"max_new_tokens": 4}})
            )
            done = await next_of(b, "done")
            assert done["id"] == "q1" and done["stats"]["generated_tokens"] == 4
            return time.monotonic() - asked

    try:
        answered_s = asyncio.run(scenario())
    finally:
        released.set()
    print(f"B's answer {answered_s:.2f} s after its question, A's stats held throughout")


def test_a_socket_whose_session_is_lost_goes_on_in_a_new_one_with_one_status_message(
    replicated, live_socket_url, monkeypatch
):
    """The replica forgets the socket's session (as a replacement replica holds none of its predecessor's): the
    next frame finds it lost, and the socket opens a new session and says so once; frames, questions and the
    socket's watch go on (the watch put on the new session: its first answer there, about the new session's first
    group, comes as the same watch's event)."""
    from ui.live_socket import REOPENED

    opened = []
    open_live = replicated.open_live

    def recorded(params=None):
        opened.append(open_live(params))
        return opened[-1]

    monkeypatch.setattr(replicated, "open_live", recorded)
    frames = live_frames(1_000_043)

    async def scenario() -> list[dict]:
        async with websockets.connect(live_socket_url) as socket:
            for index, frame in enumerate(frames[:4]):
                await socket.send(struct.pack(">d", index / 2) + jpeg(frame))
            await socket.send(json.dumps({"type": "stats"}))  # answered once every frame before it is pushed
            assert (await next_of(socket, "stats"))["frames_received"] == 4
            watch = {"type": "watch", "id": "w1", "question": "What moves?", "params": {"max_new_tokens": 2}}
            await socket.send(json.dumps(watch))
            assert (await next_of(socket, "watching"))["id"] == "w1"
            forgotten = replicated.handle.live_close.remote(session=opened[0].session)
            await asyncio.to_thread(forgotten.result, timeout_s=TIMEOUT_S)
            for index, frame in enumerate(frames[4:8], start=4):
                await socket.send(struct.pack(">d", index / 2) + jpeg(frame))
            said = [await next_of(socket, "status")]
            await socket.send(json.dumps({"type": "ask", "id": "q1", "question": "What moves?"}))
            done = event = None
            while done is None or event is None:  # the answer, and the watch's first on the new session
                message = json.loads(await asyncio.wait_for(socket.recv(), TIMEOUT_S))
                if message["type"] == "done":
                    done = message
                elif message["type"] == "watch_event" and message["group"] == 0:  # not the old session's
                    event = message
            return [*said, done, event]

    status, done, event = asyncio.run(scenario())
    assert status["message"] == REOPENED and len(opened) == 2 and opened[1] is not opened[0]
    assert done["stats"]["frames_sampled"] == 2  # the new session's: the frame that found the old one lost is gone
    # the new session's first group: its frames at 0 and 0.5 s of that session (3 and 3.5 s of the socket's)
    assert event["id"] == "w1" and event["t_s"] == 0.5


def test_a_lost_replica_ends_its_live_sessions_with_a_sentence(replicated, videos):
    """Sessions opened until both replicas hold one, the first by a Live tab's feed at its first frames; the one
    holder is killed: its session's next push and question say the session has ended, the other session and
    uploads go on, and the tab's status line says it once, then opens a new session at its next frame after the
    retry delay (its error path used to ask the lost session for its stats, which raised again: the tab kept the
    lost session and never opened another)."""
    import gradio as gr

    from ui.live_feeds import RETRY_S, LiveFeeds

    feeds = LiveFeeds(replicated)
    feed, frames, start = feeds.feed("tab"), live_frames(1_000_041), time.monotonic()
    feed.arrive(frames[0], start, 0.5), feed.arrive(frames[1], start + 0.5, 0.5)
    opened, deadline = [feed.live], time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:  # the replicas take turns; the one killed before may still be coming back
        live = replicated.open_live(params(0.5, 4))
        if live.replica != opened[0].replica:
            opened.append(live)
            break
        live.close()
        time.sleep(0.5)
    assert len({live.replica for live in opened}) == 2
    doomed = opened[0]
    survivor = next(live for live in opened if live.replica != doomed.replica)
    survivor.push(frames[0], 0.0), survivor.push(frames[1], 0.5)
    for live in (doomed, survivor):
        assert live.wait(TIMEOUT_S)
    asked = doomed.ask("What moves?")
    asked.result(TIMEOUT_S)
    where = replicated.placement(asked.request_id)  # the process holding the session
    assert where.replica == doomed.replica
    os.kill(where.pid, signal.SIGKILL)
    with pytest.raises(SessionLost, match=f"^{LIVE_SESSION_LOST}$"):
        doomed.push(frames[2], 1.0)
    with pytest.raises(SessionLost, match=f"^{LIVE_SESSION_LOST}$"):
        doomed.ask("What moves?")
    survivor.push(frames[2], 1.0), survivor.push(frames[3], 1.5)
    assert survivor.wait(TIMEOUT_S)
    assert survivor.ask("What moves?").result(TIMEOUT_S).stats["replica"] == survivor.replica
    feed.arrive(frames[2], start + 1.0, 0.5)  # the tab's next frame finds its session lost
    assert feed.live is None and feed.status().endswith(LIVE_SESSION_LOST)
    feed.arrive(frames[3], start + 1.5, 0.5)  # within the retry delay: no new session yet
    assert feed.live is None
    feed.arrive(frames[4], start + 1.0 + RETRY_S, 0.5)
    assert feed.live is not None and feed.live is not doomed and feed.problem is None
    assert feed.live.stats()["frames_received"] == 1
    feeds.close_session(gr.Request(session_hash="tab"))
    for live in opened[1:]:
        live.close()
    assert replicated.submit(videos.take(), "What moves?", params()).result(TIMEOUT_S).stats["generated_tokens"] == 8
