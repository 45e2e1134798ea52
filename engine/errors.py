"""Errors a user caused. Anything else raised by the engine is a bug."""


class InputError(ValueError):
    """A problem with what the user sent; the message is one sentence meant for them."""


class BusyError(InputError):
    """The admission queue is full; the user should try again shortly."""
