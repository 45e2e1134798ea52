"""The committed tiny-trained model answers held-out clips, and EVS costs what it should.

Held-out clips of assets/shapes.py go through the Engine as H.264 MP4s, greedy, exact-match answers
(bench/accuracy.py's code). The thresholds are the issue's; the weights are trained by
`python -m train.tiny_trained` and never in CI.
"""

from pathlib import Path

import pytest
import torch

import engine.runner
from assets.make_examples import EXAMPLES, EXAMPLES_DIR
from assets.shapes import QUESTIONS, held_out_seeds, shape_clip, write_shape_clip
from bench import accuracy as accuracy_bench
from engine import Engine, EngineConfig, GenerationParams

PER_TYPE = 40
FIRST_SEED = 0  # bench/accuracy.py's default held-out range


@pytest.fixture(scope="module")
def held_out_clips(tmp_path_factory) -> dict[int, Path]:
    folder = tmp_path_factory.mktemp("held-out")
    return {seed: write_shape_clip(folder / f"{seed}.mp4", seed) for seed in held_out_seeds(FIRST_SEED, PER_TYPE)}


@pytest.fixture(scope="module")
def trained_engine(tmp_path_factory):
    # No prefix KV cache: the positions test must not reuse KV computed with the right positions.
    config = EngineConfig(model="tiny-trained", device="cpu", cache_dir=tmp_path_factory.mktemp("models"),
                          max_queue=PER_TYPE * len(QUESTIONS), prefix_cache_bytes=0)
    with Engine(config) as running:
        yield running


@pytest.fixture(scope="module")
def table(trained_engine, held_out_clips) -> dict[str, dict[str, float]]:
    return accuracy_bench.accuracy(trained_engine, held_out_clips, [0.0, 0.9])


def test_the_trained_model_answers_held_out_clips(table):
    assert table["0.0"]["colour"] >= 0.95, table
    assert table["0.0"]["direction"] >= 0.85, table


def test_pruning_nearly_everything_costs_direction(table):
    """At q = 0.9 only the first temporal group survives for these clips: where the shape goes is gone."""
    assert table["0.9"]["direction"] <= table["0.0"]["direction"] - 0.2, table


def test_positions_recomputed_for_the_pruned_sequence_lose_answers(trained_engine, held_out_clips, table,
                                                                   monkeypatch):
    """The classic EVS bug, on purpose: number the pruned sequence's positions afresh (as if it had never
    held the dropped tokens) instead of keeping the unpruned layout's. Answers at q = 0.5 get worse."""
    right = accuracy_bench.accuracy(trained_engine, held_out_clips, [0.5])["0.5"]
    original = engine.runner.prune_prompt

    def renumbered(prompt, features, q):
        pruned = original(prompt, features, q)
        length = pruned.input_ids.numel()
        pruned.positions = torch.arange(length).expand(4, length).clone()
        pruned.next_position = length
        return pruned

    monkeypatch.setattr(engine.runner, "prune_prompt", renumbered)
    broken = accuracy_bench.accuracy(trained_engine, held_out_clips, [0.5])["0.5"]
    assert sum(broken.values()) <= sum(right.values()) - 0.3, (right, broken)


def test_every_example_clip_is_answered_right(trained_engine):
    """The app's example clips, asked their example question at their rate, as a click would."""
    for name, seed, kind, rate in EXAMPLES:
        answer = trained_engine.submit(EXAMPLES_DIR / name, QUESTIONS[kind],
                                       GenerationParams(pruning_rate=rate, max_new_tokens=8)).result()
        assert answer.text.strip() == shape_clip(seed).answer(kind), (name, answer.text)


def test_the_accuracy_plot_is_an_svg_line_per_question_type():
    from xml.etree import ElementTree

    table = {"0.0": {"colour": 1.0, "direction": 0.9, "shape": 0.8}, "0.9": {"colour": 0.9, "direction": 0.3,
                                                                             "shape": 0.5}}
    svg = ElementTree.fromstring(accuracy_bench.svg_plot(table, "title"))
    lines = svg.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == len(QUESTIONS)
    # direction: from (q=0, 0.9) to (q=0.9, 0.3); y grows downwards
    (x0, y0), (x1, y1) = (map(float, p.split(",")) for p in lines[1].get("points").split())
    assert x1 > x0 and y1 > y0
