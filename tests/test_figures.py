"""Figures, frame overlays and the stats panel on a synthetic EvsPicture (no engine, no model)."""

import json

import numpy as np
import plotly.io as pio
import pytest

from engine.stats import STATS_KEYS
from engine.stream import EvsPicture
from ui import figures, overlays, stats_panel

# 3 groups of 2x3 tokens; group 0 keeps everything, group 2 keeps nothing.
KEPT = np.array(
    [
        [[1, 1, 1], [1, 1, 1]],
        [[1, 0, 0], [0, 0, 1]],
        [[0, 0, 0], [0, 0, 0]],
    ],
    dtype=bool,
)


def make_picture(height_px: int = 12, width_px: int = 18) -> EvsPicture:
    rng = np.random.default_rng(0)
    dissim = rng.uniform(0.0, 0.5, size=KEPT.shape).astype(np.float16)
    dissim[0] = np.inf
    return EvsPicture(
        frames=rng.integers(0, 256, size=(3, height_px, width_px, 3), dtype=np.uint8),
        timestamps_s=[0.25, 1.25, 2.25],
        grid_thw=(3, 2, 3),
        kept_mask=KEPT,
        dissimilarity=dissim,
    )


def sample_stats(**overrides) -> dict:
    """A done event's stats: every key (engine.stats.Stats), these values, None for keys the cards don't use."""
    values = dict(
        pruning_rate=0.7,
        pruning_method="evs",
        frames_sampled=6,
        sampled_fps=2.0,
        grid_thw=[3, 2, 3],
        video_tokens_total=18,
        video_tokens_kept=8,
        tokens_kept_per_frame=[6, 2, 0],
        prompt_tokens=40,
        prefill_tokens=40,
        generated_tokens=11,
        ttft_s=0.5,
        total_s=1.5,
        read_video_s=0.004,
        vit_s=0.12,
        evs_s=0.0021,
        prefill_s=0.2,
        decode_s=1.0,
        vit_batch_requests=2,
        vit_cache_hit=True,
        prefix_cache_hit=False,
        decode_batch_max=3,
        thinking_tokens=0,
        answer_tokens=11,
    )
    values.update(overrides)
    assert set(values) <= set(STATS_KEYS)
    return {**dict.fromkeys(STATS_KEYS), **values}


def decoded(array_or_list) -> np.ndarray:
    """Plotly keeps numpy arrays in figure objects; read them back as plain arrays."""
    return np.asarray(array_or_list)


# --- bar chart ---------------------------------------------------------------------------------


def test_bars_split_every_group_into_kept_and_pruned():
    fig = figures.tokens_per_group_figure(make_picture())
    kept_bar, pruned_bar = fig.data
    assert kept_bar.name == "kept" and pruned_bar.name == "pruned"
    np.testing.assert_array_equal(decoded(kept_bar.y), [6, 2, 0])
    np.testing.assert_array_equal(decoded(pruned_bar.y), [0, 4, 6])
    assert fig.layout.barmode == "stack"
    assert list(fig.layout.xaxis.ticktext) == ["0.2 s", "1.2 s", "2.2 s"]
    assert "8 of 18 kept (56% pruned)" in fig.layout.title.text


def test_groups_with_the_same_rounded_time_keep_separate_bars():
    picture = make_picture()
    picture = EvsPicture(picture.frames, [0.0, 0.01, 0.02], picture.grid_thw, picture.kept_mask, picture.dissimilarity)
    kept_bar = figures.tokens_per_group_figure(picture).data[0]
    assert len(set(decoded(kept_bar.x).tolist())) == 3


# --- heatmap ---------------------------------------------------------------------------------


def test_heatmap_rows_are_groups_and_first_group_is_blank():
    picture = make_picture()
    heat, kept_dots = figures.dissimilarity_figure(picture).data
    z = decoded(heat.z)
    assert z.shape == (3, 6)
    assert np.isnan(z[0]).all()
    np.testing.assert_allclose(z[1:], picture.dissimilarity[1:].reshape(2, 6).astype(np.float32))
    # one dot per kept token, at (patch, group)
    dots = set(zip(decoded(kept_dots.x).tolist(), decoded(kept_dots.y).tolist()))
    expected = {(p, g) for g, p in zip(*np.nonzero(KEPT.reshape(3, 6)))}
    assert dots == expected


