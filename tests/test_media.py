"""Several videos and pictures in one question, through the Engine: the prompt is the one the model's own
processor writes for them all and q = 0 answers as stock `generate` does; EVS prunes each video as if it were
asked about alone and never a picture; each medium is read and encoded once; a burst mixing one video, two
videos and pictures decodes as each request alone; bad uploads get one sentence.

The stock side of the first tests is transformers' own: the processor called once with every medium (the
text its chat template writes), the model's `generate`. Nemotron-H Omni's forward scatters a picture's
features onto every `<image>` token, a video's tubelets included, so it cannot take both in one prompt: its
picture is checked alone, and through one forward over the prompt and the engine's answer, since its
`generate` hands the picture's pixels to every decode step too (transformers 5.24)."""

import json
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.video_utils import VideoMetadata

import engine.prepare
from engine import Engine, EngineConfig, GenerationParams, InputError
from engine.config import DEFAULT_SYSTEM_PROMPT, FrameSampling
from engine.families.nemotron import NemotronOmni
from engine.prompt.unpruned import chat_text, processor_frame_positions
from engine.reading.media import StillImage, read_medium

# 8 frames = 4 temporal groups of at most 224x224 pixels: for Qwen2.5-VL the videos' temporal extent (3
# positions) stays below their spatial one, where stock transformers' text-after-video offset agrees with the
# original Qwen rule (docs/architecture.md, "Positions").
FRAME_SAMPLING = FrameSampling(fps=4.0, max_frames=8, max_pixels_per_frame=224 * 224)
QUESTION = "What differs between them?"
TOKENS = 8
TEMPLATE_VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"  # what the chat template writes for a video


def params(q: float, tokens: int = TOKENS) -> GenerationParams:
    return GenerationParams(pruning_rate=q, max_new_tokens=tokens, ignore_eos=True, return_logits=True)


def make_engine(name: str, cache_dir, **overrides) -> Engine:
    return Engine(
        EngineConfig(model=name, device="cpu", cache_dir=cache_dir, frame_sampling=FRAME_SAMPLING, **overrides)
    )


@pytest.fixture(scope="module")
def files(clip, tmp_path_factory):
    """name -> path: two clips of one length and size, a shorter one, a picture."""
    picture = tmp_path_factory.mktemp("pictures") / "picture.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (200, 260, 3), np.uint8)).save(picture)
    return {
        "A": clip("moving_object", seconds=2.0, size=(224, 224)),
        "B": clip("pan", seconds=2.0, size=(224, 224)),
        "short": clip("scene_cut", seconds=1.0, fps=8, size=(192, 160)),
        "P": picture,
    }


