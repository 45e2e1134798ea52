"""What travels from a replica to the client: each engine event, and each error, as plain picklable data.

Plain dicts of str, numbers, lists and numpy arrays, not the engine's dataclasses, so that what crosses
Ray's object store does not depend on how engine.stream's classes are defined on the other side.

Messages a replica yields, in order, for one call:
    {"kind": "hello", "replica": str, "pid": int, "node": str}      once, first: who is answering
    {"kind": "alive"}                                                 every TICK_S without another message, while
                                                                      the replica's engine worker turns
    {"index": i, "kind": "status" | "thinking" | "text", "text": str}
    {"index": i, "kind": "evs", "evs": {...EvsPicture fields...}}
    {"index": i, "kind": "done", "stats": dict, "token_ids": list[int], "logits": ndarray | None}
    {"index": i, "kind": "error", "error": "input" | "busy" | "lost" | "ended" | "runtime", "message": str}
`index` is the request's position in the call (a burst submitted under `paused()` is one call). The done
event's stats carry one more key than the engine's, `replica`: the Serve replica id that answered.
"""

from engine.errors import BusyError, InputError, SessionEnded, SessionLost
from engine.stream import Event, EvsPicture

HELLO = "hello"
ALIVE = "alive"
ERROR = "error"

TEXT_KINDS = ("status", "thinking", "text")  # the events that carry only text


def event_to_wire(index: int, event: Event, replica: str) -> dict:
    """One engine event of request `index` as plain data; a done event's stats gain `replica`."""
    message = {"index": index, "kind": event.kind}
    if event.kind in TEXT_KINDS:
        message["text"] = event.text
    elif event.kind == "evs":
        picture = event.evs
        message["evs"] = {
            "frames": picture.frames,
            "timestamps_s": list(picture.timestamps_s),
            "grid_thw": tuple(picture.grid_thw),
            "kept_mask": picture.kept_mask,
            "dissimilarity": picture.dissimilarity,
            "medium": picture.medium,
        }
    elif event.kind == "done":
        message["stats"] = {**(event.stats or {}), "replica": replica}
        message["token_ids"] = list(event.token_ids)
        message["logits"] = event.logits
    return message


def event_from_wire(message: dict) -> Event:
    """The engine Event a replica's message stands for (not for hello or error messages)."""
    kind = message["kind"]
    if kind in TEXT_KINDS:
        return Event(kind, message["text"])
    if kind == "evs":
        picture = message["evs"]
        return Event(
            "evs",
            evs=EvsPicture(
                frames=picture["frames"],
                timestamps_s=list(picture["timestamps_s"]),
                grid_thw=tuple(picture["grid_thw"]),
                kept_mask=picture["kept_mask"],
                dissimilarity=picture["dissimilarity"],
                medium=picture.get("medium", 0),
            ),
        )
    if kind == "done":
        return Event("done", stats=message["stats"], token_ids=tuple(message["token_ids"]), logits=message["logits"])
    raise ValueError(f"not an engine event: {kind!r}")


def error_to_wire(index: int, error: BaseException) -> dict:
    """A request's failure as plain data: the engine's one sentence and which kind of error it was."""
    if isinstance(error, SessionLost):
        kind = "lost"
    elif isinstance(error, SessionEnded):
        kind = "ended"
    elif isinstance(error, BusyError):
        kind = "busy"
    elif isinstance(error, InputError):
        kind = "input"
    else:
        kind = "runtime"
    return {"index": index, "kind": ERROR, "error": kind, "message": str(error)}


def error_from_wire(message: dict) -> Exception:
    """The exception the client's stream raises: the same class family and sentence as a local engine's."""
    kinds = {
        "busy": BusyError,
        "input": InputError,
        "lost": SessionLost,
        "ended": SessionEnded,
        "runtime": RuntimeError,
    }
    return kinds.get(message["error"], RuntimeError)(message["message"])
