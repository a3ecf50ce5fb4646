"""CUDA drivers: the core update compiled with ``numba.cuda.jit(device=True)``, and ``CudaBackend``.

The kernels below call the *same* functions of ``kernels/core.py`` as the CPU drivers
(``compile_core(cuda.jit(device=True))``), so the GPU runs the arithmetic of the CPU
operation for operation; what is left to get right is the compiler and the layout:

Numerics (float64 only: every state array, input and output is float64/int64; there
is no float32 path, on purpose — the parity contract of docs/spec.md is about doubles).

* **No FMA contraction.** NVVM contracts ``a*b + c`` into ``fma.rn.f64`` by default
  (libNVVM option ``-fma=1``), and numba-cuda 0.30 exposes no switch for it:
  ``cuda.jit(fastmath=True)`` *adds* ``fma=1``/``ftz``/approximate division, and
  ``fastmath=False`` (the default) passes nothing, which leaves NVVM's default on.
  (Upstream: NVIDIA/numba-cuda issue #118, PR #839, not released.) We therefore wrap
  ``numba.cuda.cudadrv.nvvm.compile_ir`` once and, only while one of *our* kernels
  is being compiled (the thread-local ``no_fma()`` context around every compile and
  launch), add ``fma=False``, which numba turns into ``-fma=0``: NVVM then emits
  ``mul.rn.f64`` and ``add.rn.f64``, whose explicit rounding also forbids ptxas from
  fusing them. Our kernels are compiled with ``lto=False`` so that this PTX is what
  gets linked (with LTO the final code generation would happen in nvJitLink, which
  has its own ``-fma`` setting).
  The hook wraps a private function, so it is *guarded*, not trusted: numba-cuda is
  pinned to the verified range (``NUMBA_CUDA_VERIFIED``), and the backend reads the
  PTX of every kernel specialisation when it is compiled (``precompile`` at
  construction, ``check_no_fma`` after any later compile) and raises
  ``FmaContractionError`` — refusing to run — if ``fma.rn.f64`` appears. In CI,
  without a GPU, ``tests/test_cuda_ptx.py`` compiles every kernel with its launch
  types to PTX for sm_80 and sm_90 with libNVVM (``kernel_ptx``; the ``nvidia-nvvm``
  wheel of the test extra): the step kernel has 23 ``fma.rn.f64`` without the hook
  and none with it, and no ``ex2`` (no device ``exp``). The SASS is not the thing to
  check: ``div.rn.f64`` itself expands to ``DFMA`` instructions.
* **Growth factor from the host.** ``exp`` on the device is libdevice's, not glibc's.
  The growth ``exp(lam * (i - cutout))`` therefore comes from a table computed on the
  host with ``cpu.growth_factor`` (the njit-compiled core function, i.e. glibc ``exp``):
  ``table[param_row, i - cutout]``. The table depends only on the parameter row and the
  bar index, so one small table serves step, preview and warmup; it is extended (by
  doubling) when a stream's bar index passes its end. The core's ``update_stream``
  takes ``growth`` as an argument precisely so that the device never calls ``exp``.
* Division is IEEE ``div.rn.f64`` and ``floor``/``abs``/comparisons are exact, so with
  the two points above every operation rounds as on the CPU.

Layout. The core indexes ``[slot, field]``. On the device the state arrays are kept
in the transposed (Fortran) order, so the 32 threads of a warp (32 neighbouring
slots) read one field of 32 neighbouring slots: one coalesced transaction. numba
compiles the same core source for the F-order arrays (and for the C-order local
arrays of the local-state warmup). A one-row F-order array is also C-contiguous
(numba would type it as C order and compile a second specialisation), so the device
state has at least two rows.

Step plan and outputs. The host sends a plan: per accepted update, in plan order
(rounds ascending, *slots ascending within a round*, so neighbouring threads read
neighbouring state), its slot and its position ``u`` in the host's batch
(``_build_plan``, compiled). The kernel reads the bar time and close from the
host-order inputs and writes the outputs to the host-order row ``out[u]`` in C
order, the layout ``StepResult`` reads: the host neither gathers inputs nor
transposes or scatters outputs (one copy per requested field out of the pinned
buffers). While a step's
slots repeat with every update accepted in one round (the steady one-bar-per-stream
case), the plan on the device is reused and only times and closes are uploaded.
Every kernel specialisation is compiled when the backend is built
(``precompile``), so nothing compiles inside a live step (e.g. a batch of one).

Thread mapping: one thread per stream-update. The core updates a whole stream for
one bar (54 MAs, their windows, both equity layers, events) in one call; mapping
threads to (update, family) or (update, MA) would need the core split into phases
with reductions between them, i.e. a second source of the arithmetic, which is what
this project refuses. One thread per update keeps parity by construction. Its cost
is occupancy for small batches (1,000 updates fill a fraction of one wave on an
H100) and a long per-thread instruction stream; whether a finer mapping pays off
has NOT been measured (no GPU was lent while this was written). Threads per block is
a parameter (``CudaBackend(threads_per_block=...)``, default ``THREADS_PER_BLOCK``,
an unmeasured placeholder; ``benchmarks/bench_cuda.py --threads`` sweeps it).

State on the device, host mirror. ``CudaBackend`` keeps the authoritative state on
the device; the store's host arrays are the staging copy: ``pull_state`` copies the
device state into them (through pinned F-order mirrors, async on the backend's CUDA
stream), ``push_state`` uploads them. The host ``counters`` columns ``BAR_INDEX`` and
``LAST_TIME`` are kept current after every step/warmup by applying the same
increments on the host (``batch.plan_rounds`` validates against them), without
copying anything back. Host-side changes are detected before each launch: a slot
whose ``(BAR_INDEX, LAST_TIME, PARAM_ROW)`` differs from what the device was last
given was (re)initialised on the host (``allocate``/``release``/``reset_slot``) and is
uploaded alone; a new ``store.generation`` (capacity or ring growth, new parameter
set) means the host arrays were rebuilt from a stale copy, so the device state of
every untouched stream is merged into the new layout (the ring re-laid out with the
store's own ``_grow_ring``) and everything is pushed.

Transfers: step inputs go through pinned staging buffers and async copies on one
CUDA stream; the host counter update runs while the kernel executes. Only the
requested outputs come back (``step_outputs``, ``Engine(outputs=...)``): a packing
kernel (``pack_outputs_kernel``) gathers the requested float columns into one block
and the long/short events into one byte each, two copies; ``bar_index`` is never
copied (the host counters give it, ``_commit_step``), ``ready`` is computed on the
host from it. The step's buffers come in two alternating pinned sets
(``kernels/cuda_io.py``): ``step_outputs_async`` (``Engine.step_async``) returns
before the device is done, so the host validates, plans and stages step k+1 while
step k's copies and kernels run. Optionally (``cuda_graph=True``) the steady step's
copy/launch/copy sequence is one captured CUDA graph (CuPy stream capture; numba-cuda
0.30 has no graph API), replayed while the slot set, size and outputs repeat. Neither
gain is measured (no GPU lent); ``benchmarks/bench_cuda.py`` times them on a device.
Overlapping a warmup's upload with compute (time-chunked double buffering) was not
built. The warmup uploads
the histories as the host holds them (one stream per row, a memcpy into pinned
memory), transposes them on the device (``transpose_kernel``) to the time-major
layout the time loop reads coalesced, and splits the streams into chunks whose
device buffers fit ``warmup_memory_budget``.

Arrays: CuPy allocates the device arrays when it is importable (its memory pool;
real GPU only), wrapped as numba device arrays through ``__cuda_array_interface__``
so that copies and launches are one code path; otherwise numba device arrays (and
under ``NUMBA_ENABLE_CUDASIM=1`` the simulator's).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import types

import numpy as np
from numba import cuda, njit

from atc_stream.core import schema
from atc_stream.core.output_row import (
    N_OUT,
    OUT_LONG,
    OUT_SHORT,
)
from atc_stream.kernels import AUTO_MIN_STREAMS, cpu, cuda_simulated  # noqa: F401 - AUTO_MIN_STREAMS re-exported
from atc_stream.kernels.compile import compile_core
from atc_stream.kernels.cuda_io import IoSet, PendingOutputs, Staging, StepGraphs
from atc_stream.state import layout as L
from atc_stream.state.arrays import StateStore
from atc_stream.state.layout import (
    BAR_INDEX,
    CUTOUT_COLUMN,
    LAST_TIME,
    N_COUNTER_FIELDS,
    N_VALUE_FIELDS,
    PARAM_ROW,
    PV_LAM,
)

log = logging.getLogger("atc_stream")

#: Threads per block of every kernel. Placeholder: not measured (no GPU was lent); the
#: kernels are register-heavy, so 128 is a conservative guess to be tuned on a device.
THREADS_PER_BLOCK = 128
#: The local-state warmup keeps a stream's ring in a ``cuda.local.array``; above this
#: many ring columns (2 x (longest length + 1)) the global-state kernel is used.
LOCAL_RING_MAX_COLUMNS = 512
#: First length of the growth table (bars after cutout); it doubles when outgrown.
GROWTH_TABLE_MIN = 4096

# -- compiling without FMA contraction -------------------------------------------------

#: the numba-cuda releases the no-FMA hook below was verified with (pyproject.toml pins
#: the same range; tests/test_cuda_ptx.py checks the installed one and the hook's effect)
NUMBA_CUDA_VERIFIED = ">=0.30.4,<0.31"

_no_fma_state = threading.local()


def _install_no_fma_hook() -> None:
    """Wrap ``nvvm.compile_ir`` (once) so that compiles inside ``no_fma()`` pass ``-fma=0``."""
    from numba.cuda.cudadrv import nvvm

    if getattr(nvvm.compile_ir, "_atc_stream_no_fma", False):
        return
    original = nvvm.compile_ir

    def compile_ir(llvmir, **options):
        if getattr(_no_fma_state, "depth", 0):
            # numba's CompilationUnit turns this into the libNVVM option "-fma=0".
            options["fma"] = False
        return original(llvmir, **options)

    compile_ir._atc_stream_no_fma = True
    nvvm.compile_ir = compile_ir


@contextlib.contextmanager
def no_fma():
    """Kernels compiled (lazily, at their first launch) inside this block get ``-fma=0``."""
    if cuda_simulated():  # nothing is compiled by the simulator
        yield
        return
    _install_no_fma_hook()
    _no_fma_state.depth = getattr(_no_fma_state, "depth", 0) + 1
    try:
        yield
    finally:
        _no_fma_state.depth -= 1


class FmaContractionError(RuntimeError):
    """A kernel's PTX holds ``fma.rn.f64``: the no-FMA switch did not take effect."""