def test_heatmap_of_a_single_group_has_no_finite_values_and_still_builds():
    picture = make_picture()
    one = EvsPicture(picture.frames[:1], [0.25], (1, 2, 3), picture.kept_mask[:1], picture.dissimilarity[:1])
    heat = figures.dissimilarity_figure(one).data[0]
    assert heat.zmax > heat.zmin


# --- API payload -----------------------------------------------------------------------------


def test_payload_is_json_with_compact_arrays_and_round_trips():
    payload = figures.figures_payload(make_picture())
    text = json.dumps(payload, allow_nan=False)
    assert set(payload) == {"tokens_per_group", "dissimilarity"}
    assert '"bdata"' in text  # typed arrays, not long number lists
    assert len(text) < 8000  # no plotly default template in the payload
    fig = pio.from_json(json.dumps(payload["tokens_per_group"]))
    assert [trace.name for trace in fig.data] == ["kept", "pruned"]


# --- frame overlays --------------------------------------------------------------------------


def test_overlay_dims_pruned_patches_and_leaves_kept_ones():
    picture = make_picture()
    frame = picture.frames[1]
    out = overlays.dim_pruned(frame, KEPT[1])
    # 12x18 pixels over 2x3 tokens: token (0, 0) is rows 0-5, cols 0-5 (kept); token (0, 1) is pruned.
    np.testing.assert_array_equal(out[:6, :6], frame[:6, :6])
    expected = np.rint(
        frame[:6, 6:12].astype(np.float32) * overlays.PRUNED_DIM
        + overlays.PRUNED_TINT_RGB * overlays.PRUNED_TINT_WEIGHT
    )
    np.testing.assert_array_equal(out[:6, 6:12], expected.astype(np.uint8))
    assert out.dtype == np.uint8 and out.shape == frame.shape
    assert not np.shares_memory(out, frame)


def test_pixel_mask_covers_frames_that_are_not_a_multiple_of_the_grid():
    mask = overlays.pruned_pixels(KEPT[1], 7, 10)
    # rows 0-3 -> token row 0, rows 4-6 -> row 1; cols 0-3 -> col 0, 4-6 -> col 1, 7-9 -> col 2
    expected = np.zeros((7, 10), dtype=bool)
    expected[:4, 4:] = True  # tokens (0, 1) and (0, 2) pruned
    expected[4:, :7] = True  # tokens (1, 0) and (1, 1) pruned
    np.testing.assert_array_equal(mask, expected)


def test_gallery_captions_give_time_and_kept_count():
    gallery = overlays.frame_gallery(make_picture())
    assert [caption for _, caption in gallery] == ["t=0.2 s · kept 6/6", "t=1.2 s · kept 2/6", "t=2.2 s · kept 0/6"]
    fully_pruned, _ = gallery[2]
    assert fully_pruned.max() <= np.ceil(255 * overlays.PRUNED_DIM + 225 * overlays.PRUNED_TINT_WEIGHT)


def test_the_montage_holds_every_groups_dimmed_frame_in_time_order():
    """The compare view's picture of one request: three 12x18 frames at 18 px wide, two columns, 2 px gaps."""
    picture = make_picture()
    montage = overlays.pruning_montage(picture, side_px=18)
    assert montage.shape == (2 * 12 + 2, 2 * 18 + 2, 3) and montage.dtype == np.uint8
    dimmed = [overlays.dim_pruned(frame, kept) for frame, kept in zip(picture.frames, picture.kept_mask)]
    np.testing.assert_array_equal(montage[:12, :18], dimmed[0])
    np.testing.assert_array_equal(montage[:12, 20:], dimmed[1])
    np.testing.assert_array_equal(montage[14:, :18], dimmed[2])
    assert (montage[14:, 20:] == 255).all() and (montage[12:14] == 255).all()  # the empty cell and the gap
    assert overlays.pruning_montage(picture, side_px=9).shape == (2 * 6 + 2, 2 * 9 + 2, 3)  # scaled down


