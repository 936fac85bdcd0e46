"""Shared fixtures of the Python tests. They use the library only through `import moeinfer`.

Random data is fresh on every run; the seed is printed (pytest shows it with a failure) and
MOEINFER_TEST_SEED=<seed> replays it (MOEINFER_MODEL_SEED=<seed> a model fixture's synthetic model).
"""

from __future__ import annotations

import os
import pathlib
import secrets

import numpy as np
import pytest

import moeinfer

ARCHS = ("qwen3moe", "gpt-oss")


@pytest.fixture
def rng() -> np.random.Generator:
    seed = int(os.environ.get("MOEINFER_TEST_SEED", secrets.randbits(32)))
    print(f"MOEINFER_TEST_SEED={seed}")
    return np.random.default_rng(seed)


def model_seed() -> int:
    """A fresh seed for a synthetic model, printed; MOEINFER_MODEL_SEED=<seed> replays it (module-scoped model
    fixtures cannot take the per-test rng)."""
    seed = int(os.environ.get("MOEINFER_MODEL_SEED", secrets.randbits(30)))
    print(f"MOEINFER_MODEL_SEED={seed}")
    return seed


@pytest.fixture(scope="session", params=ARCHS)
def tiny_model(request, tmp_path_factory) -> pathlib.Path:
    """A synthetic model of each architecture with the "tiny" preset, written once per session."""
    path = tmp_path_factory.mktemp("models") / f"tiny-{request.param}.gguf"
    moeinfer.synth_write(path, request.param, preset="tiny")
    return path


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory) -> pathlib.Path:
    """One tiny qwen3moe model, for tests that need a valid file but not every architecture."""
    path = tmp_path_factory.mktemp("models") / "tiny-qwen3moe.gguf"
    moeinfer.synth_write(str(path), "qwen3moe", preset="tiny", seed=7)
    return path