def _kernel_ptx_strings(overload) -> list[str]:
    """The PTX a compiled kernel (a ``_Kernel``) was linked from, as numba holds it."""
    library = overload.library
    cache = getattr(library, "_ptx_cache", None)
    if isinstance(cache, dict) and cache:
        return [ptx for strings in cache.values() for ptx in strings]
    # numba-cuda internals moved, or the kernel came from a disk cache: compile its IR
    # again the way the backend compiles it
    with no_fma():
        return [overload.inspect_asm(None)]


def ptx_has_fma(ptx: str) -> bool:
    """Whether PTX holds a double-precision fused multiply-add (any rounding mode)."""
    return re.search(r"\bfma\.r[nzmp]\.f64\b", ptx) is not None


_checked_overloads: dict[int, int] = {}


def check_no_fma(kernel, what: str | None = None) -> None:
    """Refuse (``FmaContractionError``) if any compiled specialisation of ``kernel`` has FMA.

    ``kernel`` is a numba-cuda kernel dispatcher. Each specialisation is read once (the
    count of checked ones is remembered), so calling this after every launch costs one
    dict lookup in the steady state. Never raises for the simulator (nothing compiled).
    """
    if cuda_simulated():
        return
    overloads = kernel.overloads
    if _checked_overloads.get(id(kernel)) == len(overloads):
        return
    name = what or getattr(getattr(kernel, "py_func", None), "__name__", repr(kernel))
    for argtypes, overload in list(overloads.items()):
        check_ptx_no_fma(f"{name}{argtypes}", _kernel_ptx_strings(overload))
    _checked_overloads[id(kernel)] = len(overloads)


def check_ptx_no_fma(what: str, ptxes) -> None:
    """Raise ``FmaContractionError`` naming ``what`` if any of ``ptxes`` holds an f64 FMA."""
    for ptx in ptxes:
        if ptx_has_fma(ptx):
            raise FmaContractionError(
                f"{what}: the PTX holds fma.rn.f64, i.e. NVVM contracted a*b + c although "
                "atc-stream compiles its kernels with -fma=0; results would differ from the "
                "CPU path. The no-FMA hook on numba-cuda's nvvm.compile_ir no longer takes "
                f"effect (numba-cuda {_numba_cuda_version()}; verified with "
                f"{NUMBA_CUDA_VERIFIED}). Refusing to run."
            )


def _numba_cuda_version() -> str:
    try:
        from importlib.metadata import version

        return version("numba-cuda")
    except Exception:  # not installed as a distribution
        return "unknown"


# The simulator's jit takes no ``lto``; on a device, LTO off keeps NVVM's -fma=0 PTX final.
_kernel = cuda.jit if cuda_simulated() else cuda.jit(lto=False)

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
    k = start + cuda.grid(1)
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
    """Like ``cpu.preview``: copy the slot's rows to scratch row ``k`` and update those.

    ``plan`` as in ``step_kernel`` (one round); inputs and outputs in host order.
    """
    k = cuda.grid(1)
    if k < m:
        slot = plan[k]
        u = plan[m + k]
        for f in range(ring.shape[1]):
            scratch_ring[k, f] = ring[slot, f]
        for f in range(values.shape[1]):
            scratch_values[k, f] = values[slot, f]
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
    s = cuda.grid(1)
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
    s = cuda.grid(1)
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


_local_warmup_kernels: dict[int, object] = {}