def stock_prompt(loaded, family, media, question: str) -> dict:
    """The processor's own inputs for the media in order and the question: its chat template's text (a Qwen3-VL
    or Qwen3.5 video written as the family writes it, the template's markers left to the processor's per-group
    ones; the tiny Nemotron-H Omni shares the Qwen models' byte tokenizer and its template, so its text is the
    family's), one call with every medium."""
    if not isinstance(family, NemotronOmni):
        content = [{"type": "image" if isinstance(m, StillImage) else "video"} for m in media]
        messages = [
            {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
            {"role": "user", "content": [*content, {"type": "text", "text": question}]},
        ]
        text = loaded.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        text = text.replace(TEMPLATE_VIDEO, family.video_placeholder()) + family.answer_opening(False)
    else:
        placeholders = "".join(
            family.image_placeholder() if isinstance(m, StillImage) else family.video_placeholder() for m in media
        )
        text = chat_text(family, DEFAULT_SYSTEM_PROMPT, question, [], media=placeholders)
    videos = [m for m in media if not isinstance(m, StillImage)]
    images = [m.pixels for m in media if isinstance(m, StillImage)]
    processor, video_kwargs = family.sized_processor(
        loaded.processor, len(videos[0].frames) if videos else 2, FRAME_SAMPLING.max_pixels_per_frame
    )
    image_kwargs = family.image_processor_kwargs(loaded.processor, FRAME_SAMPLING.max_pixels_per_frame)
    metadata = [
        VideoMetadata(
            total_num_frames=v.total_frames,
            fps=v.native_fps,
            duration=v.duration_s,
            frames_indices=processor_frame_positions(v),
            height=v.frames.shape[1],
            width=v.frames.shape[2],
        )
        for v in videos
    ]
    return processor(
        text=[text],
        videos=[v.frames for v in videos] or None,
        video_metadata=metadata or None,
        images=images or None,
        do_sample_frames=False,
        return_tensors="pt",
        videos_kwargs=video_kwargs,
        images_kwargs=image_kwargs,
    )


CASES = [
    ("tiny-random", ("A", "B")),
    ("tiny-random", ("A", "P")),
    ("tiny-random-qwen2.5-vl", ("A", "B")),
    ("tiny-random-qwen2.5-vl", ("P", "A")),
    ("tiny-random-qwen3.5", ("A", "B")),
    ("tiny-random-qwen3.5", ("A", "P")),
    ("tiny-random-nemotron-omni", ("A", "B")),
    ("tiny-random-nemotron-omni", ("P",)),
]
# Qwen3-VL and Qwen2.5-VL at the logit level; the hybrid models (Qwen3.5, Nemotron-H Omni) at the token level, as
# their stock recurrent kernels sum in another order than a prefill in segments.
LOGIT_LEVEL = {"tiny-random", "tiny-random-qwen2.5-vl"}


@pytest.mark.parametrize("name, names", CASES)
def test_q0_equals_stock_generate_with_the_processors_own_prompt(name, names, files, tiny_models, tiny_cache_dir):
    loaded, family = tiny_models(name)
    media = [read_medium(files[n], FRAME_SAMPLING, max_seconds=60, max_bytes=10**8, timeout_s=60) for n in names]
    inputs = stock_prompt(loaded, family, media, QUESTION)
    with make_engine(name, tiny_cache_dir) as engine:
        answer = engine.submit(media=[files[n] for n in names], question=QUESTION, params=params(0.0)).result(300)
    assert [m["kind"] for m in answer.stats["media"]] == ["image" if n == "P" else "video" for n in names]
    length = inputs["input_ids"].shape[1]
    assert answer.stats["prompt_tokens"] == length
    model = loaded.model
    saved = getattr(model, "video_pruning_rate", None)  # Nemotron-H Omni's own EVS, off for stock
    if saved is not None:
        model.video_pruning_rate = 0.0
    try:
        with torch.inference_mode():
            if names == ("P",) and saved is not None:
                fed = torch.tensor([answer.token_ids[:-1]])
                ids = torch.cat([inputs["input_ids"], fed], dim=1)
                out = model(**{**inputs, "input_ids": ids, "attention_mask": torch.ones_like(ids)})
                tokens = out.logits[0, length - 1 :].argmax(-1).tolist()
            else:
                stock = model.generate(
                    **inputs,
                    max_new_tokens=TOKENS,
                    min_new_tokens=TOKENS,
                    do_sample=False,
                    output_logits=True,
                    return_dict_in_generate=True,
                )
                tokens = stock.sequences[0, length:].tolist()
    finally:
        if saved is not None:
            model.video_pruning_rate = saved
    assert list(answer.token_ids) == tokens
    if name in LOGIT_LEVEL:
        torch.testing.assert_close(torch.from_numpy(answer.logits), torch.cat(stock.logits).float(), atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def qwen3(tiny_cache_dir):
    with make_engine("tiny-random", tiny_cache_dir) as running:
        yield running


def pictures(stream) -> dict[int, object]:
    """{medium index: EvsPicture} of a request's evs events."""
    return {event.evs.medium: event.evs for event in stream if event.kind == "evs"}


def test_each_video_keeps_what_it_keeps_alone_and_a_picture_keeps_every_token(qwen3, files):
    """Two videos of different lengths and a picture between them at q = 0.7: each video's kept count and mask
    are those of the video asked about alone (its first group whole, K from its own tokens), the picture's
    tokens are all kept, and the totals are the videos' sums."""
    q = 0.7
    alone = {
        n: pictures(qwen3.submit(media=[files[n]], question=QUESTION, params=params(q, 1))) for n in ("A", "short")
    }
    stream = qwen3.submit(media=[files["A"], files["P"], files["short"]], question=QUESTION, params=params(q, 1))
    together = pictures(stream)
    stats = stream.result().stats
    assert sorted(together) == [0, 2]  # one picture per video, none for the still image
    for index, n in ((0, "A"), (2, "short")):
        np.testing.assert_array_equal(together[index].kept_mask, alone[n][0].kept_mask)
        assert stats["media"][index]["tokens_kept"] == int(alone[n][0].kept_mask.sum())
        assert stats["media"][index]["tokens_kept"] < stats["media"][index]["tokens_total"]
    image = stats["media"][1]
    assert image["kind"] == "image" and image["tokens_kept"] == image["tokens_total"] > 0
    assert stats["video_tokens_kept"] == stats["media"][0]["tokens_kept"] + stats["media"][2]["tokens_kept"]
    assert stats["video_tokens_total"] == stats["media"][0]["tokens_total"] + stats["media"][2]["tokens_total"]
    # the lengths differ, so one K over both videos would not keep each one's own count
    assert together[0].grid_thw[0] != together[2].grid_thw[0]


# (media, q): one video, two videos, a picture before a video, a picture alone; no two share media and q, so no
# row reuses another's state.
WORKLOAD = [(("A",), 0.5), (("A", "B"), 0.7), (("P", "B"), 0.3), (("P",), 0.0), (("B", "A"), 0.0)]


def test_a_burst_of_one_video_two_videos_and_pictures_equals_each_alone(files, tiny_cache_dir):
    def ask(engine, names, q):
        return engine.submit(media=[files[n] for n in names], question=QUESTION, params=params(q, 12))

    with make_engine("tiny-random", tiny_cache_dir) as engine:
        alone = [ask(engine, names, q).result(120) for names, q in WORKLOAD]
    with make_engine("tiny-random", tiny_cache_dir) as engine:
        with engine.paused():
            streams = [ask(engine, names, q) for names, q in WORKLOAD]
        burst = [stream.result(120) for stream in streams]
    assert all(answer.stats["decode_batch_max"] == 1 for answer in alone)
    assert all(answer.stats["decode_batch_max"] == len(WORKLOAD) for answer in burst)
    assert len({answer.stats["prompt_tokens"] for answer in burst}) == len(WORKLOAD)
    for (names, _q), got, want in zip(WORKLOAD, burst, alone):
        assert got.token_ids == want.token_ids, names
        torch.testing.assert_close(torch.from_numpy(got.logits), torch.from_numpy(want.logits), atol=2e-5, rtol=0)


def test_a_then_a_and_b_reads_and_encodes_a_once_and_the_same_file_twice_once(
    files, tiny_cache_dir, monkeypatch, tmp_path
):
    reads, encoded = [], []
    real_read = engine.prepare.read_medium

    def counting_read(path, *args, **kwargs):
        reads.append(path)
        return real_read(path, *args, **kwargs)

    monkeypatch.setattr(engine.prepare, "read_medium", counting_read)
    copy = tmp_path / "same-bytes.mp4"
    copy.write_bytes(files["short"].read_bytes())
    with make_engine("tiny-random", tiny_cache_dir) as running:
        real_encode = running.family.encode_media
        monkeypatch.setattr(
            running.family, "encode_media", lambda model, media: encoded.append(len(media)) or real_encode(model, media)
        )
        running.submit(media=[files["A"]], question=QUESTION, params=params(0.5, 1)).result(120)
        second = running.submit(media=[files["A"], files["B"]], question=QUESTION, params=params(0.5, 1)).result(120)
        assert reads == [str(files["A"]), str(files["B"])] and encoded == [1, 1]
        assert not second.stats["vit_cache_hit"]  # B was encoded for it
        twice = running.submit(media=[files["short"], copy], question=QUESTION, params=params(0.5, 1)).result(120)
    assert reads[2:] == [str(files["short"])] and encoded[2:] == [1]  # the same bytes: one read, one encode
    assert [m["tokens_kept"] for m in twice.stats["media"]][0] == twice.stats["media"][1]["tokens_kept"]


def bomb_png(path, side: int = 40_000):
    """A PNG whose header says side x side RGB pixels (a decompression bomb), with a few rows of data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = zlib.compress(b"\x00" + bytes(3 * side) * 1, 9)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", rows)
        + chunk(b"IEND", b"")
    )
    return path


@pytest.mark.parametrize(
    "make, sentence",
    [
        (
            lambda p: p.write_text("These are notes, not a video.\n" * 20),
            "Upload 2 of 2: The file could not be read as a video or a picture.",
        ),
        (lambda p: p.write_bytes(b""), "Upload 2 of 2: The file is empty."),
        (bomb_png, "Upload 2 of 2: The picture is 40000x40000 (1600 megapixels); the limit is 50 megapixels."),
        # Below one token (tiny Qwen3-VL: 16-pixel patches, merged 2 x 2): the processor would blow it up, and
        # take a 1- or 3-pixel-high one for channels first ("The channel dimension is ambiguous").
        (
            lambda p: Image.new("RGB", (1, 1), (255, 0, 0)).save(p, "PNG"),
            "Upload 2 of 2: The picture is 1x1 pixels; this model reads pictures with each side at least 32 pixels "
            "(one token); send a larger one.",
        ),
        (
            lambda p: Image.new("RGB", (40, 3), (255, 0, 0)).save(p, "PNG"),
            "Upload 2 of 2: The picture is 40x3 pixels; this model reads pictures with each side at least 32 pixels "
            "(one token); send a larger one.",
        ),
    ],
)
def test_a_bad_upload_among_the_media_gets_one_sentence_and_the_engine_serves_on(
    qwen3, files, tmp_path, make, sentence
):
    bad = tmp_path / "upload.png"
    make(bad)
    with pytest.raises(InputError) as refused:
        qwen3.submit(media=[files["A"], bad], question=QUESTION, params=params(0.5, 1)).result(120)
    assert str(refused.value) == sentence
    assert qwen3.submit(media=[files["B"], files["P"]], question=QUESTION, params=params(0.5, 1)).result(120).text


def test_more_media_than_the_limit_are_refused_before_any_work(qwen3, files):
    assert qwen3.max_media == qwen3.model_info["max_media"] == 4  # a CPU's default
    with pytest.raises(
        InputError,
        match=r"^5 videos and pictures were sent; this server takes at most 4 in one "
        r"question\.$",
    ):
        qwen3.submit(media=[files["A"]] * 5, question=QUESTION)
    with pytest.raises(InputError, match="not both"):
        qwen3.submit(video=files["A"], media=[files["B"]], question=QUESTION)


def test_the_command_line_takes_several_videos_and_pictures_in_order(files, tiny_cache_dir, capsys, monkeypatch):
    from engine.__main__ import main

    monkeypatch.setenv("EVS_CACHE_DIR", str(tiny_cache_dir))
    assert (
        main(
            [
                "--video",
                str(files["A"]),
                "--image",
                str(files["P"]),
                "--video",
                str(files["short"]),
                "--question",
                QUESTION,
                "--model",
                "tiny-random",
                "--device",
                "cpu",
                "--max-new-tokens",
                "2",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    stats = json.loads(printed[printed.index("{") :])
    assert [m["kind"] for m in stats["media"]] == ["video", "image", "video"]
    assert (
        main(
            [
                "--image",
                str(files["P"]),
                "--image",
                str(files["P"]),
                "--question",
                " ",
                "--model",
                "tiny-random",
                "--device",
                "cpu",
            ]
        )
        == 2
    )
    assert "Please type a question" in capsys.readouterr().err


def test_a_follow_up_on_the_same_media_reuses_the_conversation_and_a_new_medium_is_appended(qwen3, files):
    """The same uploads in the same order: the follow-up prefills only what follows the cached conversation.
    A picture added for the follow-up goes after them (a new conversation for the prefix cache), and the answer
    is what the same conversation asked cold gives."""
    first = qwen3.submit(media=[files["A"], files["B"]], question=QUESTION, params=params(0.5, 4)).result(120)
    history = [(QUESTION, first.text)]
    again = qwen3.submit(
        media=[files["A"], files["B"]], question="And then?", params=params(0.5, 4), history=history
    ).result(120)
    assert again.stats["prefix_cache_hit"] and again.stats["prefill_tokens"] < again.stats["prompt_tokens"] / 4
    added = qwen3.submit(
        media=[files["A"], files["B"], files["P"]], question="And the picture?", params=params(0.5, 4), history=history
    ).result(120)
    assert [m["kind"] for m in added.stats["media"]] == ["video", "video", "image"]
    assert not added.stats["prefix_cache_hit"]
    with make_engine("tiny-random", qwen3.config.cache_dir, prefix_cache_bytes=0) as cold:
        want = cold.submit(
            media=[files["A"], files["B"], files["P"]],
            question="And the picture?",
            params=params(0.5, 4),
            history=history,
        ).result(120)
    assert added.token_ids == want.token_ids
    torch.testing.assert_close(torch.from_numpy(added.logits), torch.from_numpy(want.logits), atol=2e-5, rtol=0)
