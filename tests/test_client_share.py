"""A share of the queue per client (engine/front/shares.py): one client sending as many requests as the queue
holds gets its share and is told to wait for the rest, and a second client is still admitted. Through the Engine
API, and through a launched app: two gradio_client sessions, and OpenAI callers from two addresses."""

import base64
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from gradio_client import Client, handle_file

from app_harness import launched_app, wait_until
from engine import BusyError, Engine, EngineConfig, GenerationParams
from engine.errors import QUEUE_FULL
from engine.front.shares import CLIENT_BUSY

SHARE = 2
MAX_QUEUE = 6
PARAMS = GenerationParams(pruning_rate=0.5, max_new_tokens=3)


def test_one_client_gets_its_share_and_the_others_are_still_admitted(tiny_cache_dir, clip):
    config = EngineConfig(
        model="tiny-random", device="cpu", cache_dir=tiny_cache_dir, max_queue=4, max_client_requests=SHARE
    )
    video = clip("moving_object")
    with Engine(config) as engine:
        with engine.paused():  # nothing ends meanwhile: every request holds its place
            mine = [engine.submit(video, f"Mine {i}?", PARAMS, client="tab a") for i in range(SHARE)]
            with pytest.raises(BusyError) as refused:
                engine.submit(video, "One more?", PARAMS, client="tab a")
            assert str(refused.value) == CLIENT_BUSY.format(count=SHARE)
            theirs = engine.submit(video, "Theirs?", PARAMS, client="tab b")
            unnamed = engine.submit(video, "From Python?", PARAMS)  # a caller that names no client takes no share
            with pytest.raises(BusyError, match=f"^{QUEUE_FULL}$"):  # the queue's own bound still holds
                engine.submit(video, "Anyone?", PARAMS, client="tab c")
        for stream in [*mine, theirs, unnamed]:
            assert stream.result(60).stats["generated_tokens"] == 3
        # Its requests ended: the client has its share back.
        assert engine.submit(video, "Again?", PARAMS, client="tab a").result(60).stats["generated_tokens"] == 3
        assert engine.metrics.requests.labels("refused")._value.get() == 2


def data_url(path: Path) -> str:
    return f"data:video/mp4;base64,{base64.b64encode(Path(path).read_bytes()).decode()}"


def openai_client(url: str, address: str) -> openai.OpenAI:
    """An OpenAI client whose connections come from `address` (any 127.x.y.z reaches the app on 127.0.0.1)."""
    http = httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=120)
    return openai.OpenAI(base_url=f"{url}v1", api_key="unused", max_retries=0, http_client=http)


def test_through_the_app_a_session_and_an_address_each_get_their_share(tiny_cache_dir, clip):
    """Admission held (engine.paused): gradio_client session A asks 4 times, 2 are taken and 2 told to wait; session
    B is taken. An OpenAI caller at 127.0.0.1 asks 3 times, 2 are taken and the third gets 429 with the sentence; a
    caller at 127.0.0.2 is taken. Then every taken request is answered."""
    video = clip("pan")
    url_video = data_url(video)
    with launched_app(tiny_cache_dir, max_queue=MAX_QUEUE, max_client_requests=SHARE) as running:
        spy, engine = running.spy, running.spy.engine
        sessions = [Client(running.url, verbose=False) for _ in range(2)]
        callers = [openai_client(running.url, address) for address in ("127.0.0.1", "127.0.0.2")]

        def ask_openai(caller, question: str):
            content = [{"type": "video_url", "video_url": {"url": url_video}}, {"type": "text", "text": question}]
            return caller.chat.completions.create(
                model="tiny-random", messages=[{"role": "user", "content": content}], max_tokens=3, temperature=0
            )

        with ThreadPoolExecutor(4) as pool:
            with engine.paused():
                jobs = [
                    sessions[0].submit(handle_file(str(video)), f"A {i}?", 0.5, max_new_tokens=3, api_name="/ask")
                    for i in range(4)
                ]
                assert wait_until(lambda: sum(job.done() for job in jobs) == 2 and len(spy.streams) == SHARE)
                refused = [job for job in jobs if job.done()]
                for job in refused:
                    with pytest.raises(Exception, match=CLIENT_BUSY.format(count=SHARE).replace(".", r"\.")):
                        job.result()
                other = sessions[1].submit(handle_file(str(video)), "B?", 0.5, max_new_tokens=3, api_name="/ask")
                assert wait_until(lambda: len(spy.streams) == SHARE + 1)
                first = [pool.submit(ask_openai, callers[0], f"First {i}?") for i in range(SHARE)]
                assert wait_until(lambda: len(spy.streams) == 2 * SHARE + 1)
                with pytest.raises(openai.RateLimitError) as caught:
                    ask_openai(callers[0], "One more?")
                assert caught.value.body["message"] == CLIENT_BUSY.format(count=SHARE)
                second = pool.submit(ask_openai, callers[1], "From elsewhere?")
                assert wait_until(lambda: len(spy.streams) == 2 * SHARE + 2)
            taken = [job for job in jobs if job not in refused]
            for job in [*taken, other]:
                _, stats, _, _ = job.result(timeout=120)
                assert stats["generated_tokens"] == 3
            for reply in [future.result(timeout=120) for future in [*first, second]]:
                assert reply.usage.completion_tokens == 3
        for session in sessions:
            session.close()
