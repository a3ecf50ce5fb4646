"""Shared test configuration: hypothesis profiles and the in-process CLI runner."""

from __future__ import annotations

import contextlib
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


@pytest.fixture
def reads_let_go_of_their_handler(monkeypatch):
    """``check(module, read)``: ``read()`` 200 times (a failed read raises ``InputError``);
    each time, ``wait_released`` of the module's ``InvalidRows`` must have seen pyarrow let
    go of its handlers (a thread keeps one a little longer in a few reads out of a hundred)."""
    from atc_stream.io.readers import InputError

    def check(module, read) -> None:
        released: list[bool] = []

        class Recorded(module.InvalidRows):
            def wait_released(self, seconds: float = 5.0) -> bool:
                released.append(super().wait_released(seconds))
                return released[-1]

        monkeypatch.setattr(module, "InvalidRows", Recorded)
        for _ in range(200):
            with contextlib.suppress(InputError):
                read()
            assert released and all(released), "pyarrow held the handler 5 s"

    return check
