"""``Engine``: the streams registry, warmup/step/preview and the bad-input policy."""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from types import MappingProxyType
from typing import Any

import numpy as np

from atc_stream.core import inputs, schema
from atc_stream.core.intervals import is_interval, validate_interval
from atc_stream.core.params import ATCParams
from atc_stream.core.results import (
    PendingStep,
    Rejection,
    StepResult,
    StreamKey,
    UnknownStreamError,
    as_stream_key,
    unknown_stream,
)
from atc_stream.core.strategy import Strategy
from atc_stream.engine import paper, snapshots, warmups
from atc_stream.engine.backends import make_backend
from atc_stream.engine.backtest import as_strategy_list, check_param_set
from atc_stream.engine.breakdown import BreakdownWatch
from atc_stream.engine.exercise import exercise_kernels
from atc_stream.engine.parsing import (
    Columns,
    Reject,
    as_update_arrays,
    is_symbol,
    parse_columns,
    parse_items,
)
from atc_stream.kernels import batch
from atc_stream.kernels.backend import Backend, ReadyFields
from atc_stream.kernels.prepare import PrepareReport, prepare_kernels
from atc_stream.state import layout as L
from atc_stream.state.arrays import StateStore

log = logging.getLogger("atc_stream")


class Engine:
    """Exact incremental ATC for many streams.

    One slot of state per stream (symbol x interval x parameter set) in a ``StateStore``;
    a batch of closed bars applies to all of them with one backend call, and a bar for a
    symbol fans out to every parameter set the symbol is registered with. Bad inputs
    never raise and never touch a stream: each is counted per reason in ``rejections``,
    logged once per reason, and reported in the call's result, while the valid part of
    the batch still applies.

    >>> eng = Engine(ATCParams())
    >>> eng.warmup({"BTCUSDT": (times, closes)})
    >>> res = eng.step([("BTCUSDT", next_time, 64210.5)])
    """

    def __init__(
        self,
        params: ATCParams | Sequence[ATCParams] | None = None,
        *,
        backend: str = "auto",
        interval: str = "1m",
        capacity: int = 64,
        threads: int | None = None,
        outputs: str | Sequence[str] | None = None,
        cuda_graph: bool = False,
        strategies: Strategy | Sequence[Strategy] | None = None,
    ) -> None:
        """``outputs``: the output groups ``step``/``preview``/``warmup`` return
        (``schema.OUTPUT_GROUPS``: "signal", "events", "layers", "equities", "growth", or
        "all"); default ``schema.DEFAULT_OUTPUTS``, the signal and the events. See
        :attr:`outputs`.

        ``strategies``: paper trading (docs/spec.md, "Backtest"): every stream also
        trades each strategy (a strategy stream per (symbol, parameter set, strategy)),
        so ``step`` and ``warmup`` take bars with open, high, low and close, and results
        carry the "strategy" output group (on by default with strategies; see
        :meth:`StepResult.position_columns`, :meth:`StepResult.trade_columns`,
        :meth:`strategy_metrics`). On CUDA the strategy state lives on the device beside
        the ATC state (docs/design/cuda.md, "Strategies"): the same bits as on the CPU.

        ``cuda_graph``: on CUDA, replay the steady step (the same streams, one bar each)
        as one captured CUDA graph (CuPy on a real device; otherwise, or when a capture
        fails, one warning and ordinary launches). Results are identical; CPU: ignored."""
        from atc_stream.kernels.threads import check_threads

        self.threads = check_threads(threads)
        self.store = StateStore(capacity)
        if strategies is not None:
            self.store.set_strategies(as_strategy_list(strategies))
        self.outputs = outputs
        self.interval = validate_interval(interval)  # every stream key and row carries it
        self._keys_by_slot: list[StreamKey | None] = [None] * self.store.capacity
        self._slot_of: dict[StreamKey, int] = {}
        self._symbol_slots: dict[str, np.ndarray] = {}
        self._slot_lists_of: dict[str, np.ndarray] | None = None  # see _slot_lists
        self._slot_lists_cache: dict[str, list[int]] = {}
        self._single_slot: dict[str, int] | None = None
        self.rejections: Counter[str] = Counter()
        self._source_offsets: dict[str, Any] = {}
        self._logged_reasons: set[str] = set()
        self._breakdown = BreakdownWatch()  # a ready signal turned na: warned once a stream
        #: log the first rejection of each reason (off while replay logs them with file:line)
        self.log_rejections = True
        param_sets: Any = [ATCParams()] if params is None else params
        if isinstance(param_sets, (ATCParams, Mapping, str, bytes)):  # keys or letters else
            param_sets = [param_sets]
        for p in param_sets:
            self.add_params(p)
        self.cuda_graph = cuda_graph
        self.backend: Backend = make_backend(backend, self.store, self.threads, cuda_graph)

    @classmethod
    def compile(
        cls,
        report: Callable[[str], None] | None = None,
        *,
        progress: bool = False,
        strategies: bool = True,
    ) -> PrepareReport:
        """Compile (first run) or load from the on-disk cache every CPU kernel now.

        Later processes load in well under a second; call this before timing-sensitive
        work. ``report`` (e.g. ``print``) gets a line before a first-run compile;
        ``progress`` shows the phase as a progress bar; ``strategies=False`` leaves out
        the kernels of paper trading and ``backtest`` (an engine without strategies
        never calls them; about 40 % of a first-run compile). Returns a
        ``kernels.prepare.PrepareReport``.
        """
        exercise = partial(exercise_kernels, cls, strategies=strategies)
        return prepare_kernels(exercise, report, progress=progress, strategies=strategies)

    def move_to(self, backend: str) -> None:
        """Move the live state to another backend ("cpu", "cuda" or "auto"); results are unchanged.

        The state is pulled from the current backend into the host store, then pushed
        to the new one. Raises like the constructor when the backend is unavailable
        (the engine then stays where it was).
        """
        self.backend.pull_state()
        new = make_backend(backend, self.store, self.threads, self.cuda_graph)
        new.push_state()
        old, self.backend = self.backend, new
        if old is not new:
            old.close()

    # -- parameter sets and streams -----------------------------------------------

    @property
    def param_sets(self) -> list[ATCParams]:
        return list(self.store.params.params)

    def add_params(self, params: ATCParams) -> int:
        """Register a parameter set; return its ``params_id``."""
        return self.store.add_params(check_param_set(params))

    def add_symbol(self, symbol: str, params_ids: Iterable[int] | None = None) -> list[StreamKey]:
        """Add one stream per parameter set (all by default) for ``symbol``; existing ones stay."""
        if not is_symbol(symbol):
            raise ValueError(f"symbol must be a non-empty str without NUL, got {symbol!r}")
        ids = range(len(self.store.params)) if params_ids is None else list(params_ids)
        return [self.add_stream(symbol, params_id) for params_id in ids]

    def add_symbols(self, symbols: Iterable[str]) -> list[StreamKey]:
        """``add_symbol`` of each of ``symbols`` in order, new slots made at once; all keys."""
        symbols = list(symbols)
        bad = next((s for s in symbols if not is_symbol(s)), None)
        if bad is not None:
            raise ValueError(f"symbol must be a non-empty str without NUL, got {bad!r}")
        n_params = len(self.store.params)
        keys = [StreamKey(s, self.interval, p) for s in symbols for p in range(n_params)]
        new = [key for key in dict.fromkeys(keys) if key not in self._slot_of]
        slots = self.store.allocate_many(np.array([key.params_id for key in new], np.int64))
        self.register_slots(new, slots.tolist())
        return keys

    def add_stream(self, symbol: str, params_id: int = 0) -> StreamKey:
        if not 0 <= params_id < len(self.store.params):
            raise ValueError(f"params_id {params_id} is not a registered parameter set")
        key = StreamKey(symbol, self.interval, params_id)
        if key in self._slot_of:
            return key
        self.register_slots([key], [self.store.allocate(params_id)])
        return key

    def register_slots(self, keys: list[StreamKey], slots: list[int]) -> None:
        """Name each of ``slots`` (allocated, holding its state) as the stream beside it."""
        self._keys_by_slot.extend([None] * (self.store.capacity - len(self._keys_by_slot)))
        added: dict[str, list[int]] = {}
        for key, slot in zip(keys, slots, strict=True):
            self._keys_by_slot[slot] = key
            self._slot_of[key] = slot
            added.setdefault(key.symbol, []).append(slot)
        for symbol, symbol_slots in added.items():
            self._set_symbol_slots(symbol, [*self._symbol_slots.get(symbol, ()), *symbol_slots])

    def remove_symbol(self, symbol: str) -> None:
        for slot in self._symbol_slots.get(symbol, ()):
            self.remove_stream(self._keys_by_slot[slot])

    def remove_stream(self, key: StreamKey) -> None:
        slot = self.slot_of(key)
        del self._slot_of[key]
        self.store.release(slot)
        self._breakdown.forget(slot)
        self._keys_by_slot[slot] = None
        self._set_symbol_slots(key.symbol, [s for s in self._symbol_slots[key.symbol] if s != slot])

    def _set_symbol_slots(self, symbol: str, slots) -> None:
        self._slot_lists_of = None
        if len(slots):
            self._symbol_slots[symbol] = np.array(sorted(slots), np.int64)
        else:
            self._symbol_slots.pop(symbol, None)

    @property
    def streams(self) -> list[StreamKey]:
        return sorted(self._slot_of)

    @property
    def symbols(self) -> list[str]:
        return sorted(self._symbol_slots)

    def slot_of(self, key: StreamKey | str) -> int:
        """The slot of ``key``: a StreamKey, its tuple or text, or a one-stream symbol."""
        slot = self._slot_of.get(as_stream_key(key))  # type: ignore[arg-type]
        symbol_slots = self._symbol_slots.get(key) if isinstance(key, str) else None
        if slot is None and symbol_slots is not None and len(symbol_slots) == 1:
            return int(symbol_slots[0])
        if slot is None:
            raise unknown_stream(key, self.streams, symbol_slots)
        return slot

    def slots_of(self, symbol: str) -> np.ndarray:
        """Slots of every stream of ``symbol`` (one per parameter set it is registered with)."""
        slots = self._symbol_slots.get(symbol)
        if slots is None:
            raise UnknownStreamError(f"unknown symbol {symbol!r}; registered: {self.symbols[:5]}")
        return slots

    @property
    def symbol_slots(self) -> Mapping[str, np.ndarray]:
        """``symbol -> slots of its streams`` (read-only view; one slot per parameter set)."""
        return MappingProxyType(self._symbol_slots)

    def last_bar_times(self, symbol: str) -> list[int | None]:
        """Open time of the last applied bar of each stream of ``symbol`` (``slots_of``
        order; None for a stream that has seen no bar). Read from the host counters,
        which every backend keeps current, so no device copy."""
        lasts = self.store.counters[self.slots_of(symbol), L.LAST_TIME].tolist()
        return [None if last == L.NO_TIME else last for last in lasts]

    def stream_state(self, key: StreamKey | str) -> dict[str, Any]:
        """A stream's position: bar_index (bars seen), whether its last bar was ready
        (docs/spec.md, "Readiness"), last bar time, growth factor of its last bar (from the
        host counters, which every backend keeps current: no device copy)."""
        from atc_stream.kernels.cpu import growth_factor

        slot = self.slot_of(key)
        counters = self.store.counters[slot]
        last = int(counters[L.LAST_TIME])
        bar_index = int(counters[L.BAR_INDEX])
        params = self.store.params.params[int(counters[L.PARAM_ROW])]
        last_bar = bar_index - 1
        active = bar_index > 0 and last_bar >= params.cutout
        return {
            "bar_index": bar_index,
            "ready": bool(last_bar >= self.store.params.ready_bars[int(counters[L.PARAM_ROW])]),
            "last_time": None if last == L.NO_TIME else last,
            "growth": growth_factor(params.lam, last_bar, params.cutout) if active else math.nan,
        }

    # -- bad input ------------------------------------------------------------------

    def _reject(self, rejected: list[Rejection], index: int, reason: str, detail: str, symbol=None):
        self.rejections[reason] += 1
        if self.log_rejections and reason not in self._logged_reasons:
            self._logged_reasons.add(reason)
            log.warning("rejected input (%s): %s (further ones are only counted)", reason, detail)
        rejected.append(Rejection(index, reason, detail, symbol))

    def _parse_input(self, bars, time_unit, columns):
        """``bars`` in any accepted form (``inputs.bars_from``) as ``_parse_bars`` columns:
        ``(slots, times, closes, origin, rejected)``."""
        rejected: list[Rejection] = []
        if self.strategies:
            *parsed, ohlc = paper.parse_ohlc_bars(
                bars, columns, time_unit, self._slot_lists(), self._rejecter(rejected)
            )
            return (*parsed, rejected, ohlc)
        converted = inputs.bars_from(bars, columns=columns, time_unit=time_unit)
        parsed = self._parse_bars(bars if converted is None else converted, rejected)
        return (*parsed, rejected)

    def _parse_bars(self, bars: Iterable[Any], rejected: list[Rejection]) -> Columns:
        """Fan ``(symbol, time, close)`` items out to slots; reject malformed ones.

        A batch of well-formed tuples of exact common types (``int``/NumPy integer
        times, ``float``/``int``/NumPy closes, registered ``str`` symbols) is split into
        columns and converted in C (~0.1 us per item); anything else takes the per-item
        path, which applies the full checks and rejects with the same reasons.
        """
        if not isinstance(bars, (list, tuple)):
            bars = list(bars)
        slot_lists = self._slot_lists()
        fast = parse_columns(bars, slot_lists, self._single_slot)
        if fast is not None:
            return fast
        return parse_items(bars, slot_lists, self._rejecter(rejected))

    def _rejecter(self, rejected: list[Rejection]) -> Reject:
        """``_reject`` into ``rejected``, in the form the ``parsing`` functions call."""

        def reject(index: int, reason: str, detail: str, symbol: str | None) -> None:
            self._reject(rejected, index, reason, detail, symbol)

        return reject

    def _slot_lists(self) -> dict[str, list[int]]:
        """``symbol -> [slot, ...]`` as Python ints, rebuilt when the registry changes; also
        sets ``_single_slot``: ``symbol -> slot`` when every symbol has one stream, else None."""
        if self._slot_lists_of is not self._symbol_slots:
            lists = {s: v.tolist() for s, v in self._symbol_slots.items()}
            single = all(len(v) == 1 for v in lists.values())
            self._single_slot = {s: v[0] for s, v in lists.items()} if single else None
            self._slot_lists_cache = lists
            self._slot_lists_of = self._symbol_slots
        return self._slot_lists_cache

    def _report_codes(self, reasons, slots, times, closes, origin, rejected) -> None:
        """Report planner rejections once per input, not once per stream it fans out to."""
        reported: set[tuple[int, int]] = set()
        for u in np.flatnonzero(reasons != batch.ACCEPTED):
            if (origin[u], reasons[u]) in reported:
                continue
            reported.add((origin[u], reasons[u]))
            key = self._keys_by_slot[slots[u]] if 0 <= slots[u] < len(self._keys_by_slot) else None
            where = f"symbol {key.symbol!r}" if key else f"slot {slots[u]}"
            detail = f"{where} time {times[u]} close {float(closes[u])!r}"
            reason = batch.REASON_NAMES[int(reasons[u])]
            self._reject(rejected, int(origin[u]), reason, detail, key.symbol if key else None)

    # -- step / preview -------------------------------------------------------------

    def step(
        self,
        bars: Iterable[tuple[str, int, float]] | Any,
        *,
        time_unit: str | None = None,
        columns: Mapping[str, str] | None = None,
    ) -> StepResult:
        """Apply closed bars ``(symbol, bar_time, close)``; several per symbol, in time order.

        ``bars`` may also be a long pandas DataFrame / Arrow table (``symbol``, ``time``,
        ``close`` columns, renamed by ``columns``) or ``{symbol: Series}`` with a time
        index; times may be datetimes (naive = UTC) or integer epochs in ``time_unit``
        (see ``atc_stream.inputs``). A form that cannot be converted exactly raises
        ``ValueError``; bad values in a good form are rejected and counted as usual.
        The result carries the output groups of :attr:`outputs` (default: signal and
        events).

        With strategies, bars are ``(symbol, bar_time, open, high, low, close)`` (or a
        table with ``open``, ``high``, ``low`` columns too, renamed by ``columns``); a
        bar without them, or one that cannot be traded, is rejected and counted
        (``missing_ohlc``, ``bad_ohlc``).
        """
        return self._step(*self._parse_input(bars, time_unit, columns)).result()

    def step_async(
        self,
        bars: Iterable[tuple[str, int, float]] | Any,
        *,
        time_unit: str | None = None,
        columns: Mapping[str, str] | None = None,
    ) -> PendingStep:
        """:meth:`step` without waiting for the outputs: ``.result()`` gives the
        ``StepResult``.

        The state advances now (a following step, preview, warmup or snapshot sees this
        step applied); on CUDA the next step's inputs are validated, planned and staged
        while this step's copies and kernels are in flight (double-buffered pinned
        buffers, ``kernels/cuda_io.py``). On the CPU the step runs to completion before
        returning. Results are identical to :meth:`step`'s.
        """
        return self._step(*self._parse_input(bars, time_unit, columns))

    def step_arrays_async(
        self, slots, times, closes, inputs=None, *, opens=None, highs=None, lows=None
    ) -> PendingStep:
        """:meth:`step_arrays` without waiting (see :meth:`step_async`)."""
        return self._step(*self._array_input(slots, times, closes, inputs, opens, highs, lows))

    def step_arrays(
        self, slots, times, closes, inputs=None, *, opens=None, highs=None, lows=None
    ) -> StepResult:
        """Array fast path: ``slots`` from ``slot_of``/``slots_of``; no per-item Python work.

        ``inputs[u]`` is the position of the input update ``u`` came from, when one input
        fans out to several slots (default: its own position); rejections count per input.
        With strategies, ``opens``, ``highs``, ``lows`` go with ``closes`` (rows without
        them, or with untradeable prices, are rejected and counted).
        """
        args = self._array_input(slots, times, closes, inputs, opens, highs, lows)
        return self._step(*args).result()

    def _array_input(self, slots, times, closes, inputs, opens=None, highs=None, lows=None):
        slots, times, closes = as_update_arrays(slots, times, closes)
        inputs = np.arange(slots.shape[0]) if inputs is None else np.asarray(inputs, np.int64)
        if inputs.shape != slots.shape:
            raise ValueError(
                f"inputs must have the shape of slots {slots.shape}, got {inputs.shape}"
            )
        rejected: list[Rejection] = []
        if not self.strategies:
            return slots, times, closes, inputs, rejected
        reported: set[int] = set()

        def reject(row: int, reason: str, detail: str, symbol: str | None) -> None:
            if int(inputs[row]) not in reported:  # once per input, not per fanned-out row
                reported.add(int(inputs[row]))
                self._reject(rejected, int(inputs[row]), reason, detail, symbol)

        keep, ohlc = paper.check_array_ohlc(closes, opens, highs, lows, reject)
        if ohlc is None:
            ohlc = (closes, closes, closes)
        if not keep.all():
            slots, times, closes, inputs = slots[keep], times[keep], closes[keep], inputs[keep]
            ohlc = (ohlc[0][keep], ohlc[1][keep], ohlc[2][keep])
        return slots, times, closes, inputs, rejected, ohlc

    def _plan(self, slots, times, closes, reasons):
        """``batch.plan_rounds``, or its steady-case shortcut: while a batch's slots are
        those of the last batch that was one round with every update accepted (each
        stream once), the rounds are known and only the checks run
        (``batch.check_unique_step``, which also gives the updates' ready bars). Returns
        the order, the round starts and the ready bars (None: not looked up)."""
        store, n, unique = self.store, slots.shape[0], self._unique_slots
        if unique is not None:
            ready_from = np.empty(n, np.int64)
            n_ok = batch.check_unique_step(
                store.counters, store.in_use, store.params.ready_bars, unique, slots, times,
                closes, reasons, ready_from,
            )  # fmt: skip
            if n_ok == n:
                if self._all_rows.shape[0] != n:
                    self._all_rows = np.arange(n, dtype=np.int64)
                return self._all_rows, np.array([0, n], np.int64), ready_from
            if n_ok >= 0:
                order = np.flatnonzero(reasons == batch.ACCEPTED)
                return order, np.array([0, n_ok] if n_ok else [0], np.int64), ready_from
        order, round_starts = batch.plan_rounds(
            store.counters, store.in_use, store.pending_last, store.pending_count,
            slots, times, closes, reasons,
        )  # fmt: skip
        one_round_all_accepted = order.shape[0] == n and round_starts.shape[0] == 2
        self._unique_slots = slots.copy() if one_round_all_accepted and n > 1 else None
        return order, round_starts, None

    _unique_slots: np.ndarray | None = None
    _all_rows = np.zeros(0, np.int64)

    def _step(self, slots, times, closes, origin, rejected, ohlc=None) -> PendingStep:
        reasons = np.zeros(slots.shape[0], np.int64)
        order, round_starts, ready_from = self._plan(slots, times, closes, reasons)
        if order.shape[0] != slots.shape[0]:
            self._report_codes(reasons, slots, times, closes, origin, rejected)
        strategy = None
        if ohlc is None:
            pending = self.backend.step_outputs_async(
                slots, times, closes, order, round_starts, self._outputs
            )
        else:  # the strategies of the same slots step right after their ATC update
            fields, cells = self.backend.step_with_strategies(
                slots, times, closes, ohlc, order, round_starts, self._outputs
            )
            strategy = paper.rows_from_cells(cells, len(self.store.strategies))
            pending = ReadyFields(fields)
        if order.shape[0] != slots.shape[0]:  # rejected updates have no row
            keep = np.sort(order)
            slots, times, closes = slots[keep], times[keep], closes[keep]
            strategy = None if strategy is None else strategy.take(keep)
            ready_from = None if ready_from is None else ready_from[keep]
        else:
            keep = None
        if not self._strategy_output:
            strategy = None
        # the result's rows are fixed now (a later step may reuse or free a slot)
        if ready_from is None:
            ready_from = self.store.params.ready_bars[self.store.counters[slots, L.PARAM_ROW]]
        outputs, keys_by_slot = self._outputs, self._keys_by_slot

        def result() -> StepResult:
            out = pending.wait()
            if keep is not None:
                out = {name: values[keep] for name, values in out.items()}
            result = StepResult(
                keys_by_slot, slots, times, closes, out, rejected, False, ready_from, outputs,
                strategy,
            )  # fmt: skip
            self._breakdown.check(result, self.store)
            return result

        return PendingStep(result)

    def _result(
        self, slots, times, closes, out, rejected, provisional=False, strategy=None
    ) -> StepResult:
        """``out``: kernel output rows or typed fields (``schema.kernel_fields``)."""
        ready_from = self.store.params.ready_bars[self.store.counters[slots, L.PARAM_ROW]]
        result = StepResult(
            self._keys_by_slot, slots, times, closes, out, rejected, provisional, ready_from,
            self._outputs, strategy if self._strategy_output else None,
        )  # fmt: skip
        self._breakdown.check(result, self.store)
        return result

    def preview(
        self,
        bars: Iterable[tuple[str, int, float]] | Any,
        *,
        time_unit: str | None = None,
        columns: Mapping[str, str] | None = None,
    ) -> StepResult:
        """Outputs for in-progress bars as if they closed now; state is not changed.
        Accepts the same forms as :meth:`step` (with strategies, bars with OHLC); the
        strategies are not previewed (the result has no strategy outputs)."""
        return self._preview(*self._parse_input(bars, time_unit, columns)[:5])

    def preview_arrays(self, slots, times, closes, *, count_rejected: bool = True) -> StepResult:
        """:meth:`preview` of arrays; ``count_rejected=False`` leaves out rows it cannot
        preview silently (a warm-up run of the path: nothing in ``rejections``)."""
        slots, times, closes = as_update_arrays(slots, times, closes)
        return self._preview(slots, times, closes, np.arange(len(slots)), [], count_rejected)

    def _preview(self, slots, times, closes, origin, rejected, count=True) -> StepResult:
        store = self.store
        reasons = np.zeros(slots.shape[0], np.int64)
        batch.check_previews(store.counters, store.in_use, slots, times, closes, reasons)
        accepted = reasons == batch.ACCEPTED
        if count and not accepted.all():
            self._report_codes(reasons, slots, times, closes, origin, rejected)
        fields = self.backend.preview_outputs(slots, times, closes, accepted, self._outputs)
        if not accepted.all():
            fields = {name: values[accepted] for name, values in fields.items()}
        return self._result(
            slots[accepted], times[accepted], closes[accepted], fields, rejected, True
        )

    @property
    def outputs(self) -> tuple[str, ...]:
        """The output groups every result carries, in canonical order.

        Each row always has the key columns (``schema.KEY_COLUMNS``: symbol, interval,
        params_id, time, close, bar_index, provisional); the groups add ``signal``
        ("signal"), ``ready``/``long``/``short`` ("events", bool), the six
        ``<family>_signal`` ("layers"), the six ``<family>_equity`` ("equities") and
        ``growth``. Default: signal and events. The values of a requested column are
        bit-identical whatever else is requested. On CUDA only the requested columns
        are copied back from the device (events as one byte each). Assign a group
        name, a list of them, or "all" (the CLI writes all).
        """
        return self._outputs

    @outputs.setter
    def outputs(self, value: str | Sequence[str] | None) -> None:
        names = [value] if isinstance(value, str) else list(value or ())
        if "strategy" in names and not self.strategies:
            raise ValueError("the 'strategy' outputs need an engine with strategies")
        self._strategy_output = bool(self.strategies) and (
            value is None or "strategy" in names or "all" in names
        )
        groups = [g for g in names if g != "strategy"]
        self._outputs = schema.resolve_outputs(None if value is None else groups)

    @property
    def strategies(self) -> list[Strategy]:
        """The strategies every stream trades (``strategy_id`` = position here)."""
        return list(self.store.strategies.strategies)

    def strategy_metrics(self) -> dict[str, np.ndarray]:
        """Per (stream, strategy), streams in :attr:`streams` order: the key columns,
        ``strategy_id`` and the metrics so far (``BacktestResult.metric_columns``)."""
        self.backend.pull_state()  # the strategy state may live on the device
        return paper.metric_columns(self.store, [(k, self._slot_of[k]) for k in self.streams])

    def request_outputs(self, *groups: str) -> None:
        """Return only these output groups from now on (none given: all); see :attr:`outputs`."""
        self.outputs = groups or "all"

    # -- warmup -----------------------------------------------------------------------

    def warmup(
        self,
        history: Mapping[str, tuple[Sequence[int], Sequence[float]]] | Any,
        *,
        progress: bool = False,
        time_unit: str | None = None,
        columns: Mapping[str, str] | None = None,
    ) -> StepResult:
        """Apply each symbol's history ``(times, closes)`` in one batched pass per chunk.

        ``history`` may also be ``{symbol: Series}`` (time index), or a long pandas
        DataFrame / Arrow table with ``symbol``, ``time``, ``close`` columns (renamed by
        ``columns``); times as in :meth:`step` (``time_unit`` for integer epochs).
        Symbols not registered yet are added (one stream per parameter set). Equal to
        calling ``step`` bar by bar; streams that already hold state continue from it.
        Bad bars are rejected as in ``step`` and the rest of the history still applies;
        a form that cannot be converted exactly raises ``ValueError``.
        Returns the outputs of each stream's last applied bar.

        With strategies, each symbol's history is ``(times, opens, highs, lows, closes)``
        (or a long table with those columns): the strategies step every bar too, so that
        warmup then ``step`` equals ``backtest`` over the whole series; the result's
        strategy outputs are those of each stream's last bar (trades closed before it
        are in :meth:`strategy_metrics`, not listed).
        """
        return warmups.warmup(self, history, progress, time_unit, columns)

    # -- snapshots (format: state/snapshot.py; stores: state/snapshot_stores.py) ---------------

    @property
    def source_offsets(self) -> dict[str, Any]:
        """Where each input stands (Redis Stream ID, file row, ...): callers update it;
        saved in every snapshot and restored by ``restore``."""
        return self._source_offsets

    @source_offsets.setter
    def source_offsets(self, value: Mapping[str, Any]) -> None:
        self._source_offsets = dict(value)

    def capture_snapshot(self, source_offsets: Mapping[str, Any] | None = None, *, copy=True):
        """Copy the state (pulled from the device first) for ``snapshot.encode_snapshot``.

        Only array copies: cheap enough for the step loop; encoding can run elsewhere.
        ``source_offsets`` are merged into ``self.source_offsets`` first.
        """
        return snapshots.capture(self, source_offsets, copy)

    def snapshot(
        self, source_offsets: Mapping[str, Any] | None = None, compression: str = "zlib"
    ) -> bytes:
        """A versioned, checksummed blob of the whole state; ``Engine.restore`` reads it."""
        from atc_stream.state.snapshot import encode_snapshot

        return encode_snapshot(self.capture_snapshot(source_offsets, copy=False), compression)

    def export_streams(
        self, symbols: Iterable[str], source_offsets: Mapping[str, Any] | None = None
    ) -> bytes:
        """A snapshot blob (``restore`` reads it, on any backend) of every stream (each
        parameter set and strategy) of ``symbols`` only; ``ValueError`` naming an unknown
        symbol. It records ``source_offsets`` over the engine's own and no rejection
        counts (docs/design/resharding-and-sweeps.md)."""
        return snapshots.export_streams(self, symbols, source_offsets)

    def import_streams(self, blob) -> list[StreamKey]:
        """Add the streams of another snapshot (state copied bit for bit, so each goes on
        exactly where it stood); their keys. ``ValueError`` naming the conflict when its
        parameter table, interval or strategies differ or it holds a stream already here;
        ``SnapshotError`` if it does not verify. ``source_offsets`` stay this engine's."""
        return snapshots.import_streams(self, blob)

    @classmethod
    def restore(
        cls,
        blob,
        backend: str = "auto",
        threads: int | None = None,
        outputs: str | Sequence[str] | None = None,
        cuda_graph: bool = False,
    ) -> Engine:
        """The engine a snapshot blob was taken from; ``SnapshotError`` if it does not verify.

        ``outputs`` and ``cuda_graph`` as in the constructor (a snapshot holds state, not
        these choices).

        ``blob`` may also be an already verified ``state.snapshot.Snapshot`` (a store's
        ``latest().decoded``), so that a blob is decoded once.
        """
        from atc_stream.state.snapshot import Snapshot, decode_snapshot

        snap = blob if isinstance(blob, Snapshot) else decode_snapshot(blob)
        h = snap.header
        eng = cls(
            snap.params, backend=backend,
            interval=h.interval if is_interval(h.interval) else "1m",
            capacity=h.capacity, threads=threads, outputs=outputs, cuda_graph=cuda_graph,
            strategies=snap.strategies or None,
        )  # fmt: skip
        eng.interval = h.interval  # older versions took any label; the streams' keys hold it
        snapshots.load_state(eng, snap, backend)
        return eng