def local_warmup_kernel(ring_columns: int):
    """The warmup kernel with the stream's state in ``cuda.local.array``s (one per ring size).

    Local array shapes must be compile-time constants, so one kernel is made per ring
    width (a closure constant). The state is copied in at the start, the time loop runs
    the same core functions on the local copies (slot 0), and the state is written back.
    Local memory is private per thread and interleaved by the hardware, so accesses stay
    coalesced and cached in L1 without the slot stride. Little can live in registers:
    the core indexes its arrays with loop variables, so the arrays stay in local memory.
    Static cost (``ptxas -v``, sm_90, this code): 250 registers and a 3,312-byte stack
    frame per thread, against 118 registers for ``warmup_kernel`` — about half the
    occupancy. That is why ``CudaBackend`` defaults to the global-state kernel; the run
    time of either is NOT measured (no GPU lent): ``benchmarks/bench_cuda.py`` times both.
    """
    kernel = _local_warmup_kernels.get(ring_columns)
    if kernel is not None:
        return kernel
    ring_cols = ring_columns

    def warmup_local(
        ring, values, counters, param_lengths, param_values, growth_table,
        ints, n, closes, out, record_all,
    ):  # fmt: skip
        s = cuda.grid(1)
        if s < n:
            slot = ints[s]
            bar_time = ints[2 * n + s]
            local_ring = cuda.local.array((1, ring_cols), np.float64)
            local_values = cuda.local.array((1, N_VALUE_FIELDS), np.float64)
            local_counters = cuda.local.array((1, N_COUNTER_FIELDS), np.int64)
            for f in range(ring_cols):
                local_ring[0, f] = ring[slot, f]
            for f in range(N_VALUE_FIELDS):
                local_values[0, f] = values[slot, f]
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
                values[slot, f] = local_values[0, f]
            for f in range(N_COUNTER_FIELDS):
                counters[slot, f] = local_counters[0, f]

    kernel = _kernel(warmup_local)
    _local_warmup_kernels[ring_columns] = kernel
    return kernel


@_kernel
def pack_outputs_kernel(out, n, spec, k, floats, flags, events):
    """The requested outputs only, field-major so that each field is one contiguous
    block on the host: for requested float column ``j < k``, ``floats[n * spec[k + j] +
    u * spec[2k + j] + spec[3k + j]] = out[u, spec[j]]`` (the field's first packed
    column, its width, the column within it: field ``f`` of width ``w`` starting at
    packed column ``c0`` is the C-order ``(n, w)`` block ``floats[n*c0 : n*(c0 + w)]``).
    With ``events``, ``flags[u]`` = long and ``flags[n + u]`` = short, one byte each
    (0/1, read on the host as bool). ``bar_index`` is not copied: the host knows it
    (``_commit_step``)."""
    u = cuda.grid(1)
    if u < n:
        for j in range(k):
            floats[n * spec[k + j] + u * spec[2 * k + j] + spec[3 * k + j]] = out[u, spec[j]]
        if events:
            flags[u] = 1 if out[u, OUT_LONG] == 1.0 else 0
            flags[n + u] = 1 if out[u, OUT_SHORT] == 1.0 else 0


def pack_layout(groups) -> tuple[np.ndarray, list[tuple[str, int, int]]]:
    """The ``spec`` of ``pack_outputs_kernel`` for output ``groups`` and the host's
    reading of it: ``(name, first packed column, width)`` per float field."""
    out_columns, first, width, within, fields = [], [], [], [], []
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
    i = cuda.grid(1)
    if i < slots.shape[0]:
        slot = slots[i]
        for f in range(dst.shape[1]):
            dst[slot, f] = src[i, f]


# -- host helpers (njit: they run on every step) ------------------------------------------

_SHADOW_COLUMNS = (BAR_INDEX, LAST_TIME, PARAM_ROW)


@njit(cache=True)
def _find_changed(counters, shadow, slots, count, changed):
    """Slots among ``slots[:count]`` whose host counters differ from what the device holds.

    Writes them to ``changed`` (each once) and returns how many; marks them current in
    ``shadow``.
    """
    n = 0
    for i in range(count):
        slot = slots[i]
        if (
            counters[slot, BAR_INDEX] != shadow[slot, 0]
            or counters[slot, LAST_TIME] != shadow[slot, 1]
            or counters[slot, PARAM_ROW] != shadow[slot, 2]
        ):
            shadow[slot, 0] = counters[slot, BAR_INDEX]
            shadow[slot, 1] = counters[slot, LAST_TIME]
            shadow[slot, 2] = counters[slot, PARAM_ROW]
            changed[n] = slot
            n += 1
    return n


@njit(cache=True)
def _build_plan(slots, order, round_starts, plan, where):
    """The device plan: ``plan[k]`` slot, ``plan[m + k]`` host position, k in plan order.

    Within each round the updates are sorted by slot, so that neighbouring threads read
    neighbouring state (coalesced). A round whose slots span a range not much larger
    than itself is sorted by scattering into ``where`` (one entry per slot, all -1 on
    entry and on exit) and scanning the range; a sparse round by ``argsort``.
    """
    m = order.shape[0]
    for r in range(round_starts.shape[0] - 1):
        a, b = round_starts[r], round_starts[r + 1]
        if a == b:
            continue
        lo = hi = slots[order[a]]
        for k in range(a, b):
            lo = min(lo, slots[order[k]])
            hi = max(hi, slots[order[k]])
        if hi - lo + 1 <= 4 * (b - a) + 64:
            for k in range(a, b):
                where[slots[order[k]]] = order[k]
            k = a
            for slot in range(lo, hi + 1):
                u = where[slot]
                if u >= 0:
                    plan[k] = slot
                    plan[m + k] = u
                    where[slot] = -1
                    k += 1
        else:
            segment = np.empty(b - a, np.int64)
            for k in range(a, b):
                segment[k - a] = slots[order[k]]
            ranked = np.argsort(segment)
            for i in range(b - a):
                u = order[a + ranked[i]]
                plan[a + i] = slots[u]
                plan[m + a + i] = u


@njit(cache=True)
def _plan_in_order(slots, order, plan):
    """A preview's plan: like ``_build_plan`` but unsorted (a preview may hold one slot
    twice: each gets its own scratch row)."""
    m = order.shape[0]
    for k in range(m):
        plan[k] = slots[order[k]]
        plan[m + k] = order[k]


@njit(cache=True)
def _commit_step(counters, shadow, plan, m, times, max_bar, bar_index):
    """Apply a step's counter changes on the host (as the kernel does on the device).

    Walks the host copy of the device plan (``plan[k]`` slot, ``plan[m + k]`` host
    position; rounds ascending, so a stream's bars in time order; slots ascending within
    a round, so the counters are read in memory order: with 100,000 shuffled streams
    1.3-5x faster than arrival order on the 2-core test VM, ``bench_cuda.py
    --host-costs``). ``bar_index[u]`` receives the index of the bar
    update ``u`` applied (the kernel's ``OUT_BAR_INDEX``), so that it is never copied back.
    """
    for k in range(m):
        slot = plan[k]
        u = plan[m + k]
        applied = counters[slot, BAR_INDEX]
        bar_index[u] = applied
        bar = applied + 1
        counters[slot, BAR_INDEX] = bar
        counters[slot, LAST_TIME] = times[u]
        shadow[slot, 0] = bar
        shadow[slot, 1] = times[u]
        if bar > max_bar:
            max_bar = bar
    return max_bar


