"""An upload's soundtrack as a reader process reads it (engine/reading/decoders/pyav_soundtrack.py) and sends it
(engine/reading/soundtrack.py), and the audio input it becomes for Nemotron-H Omni (engine/prompt/audio.py), against
transformers' processor and the tiny model directly.

The clips are muxed with PyAV (tests/sound_clips.py: H.264 and an audio stream from a numpy waveform), which
every host that reads videos has; the engine's path to the model (the reader's pipe, the prompt, the stats) is
tested in tests/test_soundtrack_engine.py."""

import json
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest
import torch

from engine.prompt.audio import audio_token_count, min_soundtrack_samples, processor_audio, soundtrack_rate_hz
from engine.reading.decoders.pyav_soundtrack import MonoResampler, read_soundtrack
from engine.reading.soundtrack import soundtrack_from_message, soundtrack_message
from sound_clips import FPS, SECONDS, tone, write_clip_with_sound

ENGINE_DIR = Path(__file__).resolve().parent.parent / "engine"
MODEL = "tiny-random-nemotron-omni"
RATE_HZ = 16000  # the Parakeet feature extractor's rate, which the reader resamples to


def strongest_hz(samples: np.ndarray, rate_hz: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples))
    return float(np.fft.rfftfreq(len(samples), 1 / rate_hz)[spectrum.argmax()])


def level_at(samples: np.ndarray, rate_hz: int, hz: float) -> float:
    """Amplitude of the `hz` component: the projection on a sine and a cosine at that frequency."""
    time_s = np.arange(len(samples)) / rate_hz
    return float(
        np.hypot(samples @ np.sin(2 * np.pi * hz * time_s), samples @ np.cos(2 * np.pi * hz * time_s))
        * 2
        / len(samples)
    )


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("soundtracks")
    rate = 44100
    return {
        "tone": write_clip_with_sound(folder / "tone.mp4", tone(440, SECONDS, 22050)[None], 22050),
        "silent": write_clip_with_sound(folder / "silent.mp4", None),
        # 440 Hz on the left only, 660 Hz on the right only: a mono track that kept one channel lacks one tone.
        "stereo": write_clip_with_sound(
            folder / "stereo.mp4", np.stack([tone(440, SECONDS, rate), tone(660, SECONDS, rate, 0.25)]), rate
        ),
        "opus": write_clip_with_sound(
            folder / "opus.mkv",
            tone(440, SECONDS, 48000)[None].repeat(2, 0),
            48000,
            container="matroska",
            codec="libopus",
        ),
        "pcm": write_clip_with_sound(
            folder / "pcm.mov", tone(440, SECONDS, 8000)[None], 8000, container="mov", codec="pcm_s16le"
        ),
        "long": write_clip_with_sound(folder / "long.mp4", tone(440, 6.0, RATE_HZ)[None], RATE_HZ, seconds=6.0),
        # Speech-like noise: white noise whose loudness comes and goes four times a second, like syllables.
        "noise": write_clip_with_sound(
            folder / "noise.mp4",
            (
                np.random.default_rng(0).uniform(-0.5, 0.5, round(SECONDS * RATE_HZ))
                * np.abs(np.sin(np.pi * 4 * np.arange(round(SECONDS * RATE_HZ)) / RATE_HZ))
            )[None],
            RATE_HZ,
        ),
    }


@pytest.mark.parametrize("name", ["tone", "stereo", "opus", "pcm"])
def test_one_second_resampler_frames_change_no_sample(clips, name):
    """The resampler hands back one-second frames (far fewer arrays to convert than one per decoded frame): the
    samples must be those of a resampler giving a frame out per frame in, to the bit, the stream's tail included."""
    with av.open(str(clips[name])) as container:
        resampler = av.AudioResampler(format="flt", layout="mono", rate=RATE_HZ)
        outs = [out for frame in container.decode(audio=0) for out in resampler.resample(frame)]
        outs += resampler.resample(None)
    reference = np.concatenate([out.to_ndarray().reshape(-1) for out in outs])
    np.testing.assert_array_equal(read_soundtrack(clips[name], RATE_HZ, max_seconds=60.0).samples, reference)


@pytest.mark.parametrize("name", ["tone", "stereo", "opus", "pcm"])
def test_skipping_the_video_probe_changes_no_sample(clips, name, monkeypatch):
    """read_soundtrack opens files without decoding video frames while probing: the samples must be a full
    open's, to the bit."""
    unprobed = read_soundtrack(clips[name], RATE_HZ, max_seconds=60.0)
    plain_open = av.open
    monkeypatch.setattr(av, "open", lambda path, **_: plain_open(path))  # the reference: a full probe
    probed = read_soundtrack(clips[name], RATE_HZ, max_seconds=60.0)
    np.testing.assert_array_equal(unprobed.samples, probed.samples)


