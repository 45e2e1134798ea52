"""EVS Video Chat engine: video in, EVS-pruned prompt, batched streaming generation out.

The path of one request, by the types it passes through, and the room (sub-package) that owns each step:

    upload (a path)
      -> front/       checks the question and settings (checks.py); every way in uses the front door (door.py)
      -> reading/     read in a reader process: SampledVideo (sampled frames, times, soundtrack)   [video.py]
      -> prompt/      the HF processor's output as the UnprunedPrompt (token ids, MRoPE positions) [unpruned.py]
                      -- the two steps above run on a prepare thread (prepare.py), before the GPU
      -> scheduling/  a Request, moved QUEUED -> ENCODING -> PREFILLING -> DECODING -> FINISHED
      -> worker/      the vision tower: VideoFeatures (vision.py; a family says how, families/)
      -> prompt/      the request's pruning method (EVS by default; pruning/) keeps a mask of tokens: the
                      PrunedPrompt, positions taken from the unpruned layout                           [pruned.py]
      -> worker/      prefill and shared decode steps (runner.py) on the language model's state:
      -> state/       LMState (KV and recurrent layers), in the DecodeBatch and the PrefixCache
      -> worker/      token choice (token_choice.py), then events (events.py) onto the request's
      -> Stream       status, the pruning picture, thinking and answer text, and the done event's stats

A live session (Engine.open_live; docs/live.md) takes the same rooms another way: live/ checks and samples each
pushed frame by capture time and makes each temporal group's pixels on the caller's thread (session.py,
frames.py); worker/ encodes the groups in the shared vision forward, prunes each with causal EVS as it arrives
(pruning/causal.py: the one method with a causal form, so front/ refuses a session another method) and prefills
it into the session's own state (live.py), its window of the last groups laid out as the upload of those frames
would be, opened by a whole key group (live/layout.py, live/window.py); a question forks that state (scheduling/
admits it once its groups are in) and decodes with everyone else, and so does each ask of a standing question
(live/watch.py), made when something in view changed, below users' questions. live_sessions.py, at the top,
opens sessions and turns their questions into requests.

Beside the path: memory/ plans how much fits on the device, loading/ picks the device and kernels and loads a
model by name, checkpoints/ builds models without the Hub (tiny and random-weight ones). At the top of the
package: the public names below and the small modules every room shares (config, errors, stats, stream, lru,
detokenize). docs/architecture.md says the same at length.
"""

from .config import EngineConfig, FrameSampling, GenerationParams
from .engine import Engine
from .errors import BusyError, InputError, SessionEnded
from .live.session import LiveSession
from .live.watch import Watch, WatchEvent
from .stats import STATS_KEYS
from .stream import Answer, Event, EvsPicture, Stream

__all__ = [
    "Answer",
    "BusyError",
    "Engine",
    "EngineConfig",
    "Event",
    "EvsPicture",
    "FrameSampling",
    "GenerationParams",
    "InputError",
    "LiveSession",
    "STATS_KEYS",
    "SessionEnded",
    "Stream",
    "Watch",
    "WatchEvent",
]