@njit(cache=True)
def _pack_warmup(slots, times, counts, ints):
    n = slots.shape[0]
    for s in range(n):
        ints[s] = slots[s]
        ints[n + s] = counts[s]
        ints[2 * n + s] = times[s, counts[s] - 1] if counts[s] > 0 else 0


@njit(cache=True)
def _commit_warmup(counters, shadow, ints, n, max_bar):
    for s in range(n):
        count = ints[n + s]
        if count == 0:
            continue
        slot = ints[s]
        bar = counters[slot, BAR_INDEX] + count
        counters[slot, BAR_INDEX] = bar
        counters[slot, LAST_TIME] = ints[2 * n + s]
        shadow[slot, 0] = bar
        shadow[slot, 1] = ints[2 * n + s]
        if bar > max_bar:
            max_bar = bar
    return max_bar


_cpu_growth_factor = cpu.growth_factor


@njit
def _fill_growth_table(param_lengths, param_values, table):
    """``table[row, k] = cpu.growth_factor(lam_row, cutout_row + k, cutout_row)``.

    The same compiled function as the CPU step (glibc ``exp``). The loop is a ``while``
    with an exit on a NaN so that LLVM cannot vectorise it (a vectorised ``exp``, e.g.
    numba's SVML path, need not round like glibc's scalar one).
    """
    for row in range(table.shape[0]):
        cutout = param_lengths[row, CUTOUT_COLUMN]
        lam = param_values[row, PV_LAM]
        k = 0
        while k < table.shape[1]:
            g = _cpu_growth_factor(lam, cutout + k, cutout)
            table[row, k] = g
            if g != g:
                break
            k += 1


def growth_table(param_lengths: np.ndarray, param_values: np.ndarray, length: int) -> np.ndarray:
    """The host growth table for ``length`` bars after cutout (see the module docstring)."""
    table = np.empty((max(param_lengths.shape[0], 1), max(length, 1)), np.float64)
    if param_lengths.shape[0]:
        _fill_growth_table(param_lengths, param_values, table)
    else:
        table[:] = 1.0
    return table


def _empty_fields(n: int, groups, bar_index: np.ndarray) -> dict:
    """Typed fields of ``groups`` for ``n`` rows none of which holds a result."""
    return schema.kernel_fields(np.full((n, N_OUT), np.nan), groups) | {"bar_index": bar_index}


# -- device memory -------------------------------------------------------------------------


def _import_cupy():
    if cuda_simulated():
        return None
    try:
        import cupy
    except Exception:  # not installed, or no usable CUDA runtime for it
        return None
    return cupy


def _launch_shape(count: int, threads: int = THREADS_PER_BLOCK) -> tuple[int, int]:
    if cuda_simulated():  # one Python thread per CUDA thread: do not start idle ones
        threads = max(1, min(threads, count))
    return (count + threads - 1) // threads, threads


