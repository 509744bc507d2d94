"""The suite's own settings keep wall-clock time out of test outcomes."""

from __future__ import annotations

from hypothesis import HealthCheck, settings


def test_property_tests_have_no_deadline_and_no_too_slow_health_check() -> None:
    """Invariant: a property test passes or fails on its examples alone, never because a
    loaded machine made one example slower than a deadline or its generation too slow."""
    for name in ("suite", "explore"):
        profile = settings.get_profile(name)
        assert profile.deadline is None
        assert HealthCheck.too_slow in profile.suppress_health_check
    assert settings().deadline is None  # the profile in force
