"""Errors a user caused (anything else raised by the engine is a bug), the sentences more than one way in
says, and how any error reads in one line."""


def one_line(error: BaseException | str) -> str:
    """The message with its whitespace folded: one line for a log, a banner or an `error:` exit."""
    return " ".join(str(error).split())


class InputError(ValueError):
    """A problem with what the user sent; the message is one sentence meant for them."""


class BusyError(InputError):
    """The admission queue is full; the user should try again shortly."""


class SessionEnded(InputError):
    """A live session has ended (closed, the engine shutting down, a fault on the server): it takes nothing more,
    and a new one must be opened to go on. The message is the sentence saying why."""


class SessionLost(BusyError, SessionEnded):
    """Behind the replicas: the replica holding a live session is gone (or never held it), and the session with
    it; a new one can be opened at once, on a replica that is up."""


RESTARTING = "The server is restarting; please try again in a minute."
QUEUE_FULL = "The server is busy with other videos right now; please try again in a minute."
SHUTTING_DOWN = "The engine is shutting down."
LIVE_SESSION_LOST = "The server restarted the part of it that held this live session; please open a new one to go on."
# What a user reads for a bug: the log has the traceback.
SERVER_FAULT = "Something went wrong on the server; please try again."
NO_VIDEO = "Please upload a video or a picture."
EXPIRED_VIDEO = "This video is no longer on the server (uploads are deleted after a while); please upload it again."
BAD_NUMBERS = "The pruning rate, fps, frame, pixel and token limits and temperature must be numbers."
BAD_HISTORY = "The conversation history must be a list of (question, answer) pairs."
