"""The CUDA kernels (each runs the core update as a device function) and their launch types.

Design (numerics, layout, thread mapping): docs/design/cuda.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from numba import cuda

from atc_stream.core import schema
from atc_stream.core.output_row import OUT_LONG, OUT_SHORT
from atc_stream.kernels.compile import compile_core
from atc_stream.kernels.ptx_guard import compute_capability_stand_in, no_fma
from atc_stream.kernels.ptx_guard import kernel as ptx_kernel
from atc_stream.state.layout import (
    BAR_INDEX,
    CUTOUT_COLUMN,
    LANES,
    N_COUNTER_FIELDS,
    N_VALUE_FIELDS,
    PARAM_ROW,
)

# kernels compile from the checked -fma=0 PTX (ptx_guard.kernel: link-time optimisation off)
_kernel = ptx_kernel

# -- the device functions: the core, compiled for CUDA ----------------------------------

_core = compile_core(cuda.jit(device=True))
update_stream = _core.update_stream


@cuda.jit(device=True)
def table_growth(growth_table, counters, param_lengths, slot):
    """``core.stream_growth`` with the exp read from the host-computed table."""
    param_row = counters[slot, PARAM_ROW]
    cutout = param_lengths[param_row, CUTOUT_COLUMN]
    bar_index = counters[slot, BAR_INDEX]
    if bar_index < cutout:
        return 1.0
    return growth_table[param_row, bar_index - cutout]


# -- kernels ------------------------------------------------------------------------------


@_kernel
def step_kernel(
    ring, values, counters, param_lengths, param_values, growth_table,
    plan, m, start, stop, times, closes, out,
):  # fmt: skip
    """One round of a planned step: update ``k`` in ``[start, stop)`` of the plan order.

    ``plan[k]`` is the slot of the k-th accepted update (plan order: rounds ascending,
    slots ascending within a round, so neighbouring threads read neighbouring state)
    and ``plan[m + k] = u`` its position in the host's batch: the bar time and close are
    read from the host-order inputs ``times[u]``/``closes[u]`` and the outputs written to
    the host-order row ``out[u]`` (C order), so the host neither gathers nor scatters.
    """
    k = start + cuda.grid(1)  # type: ignore[call-arg]
    if k < stop:
        slot = plan[k]
        u = plan[m + k]
        growth = table_growth(growth_table, counters, param_lengths, slot)
        update_stream(
            ring, values, counters, slot, times[u], closes[u], growth,
            param_lengths, param_values, out, u,
        )  # fmt: skip


@_kernel
def preview_kernel(
    ring, values, counters, param_lengths, param_values, growth_table,
    plan, m, times, closes, scratch_ring, scratch_values, scratch_counters, out,
):  # fmt: skip
    """Like ``cpu.preview``: copy the slot's state to scratch slot ``k`` and update that.

    ``plan`` as in ``step_kernel`` (one round); inputs and outputs in host order.
    """
    k: int = cuda.grid(1)  # type: ignore[call-arg]
    if k < m:
        slot = plan[k]
        u = plan[m + k]
        for f in range(ring.shape[1]):
            scratch_ring[k, f] = ring[slot, f]
        for f in range(values.shape[1]):
            scratch_values[k // LANES, f, k % LANES] = values[slot // LANES, f, slot % LANES]
        for f in range(counters.shape[1]):
            scratch_counters[k, f] = counters[slot, f]
        growth = table_growth(growth_table, scratch_counters, param_lengths, k)
        update_stream(
            scratch_ring, scratch_values, scratch_counters, k, times[u], closes[u], growth,
            param_lengths, param_values, out, u,
        )  # fmt: skip


@_kernel
def transpose_kernel(src, n, width, dst):
    """``dst[t, s] = src[s, t]`` (``src``: n x width, ``dst``: width x n, both C order).

    The warmup's device-side transpose: the host uploads the histories as they are
    (one stream per row) and the time loop then reads one bar of 32 neighbouring
    streams per warp instruction. One thread per stream: its writes are coalesced.
    """
    s: int = cuda.grid(1)  # type: ignore[call-arg]
    if s < n:
        for t in range(width):
            dst[t, s] = src[s, t]


@_kernel
def warmup_kernel(
    ring, values, counters, param_lengths, param_values, growth_table,
    ints, n, closes, out, record_all,
):  # fmt: skip
    """Stream ``s`` (slot ``ints[s]``) applies ``ints[n + s]`` bars of ``closes[:, s]``.

    Loops over time inside the kernel on the F-order global state. ``ints[2n + s]`` is
    the stream's *last* bar time: ``update_stream`` only ever writes ``LAST_TIME`` (never
    reads it), so passing the last time for every bar leaves the same final state and
    saves uploading the whole time matrix. Outputs (C order, the host's ``(n, rows)``
    order): ``out[s * rows + t]`` per bar with ``record_all``, else the last bar's in
    ``out[s]``.
    """
    s: int = cuda.grid(1)  # type: ignore[call-arg]
    if s < n:
        slot = ints[s]
        bar_time = ints[2 * n + s]
        rows = out.shape[0] // n
        for t in range(ints[n + s]):
            growth = table_growth(growth_table, counters, param_lengths, slot)
            row = s * rows + t if record_all else s
            update_stream(
                ring, values, counters, slot, bar_time, closes[t, s], growth,
                param_lengths, param_values, out, row,
            )  # fmt: skip


_local_warmup_kernels: dict[int, Any] = {}


def local_warmup_kernel(ring_columns: int) -> Any:
    """The warmup kernel with the stream's state in ``cuda.local.array``s (one per ring size).

    Local array shapes must be compile-time constants, so one kernel is made per ring
    width (a closure constant). The state is copied in at the start, the time loop runs
    the same core functions on the local copies (slot 0), and the state is written back.
    Local memory is private per thread and interleaved by the hardware, so accesses stay
    coalesced and cached in L1 without the slot stride. Little can live in registers:
    the core indexes its arrays with loop variables, so the arrays stay in local memory
    (its cost against ``warmup_kernel``: docs/design/cuda.md, "Thread mapping").
    """
    kernel = _local_warmup_kernels.get(ring_columns)
    if kernel is not None:
        return kernel
    ring_cols = ring_columns

    def warmup_local(
        ring, values, counters, param_lengths, param_values, growth_table,
        ints, n, closes, out, record_all,
    ):  # fmt: skip
        s: int = cuda.grid(1)  # type: ignore[call-arg]
        if s < n:
            slot = ints[s]
            bar_time = ints[2 * n + s]
            local_ring = cuda.local.array((1, ring_cols), np.float64)
            local_values = cuda.local.array((1, N_VALUE_FIELDS, 1), np.float64)
            local_counters = cuda.local.array((1, N_COUNTER_FIELDS), np.int64)
            for f in range(ring_cols):
                local_ring[0, f] = ring[slot, f]
            for f in range(N_VALUE_FIELDS):
                local_values[0, f, 0] = values[slot // LANES, f, slot % LANES]
            for f in range(N_COUNTER_FIELDS):
                local_counters[0, f] = counters[slot, f]
            rows = out.shape[0] // n
            for t in range(ints[n + s]):
                growth = table_growth(growth_table, local_counters, param_lengths, 0)
                row = s * rows + t if record_all else s
                update_stream(
                    local_ring, local_values, local_counters, 0, bar_time, closes[t, s],
                    growth, param_lengths, param_values, out, row,
                )  # fmt: skip
            for f in range(ring_cols):
                ring[slot, f] = local_ring[0, f]
            for f in range(N_VALUE_FIELDS):
                values[slot // LANES, f, slot % LANES] = local_values[0, f, 0]
            for f in range(N_COUNTER_FIELDS):
                counters[slot, f] = local_counters[0, f]

    kernel = _kernel(warmup_local)
    _local_warmup_kernels[ring_columns] = kernel
    return kernel


@_kernel
def last_rows_kernel(out, ints, n, last):
    """``last[s]`` = the output row of the last bar of warmup stream ``s`` (``ints[n + s]``
    bars) in ``out``, which kept every bar's (``warmup_kernel`` with ``record_all``);
    streams without bars are left alone."""
    s: int = cuda.grid(1)  # type: ignore[call-arg]
    if s < n and ints[n + s] > 0:
        row = s * (out.shape[0] // n) + ints[n + s] - 1
        for f in range(out.shape[1]):
            last[s, f] = out[row, f]


@_kernel
def pack_outputs_kernel(out, n, spec, k, floats, flags, events):
    """The requested outputs only, field-major so that each field is one contiguous
    block on the host: for requested float column ``j < k``, ``floats[n * spec[k + j] +
    u * spec[2k + j] + spec[3k + j]] = out[u, spec[j]]`` (the field's first packed
    column, its width, the column within it: field ``f`` of width ``w`` starting at
    packed column ``c0`` is the C-order ``(n, w)`` block ``floats[n*c0 : n*(c0 + w)]``).
    With ``events``, ``flags[u]`` = long and ``flags[n + u]`` = short, one byte each
    (0/1, read on the host as bool). ``bar_index`` is not copied: the host knows it
    (``cuda_host.commit_step``)."""
    u: int = cuda.grid(1)  # type: ignore[call-arg]
    if u < n:
        for j in range(k):
            floats[n * spec[k + j] + u * spec[2 * k + j] + spec[3 * k + j]] = out[u, spec[j]]
        if events:
            flags[u] = 1 if out[u, OUT_LONG] == 1.0 else 0
            flags[n + u] = 1 if out[u, OUT_SHORT] == 1.0 else 0


def pack_layout(groups: Sequence[str]) -> tuple[np.ndarray, list[tuple[str, int, int]]]:
    """The ``spec`` of ``pack_outputs_kernel`` for output ``groups`` and the host's
    reading of it: ``(name, first packed column, width)`` per float field."""
    out_columns: list[int] = []
    first: list[int] = []
    width: list[int] = []
    within: list[int] = []
    fields: list[tuple[str, int, int]] = []
    c0 = 0
    for name in schema.fields_for(groups):
        columns = schema.FLOAT_FIELD_COLUMNS.get(name)
        if columns is None:  # bar_index (host), long/short (flags)
            continue
        w = len(columns)
        for c, column in enumerate(columns):
            out_columns.append(column)
            first.append(c0)
            width.append(w)
            within.append(c)
        fields.append((name, c0, w))
        c0 += w
    spec = np.array(out_columns + first + width + within, np.int64)
    return spec, fields


@_kernel
def scatter_rows_kernel(dst, slots, src):
    """``dst[slots[i], :] = src[i, :]``: upload of host-initialised slots."""
    i: int = cuda.grid(1)  # type: ignore[call-arg]
    if i < slots.shape[0]:
        slot = slots[i]
        for f in range(dst.shape[1]):
            dst[slot, f] = src[i, f]


@_kernel
def scatter_values_kernel(values, slots, src):
    """``values[slots[i]] = src[i, :]`` in the lane layout: upload of host-initialised
    slots' values."""
    i: int = cuda.grid(1)  # type: ignore[call-arg]
    if i < slots.shape[0]:
        slot = slots[i]
        for f in range(values.shape[1]):
            values[slot // LANES, f, slot % LANES] = src[i, f]


# -- launch signatures and PTX (PTX needs libNVVM, not a GPU) --------------------------


def kernel_signatures(local_ring_columns: int | None = 70) -> dict[str, tuple[Any, tuple]]:
    """Every kernel the backend launches, with the argument types it launches it with.

    These are the specialisations ``CudaBackend.precompile`` compiles and ``kernel_ptx``
    reads. ``local_ring_columns``: also the local-state warmup kernel for that ring width
    (None: leave it out).
    """
    from numba import types as nt

    f2f = nt.Array(nt.float64, 2, "F")
    i2f = nt.Array(nt.int64, 2, "F")
    f2c = nt.Array(nt.float64, 2, "C")
    f3c = nt.Array(nt.float64, 3, "C")
    i2c = nt.Array(nt.int64, 2, "C")
    i1 = nt.Array(nt.int64, 1, "C")
    f1 = nt.Array(nt.float64, 1, "C")
    u1 = nt.Array(nt.uint8, 1, "C")
    i64 = nt.int64
    state = (f2f, f3c, i2f, i2c, f2c, f2c)
    warmup = (*state, i1, i64, f2c, f2c, nt.boolean)
    signatures = {
        "step_kernel": (step_kernel, (*state, i1, i64, i64, i64, i1, f1, f2c)),
        "preview_kernel": (preview_kernel, (*state, i1, i64, i1, f1, f2f, f3c, i2f, f2c)),
        "warmup_kernel": (warmup_kernel, warmup),
        "transpose_kernel": (transpose_kernel, (f2c, i64, i64, f2c)),
        "last_rows_kernel": (last_rows_kernel, (f2c, i1, i64, f2c)),
        "pack_outputs_kernel": (pack_outputs_kernel, (f2c, i64, i1, i64, f1, u1, nt.boolean)),
        "scatter_rows_kernel": (scatter_rows_kernel, (f2f, i1, f2c)),
        "scatter_rows_kernel(int64)": (scatter_rows_kernel, (i2f, i1, i2c)),
        "scatter_values_kernel": (scatter_values_kernel, (f3c, i1, f2c)),
    }
    if local_ring_columns is not None:
        name = f"local_warmup_kernel({local_ring_columns})"
        signatures[name] = (local_warmup_kernel(local_ring_columns), warmup)
    return signatures


def kernel_ptx(cc: tuple[int, int] = (9, 0), names: Iterable[str] | None = None) -> dict[str, str]:
    """PTX of the backend's kernels, compiled as the backend compiles them (``-fma=0``).

    Needs libNVVM and NVRTC (the ``nvidia-nvvm``/``nvidia-cuda-nvrtc`` wheels or a CUDA
    toolkit), not a GPU. ``names``: only these keys of ``kernel_signatures()``.
    """
    wanted = None if names is None else set(names)
    out = {}
    with compute_capability_stand_in(cc):
        for name, (kernel, argtypes) in kernel_signatures().items():
            if wanted is not None and name not in wanted:
                continue
            with no_fma():
                ptx, _ = cuda.compile_ptx(kernel.py_func, argtypes, cc=cc, lineinfo=False)
            out[name] = ptx
    return out