@pytest.mark.parametrize("name", ["tone", "opus", "pcm"])
def test_a_tone_comes_back_mono_at_the_asked_rate_for_the_clips_length(clips, name):
    """AAC at 22,050 Hz in MP4, Opus at 48,000 Hz stereo in Matroska, PCM at 8,000 Hz in MOV: each resampled
    to 16,000 Hz, one channel, as long as the video within one frame (encoders pad their last frame and prime
    the first), the tone still at 440 Hz (a wrong rate would move it)."""
    soundtrack = read_soundtrack(clips[name], RATE_HZ, max_seconds=60.0)
    assert soundtrack.rate_hz == RATE_HZ and not soundtrack.cut
    assert soundtrack.samples.dtype == np.float32 and soundtrack.samples.ndim == 1
    assert abs(soundtrack.seconds - SECONDS) <= 1 / FPS
    assert abs(strongest_hz(soundtrack.samples, RATE_HZ) - 440) <= 1


def test_a_stereo_track_at_44_1_khz_is_downmixed_and_resampled(clips):
    soundtrack = read_soundtrack(clips["stereo"], RATE_HZ, max_seconds=60.0)
    assert soundtrack.rate_hz == RATE_HZ and soundtrack.samples.ndim == 1
    assert abs(soundtrack.seconds - SECONDS) <= 1 / FPS
    left, right = level_at(soundtrack.samples, RATE_HZ, 440), level_at(soundtrack.samples, RATE_HZ, 660)
    # FFmpeg's downmix: each front channel times 1/sqrt(2); so both tones, in the ratio they were written.
    assert left == pytest.approx(0.5 / np.sqrt(2), rel=0.05) and right == pytest.approx(0.25 / np.sqrt(2), rel=0.05)


def test_a_file_without_an_audio_stream_has_no_soundtrack(clips):
    assert read_soundtrack(clips["silent"], RATE_HZ, max_seconds=60.0) is None


def test_the_soundtrack_is_bounded_by_the_seconds_asked(clips):
    """A 6 s track read for 1.25 s is exactly 20,000 samples and says it was cut; read for longer, it is whole."""
    cut = read_soundtrack(clips["long"], RATE_HZ, max_seconds=1.25)
    assert len(cut.samples) == 20000 and cut.cut
    whole = read_soundtrack(clips["long"], RATE_HZ, max_seconds=6.5)
    np.testing.assert_array_equal(cut.samples, whole.samples[:20000])
    assert not whole.cut and abs(whole.seconds - 6.0) <= 1 / FPS


def test_a_stream_that_changes_rate_and_layout_midway_is_resampled_throughout():
    """PyAV's resampler refuses a frame unlike its first; a broadcast may switch from stereo 48 kHz to mono
    44.1 kHz mid-stream, so the second part goes through a resampler of its own, after the first is flushed."""
    mono = MonoResampler(RATE_HZ)
    parts = []
    for rate, layout, channels in ((48000, "stereo", 2), (44100, "mono", 1)):
        waveform = np.ascontiguousarray(tone(440, 0.5, rate)[None].repeat(channels, 0), dtype=np.float32)
        frame = av.AudioFrame.from_ndarray(waveform, format="fltp", layout=layout)
        frame.sample_rate = rate
        parts += mono.convert(frame)
    samples = np.concatenate(parts + mono.flush())
    assert abs(len(samples) - RATE_HZ) <= 2  # 0.5 s + 0.5 s at 16 kHz, but for the resampler's rounding


def test_the_soundtrack_crosses_the_pipe_unchanged(clips):
    soundtrack = read_soundtrack(clips["tone"], RATE_HZ, max_seconds=60.0)
    fields, payload = soundtrack_message(soundtrack)
    fields = json.loads(json.dumps(fields))  # the header is a JSON line
    back = soundtrack_from_message(fields, payload.tobytes())
    np.testing.assert_array_equal(back.samples, soundtrack.samples)
    assert (back.rate_hz, back.cut) == (soundtrack.rate_hz, soundtrack.cut)
    with pytest.raises(ValueError):
        soundtrack_from_message({**fields, "samples": fields["samples"] + 1}, payload.tobytes())
    # On the pipe the samples follow frames of any number of bytes: read from an odd address, they come back
    # aligned, as numpy and torch kernels expect.
    pipe = np.zeros(3 + payload.nbytes, np.uint8)
    pipe[3:] = payload.view(np.uint8)
    shifted = soundtrack_from_message(fields, pipe[3:])
    assert shifted.samples.flags.aligned
    np.testing.assert_array_equal(shifted.samples, soundtrack.samples)


def test_the_reader_reads_soundtracks_without_torch_and_the_engine_holds_them_without_pyav(clips):
    """Under a bare `engine` package, as engine/reading/pool.py's READER_PROGRAM starts a reader: reading a
    soundtrack loads neither torch nor transformers (seconds and hundreds of MB a reader), and what the engine's
    process imports to hold one and make it the processor's input loads no PyAV (the readers' alone)."""
    program = f"""
import json, sys, types
package = types.ModuleType("engine")
package.__path__ = [{str(ENGINE_DIR)!r}]
sys.modules["engine"] = package
import engine.prompt.audio, engine.reading.soundtrack
engine_side = "av" in sys.modules
from engine.reading.decoders.pyav_soundtrack import read_soundtrack
soundtrack = read_soundtrack({str(clips["tone"])!r}, {RATE_HZ}, 60.0)
print(json.dumps({{"samples": len(soundtrack.samples), "engine_side_pyav": engine_side,
                  "reader_heavy": sorted(name for name in ("torch", "transformers") if name in sys.modules)}}))
"""
    found = json.loads(
        subprocess.run([sys.executable, "-c", program], capture_output=True, check=True, text=True, timeout=120).stdout
    )
    assert not found["engine_side_pyav"] and found["reader_heavy"] == [] and found["samples"] > 0


