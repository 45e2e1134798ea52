"""A real app for the app and browser tests: the tiny-model engine on CPU behind a launched demo."""

import json
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from gradio_client import Client
from prometheus_client.parser import text_string_to_metric_families

import ui
from app import health_route, metrics_route
from engine import Engine, EngineConfig, Stream
from live_helpers import RecordedLive

MAX_FILE_BYTES = 1_000_000
MAX_VIDEO_S = 4.0


class SubmitSpy:
    """The real engine, keeping every stream it hands out so tests can see cancellation, and what each was asked
    (`asked`: submit's keyword arguments, history among them); with record_live, every live session it opens as a
    `RecordedLive` (tests/live_helpers.py), which keeps the frames pushed to it."""

    def __init__(self, engine: Engine, record_live: bool = False):
        self.engine, self.record_live = engine, record_live
        self.streams: list[Stream] = []
        self.asked: list[dict] = []
        self.live_sessions: list[RecordedLive] = []

    @property
    def model_info(self) -> dict:
        return self.engine.model_info

    @property
    def default_frame_sampling(self):
        return self.engine.default_frame_sampling

    @property
    def frame_sampling_limits(self):
        return self.engine.frame_sampling_limits

    @property
    def metrics(self):
        return self.engine.metrics

    def paused(self, *args, **kwargs):
        return self.engine.paused(*args, **kwargs)

    def open_live(self, params=None):
        live = self.engine.open_live(params)
        if not self.record_live:
            return live
        self.live_sessions.append(RecordedLive(live, params))
        return self.live_sessions[-1]

    def submit(self, *args, **kwargs) -> Stream:
        stream = self.engine.submit(*args, **kwargs)
        self.asked.append(kwargs)
        self.streams.append(stream)
        return stream


@dataclass
class RunningApp:
    url: str
    client: Client
    spy: SubmitSpy
    demo: object = None  # the launched gr.Blocks


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def launched_app(cache_dir: Path, model: str = "tiny-random", record_live: bool = False, **engine_settings):
    """A demo on a free port around a tiny-model engine on CPU, with /healthz, /metrics, the OpenAI routes, the /v1/live
    WebSocket and the MCP server as app.py serves them; closed and shut down afterwards. record_live: the spy
    records its live sessions (SubmitSpy). engine_settings: EngineConfig fields (max_queue; read_timeout_s is also
    /v1/live's idle time, as in app.py)."""
    engine = Engine(
        EngineConfig(model=model, device="cpu", cache_dir=cache_dir, max_video_seconds=MAX_VIDEO_S, **engine_settings)
    )
    spy = SubmitSpy(engine, record_live)
    demo = ui.build_demo(spy, max_file_bytes=MAX_FILE_BYTES)
    try:
        routes = [
            health_route(spy, False),
            metrics_route(spy),
            *ui.openai_routes(spy, MAX_FILE_BYTES),
            *ui.live_routes(spy, engine.config.max_video_source_pixels, engine.config.read_timeout_s),
        ]
        _, url, _ = demo.launch(
            prevent_thread_lock=True,
            server_name="127.0.0.1",
            server_port=free_port(),
            quiet=True,
            app_kwargs={"routes": routes},
            **ui.launch_kwargs(MAX_FILE_BYTES),
        )
        assert demo.mcp_server, demo.mcp_error  # Gradio only prints why its MCP server did not start
        yield RunningApp(url=url, client=Client(url, verbose=False), spy=spy, demo=demo)
    finally:
        demo.close()
        engine.shutdown()


def wait_until(condition, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def strict_json(text: str | bytes):
    """json.loads that refuses NaN, Infinity and -Infinity, which Python writes and reads but JSON has not: a
    browser's JSON.parse throws on them."""

    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def parse_metrics(text: str) -> dict[tuple, float]:
    """A /metrics body as {(sample name, sorted (label, value) pairs): value}."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape_metrics(url: str) -> dict[tuple, float]:
    """GET /metrics of a launched app, checked to be served as Prometheus text, parsed."""
    response = httpx.get(f"{url.rstrip('/')}/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    return parse_metrics(response.text)


def outcomes(samples: dict[tuple, float]) -> dict[str, float]:
    """evs_requests_total of a scrape, by outcome."""
    return {dict(labels)["outcome"]: value for (name, labels), value in samples.items() if name == "evs_requests_total"}
