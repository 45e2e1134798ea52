"""Errors a user caused (anything else raised by the engine is a bug), and how any error reads in one line."""


def one_line(error: BaseException | str) -> str:
    """The message with its whitespace folded: one line for a log, a banner or an `error:` exit."""
    return " ".join(str(error).split())


class InputError(ValueError):
    """A problem with what the user sent; the message is one sentence meant for them."""


class BusyError(InputError):
    """The admission queue is full; the user should try again shortly."""


RESTARTING = "The server is restarting; please try again in a minute."
QUEUE_FULL = "The server is busy with other videos right now; please try again in a minute."