@pytest.fixture(scope="module")
def omni(tiny_models):
    loaded, _ = tiny_models(MODEL)
    return loaded.model, loaded.processor


def test_the_reader_resamples_to_the_rate_the_processor_takes(omni):
    _, processor = omni
    assert soundtrack_rate_hz(processor) == RATE_HZ == processor.audio_sampling_rate


@pytest.mark.parametrize("samples", [320, 321, 1279, 1280, 16000, 16161, 32322])
def test_audio_tokens_are_counted_as_the_processor_writes_them_and_the_tower_gives_them(omni, samples):
    """The count the engine plans with (audio_token_count) against the `<so_embedding>` tokens the processor
    writes between `<so_start>` and `<so_end>`, and the rows the model's audio tower returns for them."""
    model, processor = omni
    audio = processor_audio(processor, tone(440, samples / RATE_HZ, RATE_HZ).astype(np.float32), RATE_HZ)
    inputs = processor(
        text=["<|im_start|>user\n<so_embedding>\nWhat do you hear?<|im_end|>\n"], return_tensors="pt", **audio
    )
    text = processor.tokenizer.decode(inputs["input_ids"][0])
    written = text.count(processor.audio_token)
    with torch.inference_mode():
        rows = model.get_audio_features(inputs["input_features"], inputs["input_features_mask"]).pooler_output
    assert audio_token_count(processor, samples) == written == len(rows)
    assert f"<so_start>{processor.audio_token * written}<so_end>" in text
    assert torch.isfinite(inputs["input_features"]).all() and torch.isfinite(rows).all()


def test_a_soundtrack_too_short_to_hear_or_at_another_rate_is_not_an_input(omni):
    _, processor = omni
    shortest = min_soundtrack_samples(processor)
    assert processor_audio(processor, np.zeros(shortest - 1, np.float32), RATE_HZ) is None
    assert processor_audio(processor, np.zeros(shortest, np.float32), RATE_HZ) is not None
    with pytest.raises(ValueError):
        processor_audio(processor, np.zeros(RATE_HZ, np.float32), 44100)
    with pytest.raises(ValueError):
        processor_audio(processor, np.zeros((2, RATE_HZ), np.float32), RATE_HZ)


def media_inputs(processor, soundtrack) -> dict:
    """The processor's inputs for 8 frames and the soundtrack, in the first user turn: the video, then its
    soundtrack, then the question (the order engine.prompt.unpruned.chat_text writes them in)."""
    frames = np.stack([np.full((64, 64, 3), 30 * index, np.uint8) for index in range(8)])
    text = (
        "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<video>\n<so_embedding>\nWhat is said?<|im_end|>\n"
        "<|im_start|>assistant\n<think></think>"
    )
    return processor(
        text=[text],
        videos=[frames],
        return_tensors="pt",
        **processor_audio(processor, soundtrack.samples, soundtrack.rate_hz),
    )


def test_the_model_hears_the_soundtrack_beside_the_video(omni, clips):
    """Read from a clip and fed with its frames, a soundtrack becomes audio tokens the language model attends to:
    another soundtrack (speech-like noise for the tone) moves the answer's logits."""
    model, processor = omni
    soundtracks = {name: read_soundtrack(clips[name], RATE_HZ, max_seconds=60.0) for name in ("tone", "noise")}
    logits = {}
    for name, soundtrack in soundtracks.items():
        inputs = media_inputs(processor, soundtrack)
        ids = inputs["input_ids"][0]
        assert int((ids == processor.audio_token_id).sum()) == audio_token_count(processor, len(soundtrack.samples)) > 0
        with torch.inference_mode():
            logits[name] = model(**inputs).logits[0, -1]
    assert (logits["tone"] - logits["noise"]).abs().max() > 1e-3


def test_the_models_own_evs_drops_video_tokens_only(omni, clips):
    """transformers' forward prunes image tokens, then scatters the audio features onto the `<so_embedding>`
    tokens that remain, which it checks are as many as the features: at q = 0.5 every audio token is still
    there, and the sequence is shorter by video tokens alone. The engine's per-request EVS must do the same."""
    model, processor = omni
    inputs = media_inputs(processor, read_soundtrack(clips["tone"], RATE_HZ, max_seconds=60.0))
    ids = inputs["input_ids"][0]
    video_tokens = int((ids == model.config.image_token_id).sum())
    saved, model.video_pruning_rate = model.video_pruning_rate, 0.5
    try:
        with torch.inference_mode():
            length = model(**inputs).logits.shape[1]
    finally:
        model.video_pruning_rate = saved
    assert len(ids) - video_tokens < length < len(ids)
