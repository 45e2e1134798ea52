"""EVS Video Chat engine: video in, EVS-pruned prompt, batched streaming generation out."""

from .config import EngineConfig, FrameSampling, GenerationParams
from .engine import Engine
from .errors import BusyError, InputError
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
    "STATS_KEYS",
    "Stream",
]
