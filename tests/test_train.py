"""train/tiny_trained.py learns on exactly what the engine serves, and its loss falls; train/tiny_live.py's model
tells the engine and the page what it reads live.

The served-prompt test runs one pruned request through the Engine, keeps what the engine pruned, and
checks that the training path builds the same tokens, mask and positions from the same frames, and that
its teacher-forced logits pick the tokens the engine generated.
"""

import json

import pytest
import torch

import engine.worker.runner
from assets.shapes import QUESTIONS, held_out_seeds, write_shape_clip
from engine import Engine, EngineConfig, GenerationParams
from engine.checkpoints.tiny import MODEL_NOTES_FILE
from engine.families.registry import family_for
from engine.loading.load import load_model
from train import tiny_live, tiny_trained
from ui.layout import default_banner

Q = 0.7


@pytest.fixture(scope="module")
def served(tmp_path_factory, request):
    """(request's sampled video, the engine's PrunedPrompt, generated token ids) for one held-out clip."""
    seen = []
    serve = engine.worker.runner.ModelRunner.prune

    def recording(runner, req):
        serve(runner, req)
        seen.append((req.media[0], req.pruned, req))

    patch = pytest.MonkeyPatch()
    request.addfinalizer(patch.undo)
    patch.setattr(engine.worker.runner.ModelRunner, "prune", recording)
    clip = write_shape_clip(tmp_path_factory.mktemp("clip") / "clip.mp4", held_out_seeds(0, 1)[0])
    config = EngineConfig(model="tiny-trained", device="cpu", cache_dir=tmp_path_factory.mktemp("models"))
    with Engine(config) as running:
        running.submit(clip, QUESTIONS["direction"], GenerationParams(pruning_rate=Q, max_new_tokens=8)).result()
    video, pruned, req = seen[0]
    return video, pruned, list(req.detokenizer.token_ids)


@pytest.fixture(scope="module")
def loaded():
    return load_model("tiny-trained", device="cpu")


def test_training_prunes_what_the_engine_serves(served, loaded):
    video, engine_pruned, _ = served
    ours = tiny_trained.served_prompts(loaded, family_for(loaded.model), [[video]], [QUESTIONS["direction"]], [Q])[0]
    assert engine_pruned.tokens_kept_per_group(0).count(0) > 0, "the clip should drop whole groups at this q"
    for field in ("input_ids", "positions", "visual_mask"):
        assert torch.equal(getattr(ours, field), getattr(engine_pruned, field)), field
    assert torch.equal(ours.retention[0], engine_pruned.retention[0])
    assert (ours.next_position, ours.prefix_len) == (engine_pruned.next_position, engine_pruned.prefix_len)
    torch.testing.assert_close(ours.features.embeds, engine_pruned.features.embeds)


def test_teacher_forcing_predicts_what_the_engine_generated(served, loaded):
    """The answer's positions are the decode steps' (a wrong one moves the logits): the argmax at each answer
    position is the token the engine generated there, also when a longer row pads the batch."""
    video, engine_pruned, generated = served
    family = family_for(loaded.model)
    other = tiny_trained.served_prompts(loaded, family, [[tiny_trained.sampled_video(5)]], [QUESTIONS["shape"]], [0.0])
    answer = torch.tensor(generated)
    with torch.no_grad():
        logits, targets = tiny_trained.teacher_forced_logits(loaded, family, [engine_pruned, *other], [answer, answer])
    assert torch.equal(targets[: len(generated)], answer)
    assert logits[: len(generated)].argmax(-1).tolist() == generated


def test_a_few_training_steps_lower_the_loss_and_save_a_loadable_model(tmp_path):
    out = tmp_path / "model"
    summary = tiny_trained.train(
        tiny_trained.parser().parse_args(
            [
                "--evs",
                "--init",
                "",
                "--steps",
                "8",
                "--batch",
                "4",
                "--lr",
                "2e-3",
                "--warmup",
                "1",
                "--eval-every",
                "1",
                "--eval-clips",
                "1",
                "--out",
                str(out),
            ]
        )
    )
    losses = [entry["loss"] for entry in summary["log"]]
    assert losses[-1] < losses[0] - 1.0, losses
    assert json.loads((out / MODEL_NOTES_FILE).read_text())["system_prompt"] == ""
    assert json.loads((out / "training.json").read_text())["rates"] == list(tiny_trained.TRAIN_RATES)
    assert load_model(str(out), device="cpu").model.config.model_type == "qwen3_vl"


def test_the_streams_stage_saves_a_model_whose_notes_tell_the_engine_and_the_page_what_it_reads_live(tmp_path):
    """train/tiny_live.py, two steps from tiny-trained: the saved model loads with the live span, noise floor,
    what it can be asked live and the words it learned; the banner says the live part; a notes file with wrong
    values gives none of them."""
    out = tmp_path / "model"
    summary = tiny_live.train(
        tiny_live.parser().parse_args(
            ["--steps", "2", "--batch", "2", "--eval-every", "1", "--eval-clips", "1", "--out", str(out)]
        )
    )
    assert summary["stage"] == "streams" and len(summary["log"]) == 2 and "live none" in summary["log"][0]
    loaded = load_model(str(out), device="cpu")
    assert (loaded.live_span_s, loaded.live_noise_floor) == (8.0, tiny_live.NOISE_FLOOR)
    assert loaded.answers == tuple(tiny_live.ANSWERS) and {"none", "yes", "red", "up"} <= set(loaded.answers)
    banner = default_banner({"name": "tiny-trained", "about": loaded.about, "live_about": loaded.live_about})
    assert banner.endswith(tiny_live.LIVE_ABOUT) and banner.count(tiny_live.LIVE_ABOUT) == 1
    fallback = f"The model is unavailable. This app runs tiny-trained instead, {loaded.about}. {loaded.live_about}"
    assert default_banner({"live_about": loaded.live_about}, fallback) == fallback  # said once, not twice
    notes = json.loads((out / MODEL_NOTES_FILE).read_text())
    notes.update(live_span_s="8", live_noise_floor=-1, answers=["red", 3], live_about=None)
    (out / MODEL_NOTES_FILE).write_text(json.dumps(notes))
    wrong = load_model(str(out), device="cpu")
    assert (wrong.live_span_s, wrong.live_noise_floor, wrong.answers, wrong.live_about) == (None, None, None, None)
