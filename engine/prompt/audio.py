"""A soundtrack's samples (engine/reading/soundtrack.py, read in the reader process) as the audio input of a
Nemotron-H Omni processor (transformers' `nemotron_h_omni`), on the engine's side of the pipe.

The processor takes mono float32 samples at its feature extractor's rate (ParakeetFeatureExtractor: 16,000 Hz,
a mel frame every 160 samples), and expands one `<so_embedding>` in the text into `<so_start>`, one
`<so_embedding>` per audio token, `<so_end>`; the model scatters its audio tower's output onto those tokens
after its own EVS has dropped video tokens, so EVS never touches them.
"""

import math

import numpy as np


def soundtrack_rate_hz(processor) -> int:
    """The rate, in Hz, the processor's feature extractor takes samples at: the rate the reader resamples to."""
    return int(processor.feature_extractor.sampling_rate)


def min_soundtrack_samples(processor) -> int:
    """The fewest samples the feature extractor turns into finite features: it normalises every mel bin by its
    mean and sample variance over the clip's real mel frames (samples // hop of them), which needs two."""
    return 2 * processor.feature_extractor.hop_length


def audio_token_count(processor, samples: int) -> int:
    """`<so_embedding>` tokens the processor writes for a soundtrack of `samples` samples, which the audio tower
    gives as many rows of. It is the processor's own estimate, written out so the engine can count audio tokens
    before running it (the memory plan, the context check)."""
    return audio_tokens(samples, processor.audio_hop_length, processor.audio_subsampling_factor)


def audio_tokens(samples: int, hop_length: int, subsampling_factor: int) -> int:
    """audio_token_count's arithmetic, from the sizes alone (the memory plan of a checkpoint has no processor):
    1 + samples // hop_length mel frames (a centred STFT), then log2(subsampling_factor) stride-2 convolutions
    (kernel 3, padding 1), each of which halves the frames, rounding up."""
    frames = 1 + samples // hop_length
    for _ in range(int(math.log2(subsampling_factor))):
        frames = -(-frames // 2)
    return frames


def processor_audio(processor, samples: np.ndarray, rate_hz: int) -> dict | None:
    """The keyword arguments that add a soundtrack to a processor call (`processor(text=..., videos=...,
    **these)`): its samples, and their rate, which the feature extractor checks against its own. The text must
    then hold one `processor.audio_token` where the audio goes.

    samples: (n,) float32 mono at rate_hz. None when the soundtrack is too short to hear (under
    min_soundtrack_samples: 20 ms at 16,000 Hz). ValueError when rate_hz is not the extractor's rate (the
    reader resamples to soundtrack_rate_hz) or samples is not one channel.
    """
    if rate_hz != soundtrack_rate_hz(processor):
        raise ValueError(f"the soundtrack is at {rate_hz} Hz; the processor takes {soundtrack_rate_hz(processor)} Hz")
    if samples.ndim != 1:
        raise ValueError(f"a soundtrack is one channel of samples, not an array of shape {samples.shape}")
    if len(samples) < min_soundtrack_samples(processor):
        return None
    return {"audio": [samples], "sampling_rate": rate_hz}
