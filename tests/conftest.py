"""Shared test configuration: hypothesis profiles and the in-process CLI runner."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough",
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def run_main(capsys):
    """``run_main(args)`` runs ``atc-stream ARGS`` in this process: (exit status, stderr),
    asserting that no traceback reached stderr."""

    def run(args):
        from atc_stream.app.cli import main

        with pytest.raises(SystemExit) as info:
            main(args)
        err = capsys.readouterr().err
        assert "Traceback" not in err
        return info.value.code, err

    return run
