"""EVS Video Chat: `python app.py [--model ID|tiny-random] [--device auto|cuda|cpu] [--host H] [--port P]`.

Every flag has an environment twin (the flag wins): EVS_MODEL, EVS_DEVICE, EVS_HOST (or GRADIO_SERVER_NAME),
EVS_PORT (or GRADIO_SERVER_PORT), EVS_MAX_FILE_MB, EVS_STRICT_MODEL=1, EVS_TEMP_MAX_AGE_S, EVS_TEMP_CLEAN_S,
EVS_TEMP_MAX_MB, EVS_FETCH_VIDEO_URLS=1, EVS_LIVE_URLS=1, EVS_REPLICAS; the limits of engine/config.py LIMIT_ENV
(EVS_MAX_QUEUE, ...) have variables only. The old names --temp-sweep-s / EVS_TEMP_SWEEP_S still work for one release.

Start-up: check the host first (a GPU that torch cannot use, or --device cuda without one, ends the start
with one line), load the model once (falling back to the offline tiny-trained, with a banner saying why in
one sentence, when the checkpoint cannot be fetched, is not a family the app runs, leaves the GPU too little
memory or is too large for the CPU that --device auto found, unless strict), answer one warm-up
request on a built-in clip, log what runs where, then serve the UI, GET /healthz, GET /metrics, the
OpenAI-compatible /v1/chat/completions and /v1/models, the /v1/live WebSocket, and the MCP server at
/gradio_api/mcp/.
"""

import argparse
import importlib.util
import logging
import os
import resource
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

from fastapi import Response
from fastapi.routing import APIRoute
from huggingface_hub.errors import GatedRepoError, HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError

from engine import Engine, EngineConfig, InputError
from engine.config import MAX_FILE_BYTES, limits_from_env
from engine.errors import one_line
from engine.front.door import request_params
from engine.front.serving import Serving
from engine.loading.device import DeviceUnavailable, choose_device, probe_host
from engine.loading.load import ModelUnavailable, UnsupportedModel, describe_model, is_tiny_model
from engine.memory.dims import GIB
from engine.memory.plan import InsufficientMemory

DEFAULT_MODEL = "Qwen/Qwen3-VL-4B-Instruct"
# The offline model: trained on synthetic clips of moving shapes (train/tiny_trained.py), shipped as weights.
FALLBACK_MODEL = "tiny-trained"
WARMUP_CLIP = Path(__file__).resolve().parent / "assets" / "examples" / "shape_moving.mp4"
WARMUP_TIMEOUT_S = 600.0
EXIT_MODEL_UNAVAILABLE = 3
EXIT_DEVICE_UNAVAILABLE = 4
# Above this a checkpoint runs on the CPU only when asked for with --device cpu: float32 on a CPU serves
# a 4B model at a few tokens a minute, or runs out of memory.
CPU_PARAMETER_LIMIT = 1_000_000_000
# Gradio keeps uploads and generated images forever unless told otherwise, and uploads reach --max-file-mb each.
TEMP_MAX_AGE_S = 3600
TEMP_CLEAN_S = 1800
# ... and bounded in bytes: twenty uploads of the largest size; past it the oldest files go first.
TEMP_MAX_MB = 4096
MB = 1 << 20  # --max-file-mb's unit

log = logging.getLogger("app")