class CudaBackend:
    """Runs the CUDA kernels on device-resident state; same interface as ``CpuBackend``.

    ``step``/``preview``/``warmup`` take and return host arrays, exactly like the CPU
    backend (float64 only). ``pull_state``/``push_state`` move the whole state between
    the device and the store's host arrays; ``close`` frees the device memory.

    Code that writes the store's host arrays directly (a restore) must call
    ``push_state`` afterwards; slot (re)initialisation and store growth are detected.
    """

    name = "cuda"
    #: streams per warmup launch: enough threads to fill a large GPU (DESIGN.md, warmup)
    warmup_chunk = 131_072
    #: device bytes one warmup launch may use for histories and outputs (chunked to fit)
    warmup_memory_budget = 2 << 30

    def __init__(
        self,
        store: StateStore,
        *,
        warmup_state: str = "global",
        threads_per_block: int = THREADS_PER_BLOCK,
        precompile: bool = True,
        cuda_graph: bool = False,
    ) -> None:
        if warmup_state not in ("local", "global"):
            raise ValueError(f"warmup_state must be 'local' or 'global', got {warmup_state!r}")
        if not (isinstance(threads_per_block, int) and 32 <= threads_per_block <= 1024) or (
            threads_per_block % 32
        ):
            raise ValueError(
                "threads_per_block must be a multiple of 32 in [32, 1024], "
                f"got {threads_per_block!r}"
            )
        self.store = store
        #: threads per block of every launch: a tuning parameter (benchmarks/bench_cuda.py)
        self.threads_per_block = threads_per_block
        #: "global": warmup updates the F-order state in place; "local": in per-thread
        #: local arrays (``local_warmup_kernel``; see there why it is not the default)
        self.warmup_state = warmup_state
        self._cupy = _import_cupy()
        self.stream = cuda.stream()
        #: the CUDA graph of the steady step (``cuda_graph=True``; None: off or unavailable)
        self.graphs: StepGraphs | None = self._make_graphs() if cuda_graph else None
        self._ints = self._staging(np.int64)
        self._floats = self._staging(np.float64)
        self._warm_out = self._staging(np.float64)  # warmup output rows
        self._plan = self._staging(np.int64)  # step plan: slots, then host positions
        self._preview_plan = self._staging(np.int64)
        self._history = self._staging(np.float64)  # warmup closes before the transpose
        # step/preview inputs and outputs: two sets, used alternately (cuda_io.py)
        self._io = [IoSet(i, self._device_empty, self._buffers_moved) for i in (0, 1)]
        self._next_io = 0
        #: the slots of the last fully accepted one-round step, whose plan is on the device
        self._plan_slots: np.ndarray | None = None
        self._where = np.zeros(0, np.int64)
        self._rows = self._staging(np.float64)  # packed rows of host-initialised slots
        self._row_counters = self._staging(np.int64)
        self._dev: types.SimpleNamespace | None = None
        self._mirror: types.SimpleNamespace | None = None
        self._shadow = np.zeros((0, len(_SHADOW_COLUMNS)), np.int64)
        self._changed = np.zeros(0, np.int64)
        self._generation = -1
        self._max_bar = 0
        self._table_rows = -1
        self._table_length = 0
        self._growth_table = None
        self._scratch: types.SimpleNamespace | None = None
        self._local_failed: set[int] = set()
        #: with ``time_kernels``, each step/preview/warmup stores the device time of its
        #: kernels (CUDA events on the backend's stream) in ``last_kernel_seconds``
        self.time_kernels = False
        self.last_kernel_seconds: float | None = None
        # requested outputs (``step_outputs``): packed floats and event bytes
        self._packed_groups: tuple[str, ...] | None = None
        self._packed_columns = None  # device: ``pack_layout`` spec of those groups
        self._packed_k = 0
        self._packed_fields: list[tuple[str, int, int]] = []
        if precompile:
            self.precompile()

    def precompile(self) -> None:
        """Compile every kernel specialisation a step, preview or warmup launches, now.

        So that no compile happens inside a live step (the launch types are fixed:
        F-order state with at least two rows, C-order host-order inputs and outputs),
        and so that the FMA guard (``check_no_fma``) has read every kernel's PTX before
        the first result. The local-state warmup kernel (one per ring width, not the
        default) is compiled and checked at its first launch. Nothing to do under the
        simulator.
        """
        if cuda_simulated():
            return
        for name, (kernel, argtypes) in kernel_signatures(local_ring_columns=None).items():
            with no_fma():
                kernel.compile(argtypes)
            check_no_fma(kernel, name)

    # -- device arrays ---------------------------------------------------------------------

    def _staging(self, dtype) -> Staging:
        return Staging(self._device_empty, dtype, self._buffers_moved)

    def _buffers_moved(self) -> None:
        """A device buffer was (re)allocated: CUDA graphs that captured it are stale."""
        if self.graphs is not None:
            self.graphs.invalidate()

    def _make_graphs(self) -> StepGraphs | None:
        """CUDA graphs need CuPy's stream capture on a real device; else one warning."""
        if cuda_simulated() or self._cupy is None:
            why = "the CUDA simulator" if cuda_simulated() else "CuPy is not installed"
            log.warning(
                "cuda_graph=True: CUDA graphs need CuPy on a real device (%s here); "
                "using ordinary launches",
                why,
            )
            return None
        try:
            cupy_stream = self._cupy.cuda.Stream(non_blocking=True)
            self.stream = cuda.external_stream(cupy_stream.ptr)
        except Exception as exc:  # an old CuPy, a driver without capture
            log.warning("cuda_graph=True: no capturable stream (%s); using ordinary launches", exc)
            return None
        return StepGraphs(cupy_stream)

    def _take_io(self) -> IoSet:
        """The next buffer set; the step that last used it is waited for first."""
        io = self._io[self._next_io]
        self._next_io ^= 1
        if io.pending is not None:
            io.pending.wait()
        return io

    def _drain(self) -> None:
        """Wait for every submitted step (their outputs are copied out)."""
        for io in self._io:
            if io.pending is not None:
                io.pending.wait()

    def _device_empty(self, shape, dtype, order: str = "C"):
        if self._cupy is not None:
            # CuPy's pool allocates; a numba view keeps one code path for copies/launches
            return cuda.as_cuda_array(self._cupy.empty(shape, dtype, order=order))
        return cuda.device_array(shape, dtype, order=order)

    def _launch(self, kernel, count: int, *args) -> None:
        if count <= 0:
            return
        blocks, threads = _launch_shape(count, self.threads_per_block)
        with no_fma():
            kernel[blocks, threads, self.stream](*args)
        check_no_fma(kernel)  # a specialisation compiled by this launch is read once

    def _timer_start(self):
        if not self.time_kernels:
            return None
        start = cuda.event()
        start.record(self.stream)
        return start

    def _timer_stop(self, start):
        if start is None:
            return None
        end = cuda.event()
        end.record(self.stream)
        return start, end

    def _timer_read(self, events) -> None:
        """After the stream synchronised: the kernels' device time in seconds."""
        if events is not None:
            self.last_kernel_seconds = events[0].elapsed_time(events[1]) / 1e3

    def _params(self):
        d = self._dev
        return d.ring, d.values, d.counters, d.param_lengths, d.param_values, self._growth_table

    def close(self) -> None:
        """Free the device state (the host arrays keep whatever was last pulled)."""
        self._drain()
        self._buffers_moved()
        self._dev = None
        self._mirror = None
        self._scratch = None
        self._growth_table = None
        self._table_rows = -1
        self._generation = -1

    # -- host <-> device -----------------------------------------------------------------

    def push_state(self) -> None:
        """Upload the store's host arrays (the whole state and the parameter table)."""
        s = self.store
        self._drain()
        self._buffers_moved()  # new parameter tables (and maybe state arrays) on the device
        # at least two rows: a one-row F-order array is also C-contiguous, which numba
        # types as layout "C", i.e. a second specialisation of every kernel
        rows = max(s.capacity, 2)
        shapes = (rows, s.ring.shape[1], s.values.shape[1])
        if self._mirror is None or self._mirror.shapes != shapes:
            self._mirror = types.SimpleNamespace(
                shapes=shapes,
                ring=cuda.pinned_array((rows, s.ring.shape[1]), np.float64, order="F"),
                values=cuda.pinned_array((rows, s.values.shape[1]), np.float64, order="F"),
                counters=cuda.pinned_array((rows, s.counters.shape[1]), np.int64, order="F"),
            )
            self._mirror.counters[:] = 0
            self._dev = types.SimpleNamespace(
                ring=self._device_empty((rows, s.ring.shape[1]), np.float64, "F"),
                values=self._device_empty((rows, s.values.shape[1]), np.float64, "F"),
                counters=self._device_empty((rows, s.counters.shape[1]), np.int64, "F"),
            )
        m, d = self._mirror, self._dev
        self.stream.synchronize()  # the mirrors may still be in use by a pending copy
        for name in ("ring", "values", "counters"):
            np.copyto(getattr(m, name)[: s.capacity], getattr(s, name))
            getattr(d, name).copy_to_device(getattr(m, name), stream=self.stream)
        lengths = s.params.lengths if len(s.params) else np.zeros((1, L.N_LENGTH_COLUMNS), np.int64)
        values = s.params.values if len(s.params) else np.zeros((1, L.N_PARAM_VALUES))
        d.param_lengths = cuda.to_device(np.ascontiguousarray(lengths), stream=self.stream)
        d.param_values = cuda.to_device(np.ascontiguousarray(values), stream=self.stream)
        self._shadow = np.ascontiguousarray(s.counters[:, _SHADOW_COLUMNS])
        self._changed = np.zeros(s.capacity, np.int64)
        self._where = np.full(s.capacity, -1, np.int64)
        self._max_bar = int(s.counters[:, L.BAR_INDEX].max(initial=0))
        self._generation = s.generation
        self.stream.synchronize()

    def pull_state(self) -> None:
        """Copy the device state into the store's host arrays (the host mirror)."""
        if self._dev is None:
            return  # nothing on the device yet: the host arrays are the state
        self._drain()
        self._sync(None)
        m, d = self._mirror, self._dev
        for name in ("ring", "values", "counters"):
            getattr(d, name).copy_to_host(getattr(m, name), stream=self.stream)
        self.stream.synchronize()
        capacity = self.store.capacity
        for name in ("ring", "values", "counters"):
            np.copyto(getattr(self.store, name), getattr(m, name)[:capacity])

    def _download_old(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        m, d = self._mirror, self._dev
        for name in ("ring", "values", "counters"):
            getattr(d, name).copy_to_host(getattr(m, name), stream=self.stream)
        self.stream.synchronize()
        rows = self._shadow.shape[0]  # the capacity the device state was laid out for
        return np.array(m.ring[:rows]), np.array(m.values[:rows]), np.array(m.counters[:rows])

    def _relayout(self) -> None:
        """The store was rebuilt (new capacity, ring width or parameter set): merge, push.

        The store copied its *host* rows, stale for every stream the device advanced.
        Rows whose counters still match what the device was given are replaced by the
        device's state, re-laid out for a new ring width by the store's own
        ``_grow_ring``; rows (re)initialised on the host since then are kept.
        """
        s = self.store
        ring, values, counters = self._download_old()
        old_capacity = values.shape[0]
        old_ring_capacity = ring.shape[1] // 2
        if old_ring_capacity != s.ring_capacity:
            relaid = StateStore(old_capacity)
            relaid.ring, relaid.counters = ring, counters
            relaid.ring_capacity = old_ring_capacity
            relaid._grow_ring(s.ring_capacity)
            ring, counters = relaid.ring, relaid.counters
        rows = min(old_capacity, s.capacity)
        same = (s.counters[:rows, _SHADOW_COLUMNS] == self._shadow[:rows]).all(axis=1)
        keep = np.flatnonzero(same)
        s.ring[keep] = ring[keep]
        s.values[keep] = values[keep]
        s.counters[keep] = counters[keep]
        self.push_state()

    def _sync(self, slots: np.ndarray | None, count: int | None = None) -> None:
        """Bring the device up to date with host-side changes before a launch or pull.

        ``slots[:count]``: the slots about to be used (None: all).
        """
        s = self.store
        if self._dev is None:
            self.push_state()
            return
        if s.generation != self._generation:
            self._relayout()
            return
        if slots is None:
            slots = np.arange(s.capacity, dtype=np.int64)
        if count is None:
            count = slots.shape[0]
        n = _find_changed(s.counters, self._shadow, slots, count, self._changed)
        if n == 0:
            return
        changed = self._changed[:n].copy()
        self._max_bar = max(self._max_bar, int(s.counters[changed, L.BAR_INDEX].max()))
        self._upload_rows(changed)

    def _upload_rows(self, changed: np.ndarray) -> None:
        s, d = self.store, self._dev
        n = changed.shape[0]
        ring_cols, value_cols = s.ring.shape[1], s.values.shape[1]
        floats_per_row = ring_cols + value_cols
        self.stream.synchronize()  # nothing pending may still read the staging buffers
        self._rows.reserve(n * floats_per_row)
        self._row_counters.reserve(n * (N_COUNTER_FIELDS + 1))
        host_rows = self._rows.host[: n * floats_per_row]
        host_rows[: n * ring_cols] = s.ring[changed].ravel()
        host_rows[n * ring_cols :] = s.values[changed].ravel()
        host_ints = self._row_counters.host[: n * (N_COUNTER_FIELDS + 1)]
        host_ints[:n] = changed
        host_ints[n:] = s.counters[changed].ravel()
        self._rows.upload(n * floats_per_row, self.stream)
        self._row_counters.upload(n * (N_COUNTER_FIELDS + 1), self.stream)
        dev_rows, dev_ints = self._rows.device, self._row_counters.device
        dev_slots = dev_ints[:n]
        self._launch(
            scatter_rows_kernel,
            n,
            d.ring,
            dev_slots,
            dev_rows[: n * ring_cols].reshape(n, ring_cols),
        )
        self._launch(
            scatter_rows_kernel, n, d.values, dev_slots,
            dev_rows[n * ring_cols : n * floats_per_row].reshape(n, value_cols),
        )  # fmt: skip
        self._launch(
            scatter_rows_kernel, n, d.counters, dev_slots,
            dev_ints[n : n * (N_COUNTER_FIELDS + 1)].reshape(n, N_COUNTER_FIELDS),
        )  # fmt: skip

    def _ensure_growth(self, bars_ahead: int) -> None:
        """Make the growth table cover every bar index up to ``max bar_index + bars_ahead``."""
        s = self.store
        needed = self._max_bar + bars_ahead + 1
        rows = len(s.params)
        if rows == self._table_rows and needed <= self._table_length:
            return
        length = self._table_length
        if needed > length:
            length = max(needed, 2 * length, GROWTH_TABLE_MIN)
        table = growth_table(s.params.lengths, s.params.values, length)
        self.stream.synchronize()  # a submitted step may still read the old table
        self._growth_table = cuda.to_device(table, stream=self.stream)
        self._buffers_moved()
        self._table_rows, self._table_length = rows, length

    # -- the backend interface -------------------------------------------------------------

    def step(self, slots, times, closes, order, round_starts) -> np.ndarray:
        """Apply planned rounds (``batch.plan_rounds``); row ``u`` of the result is update u.

        Every output column comes back (rows ``[u, OUT_*]``, rejected rows NaN);
        ``step_outputs`` copies back only requested ones.
        """
        n, m = slots.shape[0], order.shape[0]
        if m == 0:
            return np.full((n, N_OUT), np.nan)
        bar_index = np.empty(n, np.int64)
        return self._submit_step(slots, times, closes, order, round_starts, None, bar_index).wait()

    def step_outputs(self, slots, times, closes, order, round_starts, groups) -> dict:
        """``step`` returning only the typed fields of output ``groups``
        (``schema.kernel_fields``); only those are copied back from the device.
        Fields of rejected rows are unspecified (the engine drops those rows)."""
        return self.step_outputs_async(slots, times, closes, order, round_starts, groups).wait()

    def step_outputs_async(
        self, slots, times, closes, order, round_starts, groups
    ) -> PendingOutputs:
        """``step_outputs`` without waiting: the state and host counters advance now, the
        outputs are ``.wait()``-ed for. Two steps may be in flight (``cuda_io.py``)."""
        n, m = slots.shape[0], order.shape[0]
        bar_index = np.full(n, -1, np.int64)
        if m == 0:
            return PendingOutputs.ready(_empty_fields(n, groups, bar_index))
        return self._submit_step(slots, times, closes, order, round_starts, groups, bar_index)

    def _submit_step(
        self, slots, times, closes, order, round_starts, groups, bar_index
    ) -> PendingOutputs:
        """Plan, stage, enqueue the copies and kernels (or launch the step's CUDA graph),
        commit the counters on the host; the outputs (all rows for ``groups`` None) are
        read when the returned step is waited for.

        Host work: the plan (slots sorted within each round, built in compiled code, and
        kept on the device while the batch's slots repeat with every update accepted in
        one round: the steady one-bar-per-stream case), two memcpys of the inputs into
        the pinned buffers of one of two sets, the counter bookkeeping, and at the wait
        one copy per requested field (the kernels write host order: no gather, scatter
        or transpose).
        """
        n, m = slots.shape[0], order.shape[0]
        n_rounds = round_starts.shape[0] - 1
        io = self._take_io()
        plan, reused = self._step_plan(slots, order, round_starts)
        self._sync(self._plan.host, m)
        self._ensure_growth(n_rounds)
        k = self._prepare_packing(groups)
        layout = self._packed_fields
        io.reserve(n, N_OUT, k)
        io.stage(times, closes)

        def enqueue() -> None:
            io.times.upload(n, self.stream)
            io.closes.upload(n, self.stream)
            out = io.out.device[: n * N_OUT].reshape((n, N_OUT))
            for r in range(n_rounds):
                start, stop = int(round_starts[r]), int(round_starts[r + 1])
                self._launch(
                    step_kernel, stop - start, *self._params(), plan, m, start, stop,
                    io.times.device, io.closes.device, out,
                )  # fmt: skip
            self._enqueue_outputs(io, n, out, groups, k)

        timer = self._timer_start()
        graphs = self.graphs
        steady = graphs is not None and reused and groups is not None and timer is None
        if not (steady and graphs.run((io.index, n, groups, self.threads_per_block), enqueue)):
            enqueue()
        timer = self._timer_stop(timer)
        # while the device works: the same counter changes on the host
        self._max_bar = _commit_step(
            self.store.counters, self._shadow, self._plan.host, m, times, self._max_bar,
            bar_index,
        )  # fmt: skip
        done = cuda.event() if cuda_simulated() else cuda.event(timing=False)
        done.record(self.stream)

        def read():
            self._timer_read(timer)
            if groups is None:
                return self._host_rows(io, n, order)
            return self._host_fields(io, n, groups, layout, bar_index)

        pending = PendingOutputs(read, done, io)
        io.pending = pending
        return pending

    def _step_plan(self, slots, order, round_starts):
        """The step's device plan (``_build_plan``), reused while the slots repeat;
        returns ``(plan, reused)``."""
        n, m = slots.shape[0], order.shape[0]
        steady = m == n and round_starts.shape[0] == 2
        cached = self._plan_slots
        if steady and cached is not None and np.array_equal(cached, slots):
            return self._plan.device, True
        self._plan_slots = None
        if self._where.shape[0] < self.store.capacity:
            self._where = np.full(self.store.capacity, -1, np.int64)
        self.stream.synchronize()  # a submitted step may still read the plan (pinned/device)
        self._plan.reserve(2 * m)
        _build_plan(slots, order, round_starts, self._plan.host, self._where)
        self._plan.upload(2 * m, self.stream)
        if steady:
            self._plan_slots = slots.copy()
        return self._plan.device, False

    def _prepare_packing(self, groups) -> int:
        """The device list of the float columns of ``groups``; returns how many."""
        if groups is None:
            return 0
        if groups != self._packed_groups:
            spec, self._packed_fields = pack_layout(groups)
            padded = np.zeros(max(spec.shape[0], 1), np.int64)  # no zero-size arrays
            padded[: spec.shape[0]] = spec
            self.stream.synchronize()  # a submitted step may still read the old spec
            self._packed_columns = cuda.to_device(padded, stream=self.stream)
            self._packed_k = spec.shape[0] // 4
            self._packed_groups = groups
            self._buffers_moved()
        return self._packed_k

    def _enqueue_outputs(self, io: IoSet, n: int, out, groups, k: int) -> None:
        """Enqueue the copy back: every column (``groups`` None), or the ``k`` float
        columns and the event bytes of ``groups``, packed on the device first."""
        if groups is None:
            io.out.download(n * N_OUT, self.stream)
            return
        events = "events" in groups
        floats = io.packed.device[: n * max(k, 1)]
        flags = io.flags.device[: 2 * n]
        self._launch(pack_outputs_kernel, n, out, n, self._packed_columns, k, floats, flags, events)
        io.packed.download(n * k, self.stream)
        if events:
            io.flags.download(2 * n, self.stream)

    def _host_rows(self, io: IoSet, n: int, order: np.ndarray) -> np.ndarray:
        """A copy of the pinned output rows (the buffer is reused); rejected rows NaN."""
        result = io.out.host[: n * N_OUT].reshape((n, N_OUT)).copy()
        if order.shape[0] != n:
            rejected = np.ones(n, np.bool_)
            rejected[order] = False
            result[rejected] = np.nan
        return result

    @staticmethod
    def _host_fields(io: IoSet, n: int, groups, layout, bar_index: np.ndarray) -> dict:
        """The typed fields of ``groups``, copied out of the pinned buffers (reused):
        one contiguous block per float field (``layout``: ``pack_layout(groups)[1]``)."""
        fields = {"bar_index": bar_index}
        packed = io.packed.host
        for name, c0, width in layout:
            block = packed[n * c0 : n * (c0 + width)]
            fields[name] = block.copy() if width == 1 else block.reshape(n, width).copy()
        if "events" in groups:
            flags = io.flags.host[: 2 * n].view(np.bool_)
            fields["long"] = flags[:n].copy()
            fields["short"] = flags[n:].copy()
        return fields

    def preview(self, slots, times, closes, accepted) -> np.ndarray:
        """Outputs for in-progress bars on scratch copies of the slots; state is untouched."""
        n = slots.shape[0]
        order = np.flatnonzero(accepted)
        if order.shape[0] == 0:
            return np.full((n, N_OUT), np.nan)
        io, _ = self._run_preview(slots, times, closes, order, None)
        return self._host_rows(io, n, order)

    def preview_outputs(self, slots, times, closes, accepted, groups) -> dict:
        """``preview`` returning only the typed fields of output ``groups``."""
        n = slots.shape[0]
        order = np.flatnonzero(accepted)
        bar_index = np.full(n, -1, np.int64)
        bar_index[order] = self.store.counters[slots[order], BAR_INDEX]
        if order.shape[0] == 0:
            return _empty_fields(n, groups, bar_index)
        io, _ = self._run_preview(slots, times, closes, order, groups)
        return self._host_fields(io, n, groups, self._packed_fields, bar_index)

    def _run_preview(self, slots, times, closes, order, groups):
        n, m = slots.shape[0], order.shape[0]
        self._drain()
        io = self._take_io()
        pp = self._preview_plan
        self.stream.synchronize()  # a pending upload may still read the pinned plan
        pp.reserve(2 * m)
        _plan_in_order(slots, order, pp.host)
        self._sync(pp.host, m)
        self._ensure_growth(1)
        pp.upload(2 * m, self.stream)
        k = self._prepare_packing(groups)
        io.reserve(n, N_OUT, k)
        io.stage(times, closes)
        io.times.upload(n, self.stream)
        io.closes.upload(n, self.stream)
        scratch = self._scratch_rows(m)
        out = io.out.device[: n * N_OUT].reshape((n, N_OUT))
        timer = self._timer_start()
        self._launch(
            preview_kernel, m, *self._params(), pp.device, m, io.times.device,
            io.closes.device, scratch.ring, scratch.values, scratch.counters, out,
        )  # fmt: skip
        timer = self._timer_stop(timer)
        self._enqueue_outputs(io, n, out, groups, k)
        self.stream.synchronize()
        self._timer_read(timer)
        return io, k

    def _scratch_rows(self, m: int):
        ring_cols = self.store.ring.shape[1]
        sc = self._scratch
        if sc is None or sc.rows < m or sc.ring_cols != ring_cols:
            rows = max(m, 2 * sc.rows if sc is not None else 0, 64)
            sc = self._scratch = types.SimpleNamespace(
                rows=rows,
                ring_cols=ring_cols,
                ring=self._device_empty((rows, ring_cols), np.float64, "F"),
                values=self._device_empty((rows, N_VALUE_FIELDS), np.float64, "F"),
                counters=self._device_empty((rows, N_COUNTER_FIELDS), np.int64, "F"),
            )
        return sc

    def warmup(self, slots, times, closes, counts, record_all: bool) -> np.ndarray:
        """Apply ``counts[s]`` bars of ``closes[s]`` to stream ``slots[s]`` (see ``cpu.warmup``).

        Streams are taken in chunks whose device buffers (histories twice: as uploaded
        and transposed, plus outputs) fit ``warmup_memory_budget`` bytes.
        """
        self._drain()
        n = slots.shape[0]
        width = times.shape[1] if record_all else 1
        result = np.full((n, max(width, 1), N_OUT), np.nan)
        longest = int(counts.max(initial=0))
        if n == 0 or longest == 0:
            return result
        rows = longest if record_all else 1
        per_stream = 8 * (2 * longest + rows * N_OUT + 3)
        chunk = max(1, min(n, self.warmup_memory_budget // per_stream))
        for a in range(0, n, chunk):
            b = min(n, a + chunk)
            self._warmup_chunk(
                slots[a:b], times[a:b], closes[a:b], counts[a:b], record_all, result[a:b]
            )
        if record_all:
            result[np.arange(result.shape[1])[None, :] >= counts[:, None]] = np.nan
        else:
            result[counts == 0] = np.nan
        return result

    def _warmup_chunk(self, slots, times, closes, counts, record_all, result) -> None:
        n = slots.shape[0]
        longest = int(counts.max(initial=0))
        if longest == 0:
            return
        self._sync(np.ascontiguousarray(slots, dtype=np.int64))
        self._ensure_growth(longest)
        rows = longest if record_all else 1
        self._ints.reserve(3 * n)
        self._floats.reserve(longest * n)
        self._history.reserve(longest * n)
        self._warm_out.reserve(n * rows * N_OUT)
        _pack_warmup(slots, times, counts, self._ints.host)
        # the histories as they are (one stream per row: a memcpy); the device transposes
        host_history = self._history.host[: n * longest].reshape(n, longest)
        np.copyto(host_history, closes[:, :longest])
        self._ints.upload(3 * n, self.stream)
        self._history.upload(n * longest, self.stream)
        history = self._history.device[: n * longest].reshape(n, longest)
        closes_tn = self._floats.device[: longest * n].reshape(longest, n)
        out = self._warm_out.device[: n * rows * N_OUT].reshape((n * rows, N_OUT))
        args = (*self._params(), self._ints.device, n, closes_tn, out, bool(record_all))
        timer = self._timer_start()
        self._launch(transpose_kernel, n, history, n, longest, closes_tn)
        self._launch_warmup(n, args)
        timer = self._timer_stop(timer)
        self._warm_out.download(n * rows * N_OUT, self.stream)
        self._max_bar = _commit_warmup(
            self.store.counters, self._shadow, self._ints.host, n, self._max_bar
        )
        self.stream.synchronize()
        self._timer_read(timer)
        result[:, :rows] = self._warm_out.host[: n * rows * N_OUT].reshape((n, rows, N_OUT))

    def _launch_warmup(self, n: int, args) -> None:
        ring_cols = self.store.ring.shape[1]
        use_local = (
            self.warmup_state == "local"
            and ring_cols <= LOCAL_RING_MAX_COLUMNS
            and ring_cols not in self._local_failed
        )
        if use_local:
            kernel = local_warmup_kernel(ring_cols)
            try:
                if not cuda_simulated():  # compile and read the PTX before the first launch
                    name = f"local_warmup_kernel({ring_cols})"
                    with no_fma():
                        kernel.compile(kernel_signatures(ring_cols)[name][1])
                    check_no_fma(kernel, name)
                self._launch(kernel, n, *args)
                return
            except FmaContractionError:
                raise
            except Exception as exc:  # a compile error: never expected, but never fatal
                if cuda_simulated():
                    raise
                self._local_failed.add(ring_cols)
                log.warning("local-state warmup kernel failed (%s); using global state", exc)
        self._launch(warmup_kernel, n, *args)


# -- PTX (needs libNVVM, not a GPU) ------------------------------------------------------


def kernel_signatures(local_ring_columns: int | None = 70) -> dict[str, tuple[object, tuple]]:
    """Every kernel the backend launches, with the argument types it launches it with.

    These are the specialisations ``CudaBackend.precompile`` compiles and ``kernel_ptx``
    reads. ``local_ring_columns``: also the local-state warmup kernel for that ring width
    (None: leave it out).
    """
    from numba import types as nt

    f2f = nt.Array(nt.float64, 2, "F")
    i2f = nt.Array(nt.int64, 2, "F")
    f2c = nt.Array(nt.float64, 2, "C")
    i2c = nt.Array(nt.int64, 2, "C")
    i1 = nt.Array(nt.int64, 1, "C")
    f1 = nt.Array(nt.float64, 1, "C")
    u1 = nt.Array(nt.uint8, 1, "C")
    i64 = nt.int64
    state = (f2f, f2f, i2f, i2c, f2c, f2c)
    warmup = (*state, i1, i64, f2c, f2c, nt.boolean)
    signatures = {
        "step_kernel": (step_kernel, (*state, i1, i64, i64, i64, i1, f1, f2c)),
        "preview_kernel": (preview_kernel, (*state, i1, i64, i1, f1, f2f, f2f, i2f, f2c)),
        "warmup_kernel": (warmup_kernel, warmup),
        "transpose_kernel": (transpose_kernel, (f2c, i64, i64, f2c)),
        "pack_outputs_kernel": (pack_outputs_kernel, (f2c, i64, i1, i64, f1, u1, nt.boolean)),
        "scatter_rows_kernel": (scatter_rows_kernel, (f2f, i1, f2c)),
        "scatter_rows_kernel(int64)": (scatter_rows_kernel, (i2f, i1, i2c)),
    }
    if local_ring_columns is not None:
        name = f"local_warmup_kernel({local_ring_columns})"
        signatures[name] = (local_warmup_kernel(local_ring_columns), warmup)
    return signatures


@contextlib.contextmanager
def _compute_capability_stand_in(cc: tuple[int, int]):
    """Let numba compile device functions for ``cc`` where no device can be asked.

    numba-cuda 0.30 types a kernel's device functions for the *current device's*
    compute capability (``dispatcher.get_current_device()``), even inside
    ``compile_ptx(cc=...)``. Without a GPU that call fails; PTX needs only libNVVM, so
    for the duration of a PTX compile the question is answered with ``cc``.
    """
    from numba.cuda import dispatcher

    try:
        dispatcher.get_current_device().compute_capability  # noqa: B018 - a probe
        yield
        return
    except Exception:  # no driver or no device: stand one in
        pass
    original = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=cc)
    try:
        yield
    finally:
        dispatcher.get_current_device = original


def kernel_ptx(cc: tuple[int, int] = (9, 0), names=None) -> dict[str, str]:
    """PTX of the backend's kernels, compiled as the backend compiles them (``-fma=0``).

    Needs libNVVM and NVRTC (the ``nvidia-nvvm``/``nvidia-cuda-nvrtc`` wheels or a CUDA
    toolkit), not a GPU. ``names``: only these keys of ``kernel_signatures()``.
    """
    out = {}
    with _compute_capability_stand_in(cc):
        for name, (kernel, argtypes) in kernel_signatures().items():
            if names is not None and name not in names:
                continue
            with no_fma():
                ptx, _ = cuda.compile_ptx(kernel.py_func, argtypes, cc=cc, lineinfo=False)
            out[name] = ptx
    return out
