"""Where a request is in the engine. Its own module so that the scheduler, which moves requests between
stages, needs neither torch nor the request's tensors to do it."""

import enum


class Stage(enum.Enum):
    """Where a request is; any stage can end in FINISHED.

    QUEUED: prepared (frames read, prompt built), waiting for a decode slot.
    ENCODING: admitted, its vision forward not yet run.
    PREFILLING: features and EVS done, its prompt not yet through the language model.
    DECODING: a row of the decode batch.
    FINISHED: its stream has ended (answered, cancelled or failed) and it holds no tensors.
    """

    QUEUED = "queued"
    ENCODING = "encoding"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    FINISHED = "finished"
