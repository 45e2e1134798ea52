"""Shared fixtures: tiny offline models built once per session, small H.264 clips made with PyAV."""

from pathlib import Path

import pytest

from assets.clips import write_clip
from engine.families.registry import family_for
from engine.loading.load import load_model


@pytest.fixture(scope="session")
def tiny_cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="session")
def clip(tmp_path_factory):
    """clip(kind, seconds=, fps=, size=) -> Path of a cached H.264 MP4."""
    folder = tmp_path_factory.mktemp("clips")
    made: dict[tuple, Path] = {}

    def make(kind: str = "moving_object", *, seconds: float = 2.0, fps: int = 8, size=(160, 120)) -> Path:
        key = (kind, seconds, fps, tuple(size))
        if key not in made:
            name = f"{kind}_{seconds}s_{fps}fps_{size[0]}x{size[1]}.mp4"
            made[key] = write_clip(folder / name, kind, seconds=seconds, fps=fps, size=tuple(size))
        return made[key]

    return make


@pytest.fixture(scope="session")
def tiny_models(tiny_cache_dir):
    """name -> (LoadedModel, Family), loaded once on CPU."""
    loaded = {}

    def get(name: str):
        if name not in loaded:
            model = load_model(name, "cpu", tiny_cache_dir)
            loaded[name] = (model, family_for(model.model))
        return loaded[name]

    return get


@pytest.fixture(scope="session")
def app(tiny_cache_dir):
    """One launched demo (tiny model, CPU) shared by the app and browser tests."""
    from app_harness import launched_app

    with launched_app(tiny_cache_dir) as running:
        yield running


@pytest.fixture(scope="session")
def fallback_app(tmp_path_factory):
    """`python app.py` started as a user would, offline, with a checkpoint it cannot fetch: tiny-trained on the
    CPU and the banner saying why; shared by the start-up and browser tests."""
    from test_app_startup import UNREACHABLE_MODEL, app_process

    with app_process(
        tmp_path_factory.mktemp("fallback-app"), "--model", UNREACHABLE_MODEL, "--device", "cpu"
    ) as started:
        yield started