# --- stats panel -----------------------------------------------------------------------------


@pytest.mark.parametrize("seconds, text", [(None, "—"), (0.0021, "2.1 ms"), (0.12, "120 ms"), (1.5, "1.50 s")])
def test_format_seconds(seconds, text):
    assert stats_panel.format_seconds(seconds) == text


def test_stats_cards_show_the_headline_numbers():
    html = stats_panel.stats_html(sample_stats())
    for fragment in [
        "18 → 8",
        "56% pruned at q=0.70",
        "Prompt tokens",
        ">40<",
        "11 tokens",
        "10.0 tokens/s decode",
        "500 ms",
        "ViT × 2 · decode × 3",
        "features hit · prefix miss",
        "ViT cached · pruning 2.1 ms",
        "56% pruned at q=0.70 by evs",
        "6 frames at 2 fps · grid 3 × 2 × 3",
        "prefilled all 40 prompt tokens; none came from the cache",
    ]:
        assert fragment in html, fragment
    assert "the rest came from" not in html  # nothing did


def test_the_cache_card_says_how_much_of_the_prompt_came_from_the_kv_cache():
    html = stats_panel.stats_html(sample_stats(prefill_tokens=12, prefix_cache_hit=True))
    assert "prefilled 12 of 40 prompt tokens; the other 28 came from the KV cache of this conversation" in html


def test_the_video_stage_splits_reading_from_waiting_for_a_reader():
    html = stats_panel.stats_html(sample_stats(read_video_s=0.05, read_s=0.032, read_wait_s=0.0012))
    assert "video 50 ms (read 32 ms, waited 1.2 ms)" in html
    assert "(read" not in stats_panel.stats_html(sample_stats(read_s=0.0, read_wait_s=0.0))  # a cache hit


def test_stage_times_show_the_vit_time_when_the_features_were_not_cached():
    assert "ViT 120 ms · pruning" in stats_panel.stats_html(sample_stats(vit_cache_hit=False))


def test_decode_speed_is_unknown_for_a_single_token():
    assert stats_panel.decode_tokens_per_s(sample_stats(generated_tokens=1)) is None
    assert "—" in stats_panel.stats_html(sample_stats(generated_tokens=1))


@pytest.mark.parametrize(
    "soundtrack, card",
    [
        ("heard", "heard 2.0 s"),
        ("cut", "heard the first 2.0 s"),
        ("off", "Hear the soundtrack is off"),
        ("none", "no sound to hear"),
        ("unreadable", "could not be read"),
        ("unsupported", None),
    ],
)
def test_the_soundtrack_card_says_what_was_heard(soundtrack, card):
    """A card for a model that hears: how much, with its tokens all kept, or why nothing; none for a model that
    cannot hear, where it would only say so."""
    heard = soundtrack in ("heard", "cut")
    html = stats_panel.stats_html(
        sample_stats(soundtrack=soundtrack, audio_tokens=26 if heard else 0, audio_seconds=2.0 if heard else 0.0)
    )
    assert ("Soundtrack" in html) == (card is not None)
    if card:
        assert card in html
    if heard:
        assert "26 audio tokens, all kept" in html


def test_placeholder_before_any_answer():
    assert stats_panel.stats_html(None) == stats_panel.PLACEHOLDER_HTML


def test_compare_summary_states_savings():
    full = sample_stats(pruning_rate=0.0, prompt_tokens=50, ttft_s=1.0, video_tokens_kept=18)
    pruned = sample_stats(prompt_tokens=40, ttft_s=0.5)
    text = stats_panel.compare_summary(full, pruned)
    assert "**10 tokens shorter**" in text and "(2.0× faster)" in text
    assert "(2.0× slower)" in stats_panel.compare_summary(pruned | {"pruning_rate": 0.0}, full | {"pruning_rate": 0.7})