def _env(*names: str, default: str) -> str:
    """The first of `names` set to a non-empty value in the environment, else `default`."""
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return default


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Flags with environment defaults; argparse converts (and checks) string defaults with `type`."""
    parser = argparse.ArgumentParser(
        # Named as it was started: `python app.py`, or the installed `evs-video-chat` (argparse's own default).
        prog="python app.py" if Path(sys.argv[0]).name == "app.py" else None,
        description=__doc__.splitlines()[0],
    )
    parser.add_argument(
        "--model",
        default=_env("EVS_MODEL", default=DEFAULT_MODEL),
        help="Hub id, local folder, random:<Hub id>, tiny-trained, tiny-random or tiny-random-qwen2.5-vl [EVS_MODEL]",
    )
    parser.add_argument(
        "--device", default=_env("EVS_DEVICE", default="auto"), choices=["auto", "cuda", "cpu"], help="[EVS_DEVICE]"
    )
    parser.add_argument(
        "--host",
        default=_env("EVS_HOST", "GRADIO_SERVER_NAME", default="127.0.0.1"),
        help="[EVS_HOST, GRADIO_SERVER_NAME]",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=_env("EVS_PORT", "GRADIO_SERVER_PORT", default="7860"),
        help="[EVS_PORT, GRADIO_SERVER_PORT]",
    )
    parser.add_argument(
        "--max-file-mb",
        type=float,
        default=_env("EVS_MAX_FILE_MB", default=f"{MAX_FILE_BYTES / MB:g}"),
        help="largest upload accepted, in MB [EVS_MAX_FILE_MB]",
    )
    parser.add_argument(
        "--strict-model",
        action="store_true",
        default=_env_flag("EVS_STRICT_MODEL"),
        help="exit instead of falling back to tiny-trained when the model cannot be served "
        "(not fetched, not a supported family, too little GPU memory, too large for the "
        "CPU) [EVS_STRICT_MODEL=1]",
    )
    parser.add_argument(
        "--temp-max-age-s",
        type=int,
        default=_env("EVS_TEMP_MAX_AGE_S", default=str(TEMP_MAX_AGE_S)),
        help="uploads and generated images older than this are deleted [EVS_TEMP_MAX_AGE_S]",
    )
    parser.add_argument(
        "--temp-clean-s",
        type=int,
        default=_env("EVS_TEMP_CLEAN_S", "EVS_TEMP_SWEEP_S", default=str(TEMP_CLEAN_S)),
        help="how often old temporary files are looked for [EVS_TEMP_CLEAN_S]",
    )
    parser.add_argument(
        "--temp-max-mb",
        type=float,
        default=_env("EVS_TEMP_MAX_MB", default=str(TEMP_MAX_MB)),
        help="uploads and generated images together hold at most this many MB; past it the oldest are deleted "
        "first [EVS_TEMP_MAX_MB]",
    )
    # --temp-sweep-s and EVS_TEMP_SWEEP_S: the names before "clean", still read for one release, not in --help.
    parser.add_argument(
        "--temp-sweep-s", type=int, dest="temp_clean_s", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--fetch-video-urls",
        action="store_true",
        default=_env_flag("EVS_FETCH_VIDEO_URLS"),
        help="let /v1/chat/completions fetch http(s) video URLs from public addresses, bounded "
        "by --max-file-mb; off, they are refused (a public server should not fetch "
        "URLs for strangers) [EVS_FETCH_VIDEO_URLS=1]",
    )
    parser.add_argument(
        "--live-urls",
        action="store_true",
        default=_env_flag("EVS_LIVE_URLS"),
        help="let the Live tab read stream URLs (RTSP, RTMP, SRT, HLS, MPEG-TS over HTTP) from public "
        "addresses, in reader processes under the upload limits; off, they are refused (a "
        "public server should not connect to addresses for strangers) [EVS_LIVE_URLS=1]",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=_env("EVS_REPLICAS", default="1"),
        help="engine replicas on Ray Serve, one GPU each (a share of the CPU cores on a CPU); above 1 "
        "starts a local Ray cluster, or joins the one RAY_ADDRESS names [EVS_REPLICAS]",
    )
    parser.add_argument(
        "--replica-deadline-s",
        type=float,
        default=_env("EVS_REPLICA_DEADLINE_S", default="20"),
        help="with --replicas: seconds a replica may send nothing (replicas say they are alive every 2 s while "
        "they work) before its questions end with 'please ask again' and it fails its health check; longer than "
        "the longest prefill on the device [EVS_REPLICA_DEADLINE_S]",
    )
    parser.add_argument(
        "--video-readers",
        type=int,
        default=_env("EVS_VIDEO_READERS", default=None),
        help="warm video reader processes: uploads read at once, and the most parts a long video "
        "is read in; default one per core [EVS_VIDEO_READERS]",
    )
    args = parser.parse_args(argv)
    if args.replicas < 1:
        parser.error("--replicas must be at least 1")
    if not args.replica_deadline_s > 0:
        parser.error("--replica-deadline-s must be above 0")
    if args.video_readers is not None and args.video_readers < 1:
        parser.error("--video-readers must be at least 1")
    if args.max_file_mb <= 0:
        parser.error("--max-file-mb must be above 0")
    if args.temp_max_age_s <= 0 or args.temp_clean_s <= 0 or args.temp_max_mb <= 0:
        parser.error("--temp-max-age-s, --temp-clean-s and --temp-max-mb must be above 0")
    return args


class TooLargeForCpu(RuntimeError):
    """--device auto found no usable GPU, and the checkpoint has too many parameters to serve on the CPU."""

    def __init__(self, parameters: int):
        super().__init__(
            f"no usable GPU was found and it has {parameters / 1e9:.1f} B parameters, too many to "
            f"serve on a CPU; pass --device cpu to run it there anyway"
        )
        self.parameters = parameters


def check_fits_cpu(model: str) -> None:
    """TooLargeForCpu when `model` should not be served on a CPU that --device auto settled for.

    Counts parameters from the config alone (instant, nothing large is read); raises ModelUnavailable
    when not even the config can be had.
    """
    if is_tiny_model(model):
        return
    parameters = describe_model(model)["parameters"]
    if parameters > CPU_PARAMETER_LIMIT:
        raise TooLargeForCpu(parameters)


# Why the app falls back instead of serving the configured model; every other error is a bug and ends the start.
CANNOT_SERVE = (ModelUnavailable, UnsupportedModel, InsufficientMemory, TooLargeForCpu)
# What the Hub client's error beneath a ModelUnavailable means, in a user's words; the first match wins
# (a gated repository is also a RepositoryNotFoundError).
UNAVAILABLE_REASONS = (
    (GatedRepoError, "is gated on the Hugging Face Hub, and this server has no token for it"),
    (
        (RepositoryNotFoundError, HFValidationError),
        "was found neither on this machine nor on the Hugging Face Hub, or it is private",
    ),
    (LocalEntryNotFoundError, "could not be downloaded: no network connection, and no copy on this machine"),
)


def _causes(error: BaseException) -> list[BaseException]:
    """`error` and the errors it was raised from (`raise ... from`), outermost first."""
    chain = [error]
    while (cause := chain[-1].__cause__) is not None and cause not in chain:
        chain.append(cause)
    return chain


def fallback_reason(model: str, error: BaseException) -> str:
    """Why `model` cannot be served (one of CANNOT_SERVE), as one sentence for the page.

    Made from the error's kind alone: the Hub client's messages carry URLs and advice meant for a
    developer, and would widen a phone's page; the log has them (one_line).
    """
    if isinstance(error, TooLargeForCpu):
        return (
            f"No usable GPU was found, and {model} ({error.parameters / 1e9:.1f} B parameters) is too large "
            f"to run on a CPU."
        )
    if isinstance(error, InsufficientMemory):
        return f"The GPU has too little free memory to run {model}."
    if isinstance(error, UnsupportedModel):
        return f"The model {model} is not a kind of model this app can run."
    causes = _causes(error)
    reason = next(
        (reason for kinds, reason in UNAVAILABLE_REASONS if any(isinstance(cause, kinds) for cause in causes)),
        "could not be downloaded or read",
    )
    return f"The model {model} {reason}."


def build_engine(args: argparse.Namespace, device: str, max_file_bytes: int) -> tuple[Serving, str | None]:
    """The engine for `args.model` on `device` ("cuda" | "cpu", already checked), or for the offline
    FALLBACK_MODEL with a banner saying why (fallback_reason) and what it knows; the cause's own message
    goes to the log.

    When strict, a model that cannot be served (CANNOT_SERVE) exits instead, with one message on stderr and
    no traceback: EXIT_DEVICE_UNAVAILABLE for too little GPU memory, else EXIT_MODEL_UNAVAILABLE.
    """
    try:
        limits = limits_from_env()
    except ValueError as error:
        _fail(f"{error}.", code=2)

    def engine_for(model: str) -> Serving:
        config = EngineConfig(
            model=model, device=device, max_file_bytes=max_file_bytes, video_readers=args.video_readers, **limits
        )
        if args.replicas == 1:
            return Engine(config)
        if not is_tiny_model(model):
            describe_model(model)  # the config alone: ModelUnavailable here keeps the offline fallback working
        from replicas import ReplicasUnavailable, ReplicatedEngine  # imports Ray, so only on this path

        try:
            return ReplicatedEngine(
                config, replicas=args.replicas, warm_up_clip=WARMUP_CLIP, deadline_s=args.replica_deadline_s
            )
        except ReplicasUnavailable as error:
            _fail(one_line(error), EXIT_DEVICE_UNAVAILABLE)

    try:
        if device == "cpu" and args.device == "auto":
            check_fits_cpu(args.model)
        return engine_for(args.model), None
    except CANNOT_SERVE as error:
        detail = f"model {args.model} cannot be served ({one_line(error.__cause__ or error)})"
        if args.strict_model:
            _fail(
                f"{detail}; EVS_STRICT_MODEL is set, so the app does not fall back to {FALLBACK_MODEL}.",
                EXIT_DEVICE_UNAVAILABLE if isinstance(error, InsufficientMemory) else EXIT_MODEL_UNAVAILABLE,
            )
        why = fallback_reason(args.model, error)
    # Loaded only past the except block: its traceback holds the failed model, and on a GPU its memory.
    log.warning("falling back to %s: %s", FALLBACK_MODEL, detail)
    try:
        engine = engine_for(FALLBACK_MODEL)
    except (ModelUnavailable, UnsupportedModel, OSError) as error:  # e.g. weights checked out as LFS pointers
        _fail(f"{detail}, and the offline {FALLBACK_MODEL} could not be loaded either ({one_line(error)}).")
    about = engine.model_info["about"] or "a tiny offline model"
    live = f" {engine.model_info['live_about']}" if engine.model_info["live_about"] else ""
    return engine, f"{why} This app runs {FALLBACK_MODEL} instead, {about}.{live}"


def _fail(message: str, code: int = EXIT_MODEL_UNAVAILABLE) -> NoReturn:
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def check_host(requested: str) -> str:
    """Log the host once and return the device to load on ("cuda" | "cpu"), before anything large is
    loaded; exits with EXIT_DEVICE_UNAVAILABLE and one line when the asked-for device cannot be used."""
    report = probe_host()
    log.info("host: %s", report.summary())
    try:
        return choose_device(requested, report).type
    except DeviceUnavailable as error:
        _fail(str(error), EXIT_DEVICE_UNAVAILABLE)


def warm_up(engine: Serving) -> dict:
    """One request on the built-in clip so the first user's TTFT is not a cold start; returns its stats.

    A warm-up that fails (the memory plan refuses even the built-in clip, a timeout) ends the start with
    one line: a server that cannot answer it cannot answer users either. It is no user's request: /metrics
    does not count it.
    """
    if not WARMUP_CLIP.exists():
        log.warning("warm-up skipped: %s is missing (python -m assets.make_examples writes it)", WARMUP_CLIP)
        return {}
    start = time.perf_counter()
    with engine.metrics.uncounted():
        stream = engine.submit(
            video=WARMUP_CLIP,
            question="Which way does the shape move?",
            params=request_params(engine, max_new_tokens=8),
        )
        try:
            stats = stream.result(timeout_s=WARMUP_TIMEOUT_S).stats
        except (InputError, TimeoutError) as error:
            _fail(f"the warm-up request on {WARMUP_CLIP.name} failed: {one_line(error)}", EXIT_DEVICE_UNAVAILABLE)
    log.info(
        "warm-up done in %.2f s (ttft %.2f s, video tokens %s -> %s)",
        time.perf_counter() - start,
        stats.get("ttft_s", float("nan")),
        stats.get("video_tokens_total"),
        stats.get("video_tokens_kept"),
    )
    return stats


def log_runtime(engine: Serving) -> None:
    """Device, dtype, attention implementation and memory in use, once, after the warm-up."""
    info = engine.model_info
    log.info(
        "model %s (%s) on %s, dtype %s, attention: vision tower %s, language model %s%s",
        info["name"],
        info["family"],
        info["device"],
        info["dtype"],
        info["attn_vision"],
        info["attn_text"],
        " [random weights]" if info["random_weights"] else "",
    )
    if info["device"].startswith("cuda") and "replicas" not in info:  # replicas hold the GPUs, not this process
        import torch

        log.info(
            "GPU %s: %.2f GiB allocated, %.2f GiB peak (after warm-up)",
            torch.cuda.get_device_name(),
            torch.cuda.memory_allocated() / GIB,
            torch.cuda.max_memory_allocated() / GIB,
        )
        if info["attn_vision"] == "sdpa":
            absent = importlib.util.find_spec("flash_attn") is None
            log.warning(
                "flash-attn %s and no varlen kernel is available: the vision tower runs sdpa, one call "
                "per frame group (slower on long videos)",
                "is not installed" if absent else "is not used",
            )
    # ru_maxrss is in KiB on Linux.
    log.info("host memory: %.2f GiB peak resident", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2)


def health_route(engine: Serving, fallback: bool) -> APIRoute:
    """GET /healthz -> {"status": "ok", "model": ...}; registered at launch, i.e. only once warm."""
    info = engine.model_info
    body = {
        "status": "ok",
        "model": info["name"],
        "device": info["device"],
        "fallback": fallback,
        "replicas": info.get("replicas", 1),
    }

    def healthz() -> dict:
        return body

    return APIRoute("/healthz", healthz, methods=["GET"])


def metrics_route(engine: Serving) -> APIRoute:
    """GET /metrics -> the engine's counters in Prometheus' text format (engine/front/metrics.py); an Engine's
    or, with --replicas, the ReplicatedEngine client's."""

    def metrics() -> Response:
        body, content_type = engine.metrics.exposition()
        return Response(body, media_type=content_type)

    return APIRoute("/metrics", metrics, methods=["GET"])


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    max_file_bytes = int(args.max_file_mb * MB)
    log.info("starting: model %s, device %s, %s:%d", args.model, args.device, args.host, args.port)

    # On a Ray cluster the GPUs are the replicas' nodes', not necessarily this one's.
    device = args.device if args.replicas > 1 and os.environ.get("RAY_ADDRESS") else check_host(args.device)
    engine, banner = build_engine(args, device, max_file_bytes)
    try:
        warm_up(engine)
        log_runtime(engine)
        # A temp folder of the app's own: the cleaner deletes every old file in it, which would be wrong in
        # the /tmp/gradio that all Gradio apps on a machine share.
        os.environ.setdefault("GRADIO_TEMP_DIR", str(Path(tempfile.gettempdir()) / "evs-video-chat"))
        import ui  # imported once the model is up: a strict start-up failure exits without loading Gradio

        limits = EngineConfig(**limits_from_env())
        demo = ui.build_demo(
            engine,
            banner=banner,
            delete_cache=(args.temp_clean_s, args.temp_max_age_s),
            max_file_bytes=max_file_bytes,
            fetch_video_urls=args.fetch_video_urls,
            live_urls=args.live_urls,
            limits=limits,
        )
        cleaner = ui.start_cleaner(demo, args.temp_clean_s, args.temp_max_age_s, int(args.temp_max_mb * MB))
        launch_kwargs = ui.launch_kwargs(max_file_bytes)
        app_kwargs = dict(launch_kwargs.pop("app_kwargs", None) or {})
        # FastAPI(routes=...) puts these ahead of every route Gradio adds.
        app_kwargs["routes"] = [
            *app_kwargs.get("routes", []),
            health_route(engine, banner is not None),
            metrics_route(engine),
            *ui.openai_routes(engine, max_file_bytes, fetch_video_urls=args.fetch_video_urls),
            *ui.live_routes(engine, limits.max_video_source_pixels, limits.read_timeout_s),
        ]
        # Docker stop and Space restarts send SIGTERM: end like Ctrl-C so Gradio closes its server cleanly.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            demo.launch(server_name=args.host, server_port=args.port, app_kwargs=app_kwargs, **launch_kwargs)
        finally:
            cleaner.stop()
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
