"""The parity check that stands between a process and the GPU: it finds any difference from
the CPU backend's bits, and a device that differs is not used (``auto``) or refused (``cuda``)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from atc_stream.engine import backends
from atc_stream.kernels import cuda_parity
from atc_stream.kernels.cpu import CpuBackend
from atc_stream.state.arrays import StateStore

SMALL = {"streams": 2, "bars": 60, "warmup_bars": 40}


class NudgedStep(CpuBackend):
    """The CPU backend with one close of each step moved by one ulp (a stand-in device)."""

    def step(self, slots, times, closes, order, round_starts):
        closes = closes.copy()
        closes[1] = np.nextafter(closes[1], np.inf)
        return super().step(slots, times, closes, order, round_starts)


class NudgedWarmup(CpuBackend):
    def warmup(self, slots, times, closes, counts, record_all):
        closes = closes.copy()
        closes[2, -1] = np.nextafter(closes[2, -1], np.inf)
        return super().warmup(slots, times, closes, counts, record_all)


def test_the_same_backend_passes():
    assert cuda_parity.compare_backends(CpuBackend, **SMALL) == ""


@pytest.mark.parametrize(
    ("backend", "where"), [(NudgedStep, "at bar 40"), (NudgedWarmup, "state ring")]
)
def test_one_ulp_anywhere_is_found(backend, where):
    found = cuda_parity.compare_backends(backend, **SMALL)
    assert where in found and "on the CPU" in found and "on the device" in found


def test_state_differences_are_found_when_the_outputs_agree():
    a, b = np.zeros((3, 4)), np.zeros((3, 4))
    b[2, 1] = 5e-324
    assert "first at (2, 1)" in cuda_parity.differ(a, b)
    assert cuda_parity.differ(np.full(3, np.nan), np.full(3, np.nan)) == ""


def test_the_switch_turns_the_check_off(monkeypatch):
    monkeypatch.setenv(cuda_parity.SWITCH, "off")
    monkeypatch.setattr(cuda_parity, "_result", "would differ")
    assert cuda_parity.device_parity_problem() == ""


@pytest.fixture
def a_device_that_differs(monkeypatch):
    monkeypatch.setattr(backends, "cuda_available", lambda allow_simulator=False: (True, ""))
    monkeypatch.setattr(backends, "cuda_simulated", lambda: False)
    monkeypatch.setattr(backends, "_fallback_noted", False)
    monkeypatch.delenv(cuda_parity.SWITCH, raising=False)
    reason = "the CUDA kernels' results differ from the CPU's on this device: at bar 301 ..."
    monkeypatch.setattr(cuda_parity, "_result", reason)
    return reason


def test_auto_stays_on_the_cpu_and_says_why(a_device_that_differs, caplog):
    store = StateStore(backends.AUTO_MIN_STREAMS)
    with caplog.at_level(logging.WARNING, logger="atc_stream"):
        backend = backends.make_backend("auto", store)
    assert isinstance(backend, CpuBackend)
    assert any(a_device_that_differs in r.getMessage() for r in caplog.records)


def test_cuda_is_refused_with_the_reason(a_device_that_differs):
    with pytest.raises(RuntimeError, match="results differ from the CPU's on this device"):
        backends.make_backend("cuda", StateStore(4))
