"""HOOK for the video-decoding scenario, which lives in bench/decoding.py (written separately).

bench/decoding.py provides `decoding_scenario(quick: bool, keep: Path | None) -> dict` (32 frames read from a
generated 2-minute 1080p long-GOP H.264 file, made in `keep` unless it is there already). Until that module exists the
report says the scenario was skipped; when it raises, the report says it failed (and `python -m bench` exits 1 after
saving everything else). If the module also provides `markdown(result, targets) -> str`, that is its table;
otherwise one key/value table.
"""

import importlib
import traceback

from .markdown import table

MODULE = "bench.decoding"
SKIPPED = "skipped"  # the result's key when the module is not there
FAILED = "failed"  # the result's key when the scenario raised: the other scenarios' figures are still saved


def decoding_results(quick: bool, keep=None) -> dict:
    try:
        module = importlib.import_module(MODULE)
    except ModuleNotFoundError as error:
        if error.name != MODULE:
            raise
        return {SKIPPED: "bench/decoding.py is not there yet"}
    try:
        return module.decoding_scenario(quick, keep)
    except Exception as error:
        traceback.print_exc()
        return {FAILED: f"{type(error).__name__}: {error}"}


def markdown(result: dict, targets: list[dict] = ()) -> str:
    if SKIPPED in result or FAILED in result:
        return "\n".join(f"{key}: {value}" for key, value in result.items())
    own = getattr(importlib.import_module(MODULE), "markdown", None)
    if own is not None:
        return own(result, targets)
    return table(["measure", "value"], [[key, value] for key, value in result.items()])
