"""Shared test fixtures: the real-input data folder and the two async backends."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# The project root's sibling ``shared/`` holds the real inputs (read-only).
_DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
DATA_DIR = Path(os.environ.get("TURNLOOM_DATA", _DEFAULT_DATA))
TAU_BENCH = DATA_DIR / "tau-bench" / "airline-150.json"
RECORDINGS = DATA_DIR / "provider-recordings"

# litellm (tests/context/gateways/test_litellm.py) fetches its model price map from
# GitHub when imported, retrying for seconds; the suite makes no network call, so it
# reads the copy its wheel ships.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# The suite's property tests draw the same examples on every run, so a run
# is reproducible and a new counterexample never turns an unrelated change
# red; TURNLOOM_HYPOTHESIS=explore draws new ones (and keeps failures in the
# example database) to hunt for bugs.
# Neither profile lets wall-clock time decide an outcome: no per-example
# deadline (an example slowed by a loaded machine fails it, or its faster rerun
# reports "unreliable test timings") and no too_slow health check.
_UNTIMED = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("suite", _UNTIMED, derandomize=True)
settings.register_profile("explore", _UNTIMED, derandomize=False)
settings.load_profile("explore" if os.environ.get("TURNLOOM_HYPOTHESIS") == "explore" else "suite")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every ``@pytest.mark.anyio`` test on asyncio and on trio."""
    return str(request.param)


@pytest.fixture(scope="session")
def tau_bench_path() -> Path:
    """The 150 tau-bench airline trajectories (skips when the data is absent)."""
    if not TAU_BENCH.exists():
        pytest.skip(f"real input {TAU_BENCH} is not present")
    return TAU_BENCH


@pytest.fixture(scope="session")
def recordings_dir() -> Path:
    """The recorded provider requests (skips when the data is absent)."""
    if not RECORDINGS.exists():
        pytest.skip(f"real input {RECORDINGS} is not present")
    return RECORDINGS
