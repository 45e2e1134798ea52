"""The q sweep through gradio_client: one question at several rates as one burst (one ViT forward)."""

import json

import pytest
from gradio_client import handle_file

import pruning
from app_harness import wait_until
from ui.sweep import BAD_METHODS, BAD_RATES, DEFAULT_RATES, TABLE_HEADERS, TOO_MANY


def rows_by_header(table: dict) -> list[dict]:
    return [dict(zip(table["headers"], row)) for row in table["data"]]


def test_a_sweep_answers_at_each_rate_from_one_vit_forward(app, clip):
    video = clip("scene_cut", seconds=2.5)  # a clip no other test encodes: its features are not cached
    forwards = app.spy.engine.vision.forwards
    table, figure, answers_html = app.client.predict(
        handle_file(str(video)), "What changes?", max_new_tokens=5, api_name="/sweep"
    )

    assert app.spy.engine.vision.forwards == forwards + 1
    assert table["headers"] == TABLE_HEADERS
    rows = rows_by_header(table)
    assert [row["q"] for row in rows] == list(DEFAULT_RATES)
    assert {row["method"] for row in rows} == {"evs"}  # the default
    streams = app.spy.streams[-len(DEFAULT_RATES) :]
    stats = [stream.result().stats for stream in streams]
    assert sorted(s["pruning_rate"] for s in stats) == list(DEFAULT_RATES)
    for row in rows:
        match = next(s for s in stats if s["pruning_rate"] == row["q"])
        num_groups, h, w = match["grid_thw"]
        assert row["video tokens kept"] == pruning.retained_token_count(h * w, num_groups, row["q"])
        assert row["answer"] and row["TTFT (s)"] > 0 and row["prefill (s)"] > 0
        assert row["requests in the ViT forward"] == len(DEFAULT_RATES)  # all five shared the one forward
    kept = [row["video tokens kept"] for row in rows]
    assert kept == sorted(kept, reverse=True) and kept[0] > kept[-1]
    assert all(s["decode_batch_max"] == len(DEFAULT_RATES) for s in stats)  # the answers decoded together

    plot = json.loads(figure["plot"])
    assert [trace["name"] for trace in plot["data"]] == ["video tokens kept", "TTFT", "prefill"]
    assert plot["data"][0]["x"] == ["0", "0.3", "0.5", "0.7", "0.9"]
    assert answers_html.count('class="evs-answer-card"') == len(DEFAULT_RATES)


def test_the_rates_are_configurable(app, clip):
    table, _, answers_html = app.client.predict(
        handle_file(str(clip("moving_object"))), "What moves?", "0.6, 0.2", max_new_tokens=3, api_name="/sweep"
    )
    assert [row["q"] for row in rows_by_header(table)] == [0.2, 0.6]
    assert answers_html.count('class="evs-answer-card"') == 2


def test_a_sweep_runs_every_method_at_every_rate_from_one_vit_forward(app, clip):
    video = clip("pan", seconds=2.0, size=(176, 144))  # a clip no other test encodes
    forwards = app.spy.engine.vision.forwards
    table, figure, answers_html = app.client.predict(
        handle_file(str(video)),
        "What moves?",
        "0.5, 0.9",
        max_new_tokens=3,
        methods="uniform, evs, vidcom2",
        api_name="/sweep",
    )
    assert app.spy.engine.vision.forwards == forwards + 1
    rows = rows_by_header(table)
    assert [(row["q"], row["method"]) for row in rows] == [
        (q, method) for q in (0.5, 0.9) for method in ("uniform", "evs", "vidcom2")
    ]
    stats = [stream.result().stats for stream in app.spy.streams[-6:]]
    num_groups, h, w = stats[0]["grid_thw"]
    for row in rows:
        assert row["video tokens kept"] == pruning.kept_token_count(row["method"], h * w, num_groups, row["q"])
        assert row["requests in the ViT forward"] == 6
    plot = json.loads(figure["plot"])
    assert [trace["name"] for trace in plot["data"]] == [
        "kept · uniform",
        "kept · evs",
        "kept · vidcom2",
        "TTFT · uniform",
        "TTFT · evs",
        "TTFT · vidcom2",
    ]
    assert answers_html.count('class="evs-answer-card"') == 6 and "vidcom2 · q = 0.9" in answers_html


@pytest.mark.parametrize(
    "rates, methods, message",
    [
        ("0.5", "fastvid", "The pruning method must be evs, vidcom2 or uniform; got 'fastvid'."),
        ("0.5", "evs, vidcom2, uniform, evs2", BAD_METHODS),
        ("0, 0.1, 0.2, 0.3, 0.4, 0.5", "evs, vidcom2, uniform", TOO_MANY),
    ],
)
def test_bad_methods_come_back_as_one_sentence(app, clip, rates, methods, message):
    before = len(app.spy.streams)
    with pytest.raises(Exception) as caught:
        app.client.predict(
            handle_file(str(clip("moving_object"))), "What moves?", rates, methods=methods, api_name="/sweep"
        )
    assert str(caught.value) == message
    assert wait_until(lambda: all(stream.finished for stream in app.spy.streams[before:]), timeout_s=30)


@pytest.mark.parametrize(
    "rates, message",
    [
        ("fast, slow", BAD_RATES),
        ("0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8", BAD_RATES),
        ("0, 1", "The pruning rate must be a number at least 0 and below 1; got 1.0."),
    ],
)
def test_bad_rates_come_back_as_one_sentence(app, clip, rates, message):
    before = len(app.spy.streams)
    with pytest.raises(Exception) as caught:
        app.client.predict(handle_file(str(clip("moving_object"))), "What moves?", rates, api_name="/sweep")
    assert str(caught.value) == message
    # None left running: the rates submitted before the refused one are cancelled, and a cancelled request
    # ends at the worker's next step (or when its reading ends), not at once.
    assert wait_until(lambda: all(stream.finished for stream in app.spy.streams[before:]), timeout_s=30)


def test_cancelling_a_sweep_cancels_every_rate(app, clip):
    before = len(app.spy.streams)
    job = app.client.submit(
        handle_file(str(clip("pan"))), "Talk for a long time.", max_new_tokens=1024, api_name="/sweep"
    )
    streams = app.spy.streams
    assert wait_until(lambda: len(streams) == before + len(DEFAULT_RATES), timeout_s=60)

    def answering() -> bool:  # a card shows text instead of its "…" placeholder
        return any(
            isinstance(cards, str) and cards.count("<i>…</i>") < len(DEFAULT_RATES) for _, _, cards in job.outputs()
        )

    assert wait_until(answering, timeout_s=60)
    job.cancel()
    assert wait_until(lambda: all(stream.finished for stream in streams[before:]), timeout_s=30)
    assert all(stream.cancelled for stream in streams[before:])
