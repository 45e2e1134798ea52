"""The one place the app makes a `gr.Error`: whatever a Gradio handler raised, as the sentence its user reads.

An InputError is the user's mistake and carries its own sentence; anything else is a bug, logged here, and
the user reads SERVER_FAULT. Neither shows a traceback.
"""

import contextlib
import functools
import inspect
import logging

import gradio as gr

from engine.errors import SERVER_FAULT, InputError

log = logging.getLogger(__name__)


def gradio_error(error: BaseException) -> gr.Error:
    if isinstance(error, InputError):
        return gr.Error(str(error), print_exception=False)
    log.error("request failed", exc_info=error)
    return gr.Error(SERVER_FAULT, print_exception=False)


def _count_refusal(owner, error: BaseException) -> None:
    """A refusal the form's own checks made (an InputError the engine did not count: no upload, settings that
    are not numbers) counted in /metrics as refused at the front door, when the handler's owner has an engine."""
    engine = getattr(owner, "engine", None)
    if isinstance(error, InputError) and engine is not None:
        engine.metrics.refused(error, "front_door")


def raises_gradio_errors(handler):
    """`handler` (a coroutine or async generator function, a method) raising gradio_error(...) instead of its
    own errors, a refusal counted (_count_refusal). The wrapper keeps its signature and docstring, from which
    Gradio reads the API and the MCP tool."""
    if inspect.isasyncgenfunction(handler):

        @functools.wraps(handler)
        async def streaming(*args, **kwargs):
            try:
                # aclosing: when Gradio stops iterating (Stop, a closed tab), the handler's own `finally`
                # runs at once and cancels its engine requests.
                async with contextlib.aclosing(handler(*args, **kwargs)) as updates:
                    async for update in updates:
                        yield update
            except Exception as error:
                _count_refusal(args[0] if args else None, error)
                raise gradio_error(error) from None

        return streaming

    @functools.wraps(handler)
    async def answering(*args, **kwargs):
        try:
            return await handler(*args, **kwargs)
        except Exception as error:
            _count_refusal(args[0] if args else None, error)
            raise gradio_error(error) from None

    return answering
