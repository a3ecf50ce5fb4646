"""``Backend``: the calls the engine makes on a backend (the CPU and CUDA ones implement it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

#: ``(opens, highs, lows)`` of the bars of a step or a warmup, beside their closes
Ohlc = tuple[np.ndarray, np.ndarray, np.ndarray]


class PendingFields(Protocol):
    """A submitted step: ``wait()`` returns its typed output fields."""

    def wait(self) -> dict[str, np.ndarray]: ...


class ReadyFields:
    """A step that has already finished (the CPU runs it to completion on submission)."""

    def __init__(self, fields: dict[str, np.ndarray]) -> None:
        self._fields = fields

    def wait(self) -> dict[str, np.ndarray]:
        return self._fields


@runtime_checkable
class Backend(Protocol):
    """The seam between the engine and the kernels.

    Host arrays in, host arrays out (float64 values, int64 slots and times); the store's
    host ``counters`` are kept current by every backend. Planned steps come from
    ``batch.plan_rounds``: ``order`` lists the accepted updates, round by round.
    """

    #: "cpu" or "cuda" (reported in logs and saved in snapshots)
    name: str
    #: streams per ``warmup`` call the engine makes (bounds the padded history arrays)
    warmup_chunk: int

    def step(
        self,
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        order: np.ndarray,
        round_starts: np.ndarray,
    ) -> np.ndarray:
        """Apply planned rounds; row ``u`` holds update ``u``'s outputs (rejected rows NaN)."""
        ...

    def step_outputs(
        self,
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        order: np.ndarray,
        round_starts: np.ndarray,
        groups: Sequence[str],
    ) -> dict[str, np.ndarray]:
        """``step`` returning only the typed fields of output ``groups``."""
        ...

    def step_outputs_async(
        self,
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        order: np.ndarray,
        round_starts: np.ndarray,
        groups: Sequence[str],
    ) -> PendingFields:
        """``step_outputs`` whose outputs may still be in flight: the state and host
        counters advance now, the fields are ``wait()``-ed for."""
        ...

    def preview(
        self, slots: np.ndarray, times: np.ndarray, closes: np.ndarray, accepted: np.ndarray
    ) -> np.ndarray:
        """Outputs for in-progress bars (``accepted`` rows only); the state is untouched."""
        ...

    def preview_outputs(
        self,
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        accepted: np.ndarray,
        groups: Sequence[str],
    ) -> dict[str, np.ndarray]:
        """``preview`` returning only the typed fields of output ``groups``."""
        ...

    def warmup(
        self,
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        counts: np.ndarray,
        record_all: bool,
    ) -> np.ndarray:
        """Apply ``counts[s]`` bars of row ``s`` to stream ``slots[s]``; outputs
        ``(streams, bars or 1, N_OUT)``."""
        ...

    def step_with_strategies(
        self,
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        ohlc: Ohlc,
        order: np.ndarray,
        round_starts: np.ndarray,
        groups: Sequence[str],
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``step_outputs`` and, in the same call, every strategy of each updated slot on
        its bar, with the events of the bar's ATC output row (``paper_cpu.strategy_step``,
        where the backend keeps the strategy state); returns the fields and the strategy
        cells ``u * n_strategies + k`` (``paper_cpu.strategy_outputs``)."""
        ...

    def warmup_with_strategies(
        self,
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        ohlc: Ohlc,
        counts: np.ndarray,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``warmup`` with every bar through the strategies of its slot too
        (``paper_cpu.strategy_warmup``); returns each row's last bar's outputs
        ``(streams, N_OUT)`` (NaN where it has none) and its strategy cells."""
        ...

    def pull_state(self) -> None:
        """Bring the store's host arrays up to date with the backend's state."""
        ...

    def push_state(self) -> None:
        """Make the store's host arrays the backend's state (after a restore)."""
        ...

    def close(self) -> None:
        """Release what the backend holds besides the store (device memory)."""
        ...
