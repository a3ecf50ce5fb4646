"""The CUDA backend on a real GPU: exact parity with the CPU at scale, and the compiler.

Every test here is marked ``gpu`` and skipped unless ``cuda_available()`` is true (a
real device whose probe kernel compiled and ran; not the simulator). The PTX checks
that need no device (every kernel, sm_80 and sm_90) run in CI: ``test_cuda_ptx.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from atc_stream.core.params import ATCParams
from atc_stream.engine.engine import Engine
from atc_stream.kernels import cpu, cuda_available, cuda_simulated

HAVE_GPU, WHY_NOT = cuda_available()
pytestmark = pytest.mark.gpu
needs_device = pytest.mark.skipif(not HAVE_GPU, reason=f"no CUDA device: {WHY_NOT}")

BASE_TIME = 1_700_000_000_000
BAR_MS = 60_000
N_SYMBOLS = 10_000
#: symbols of the parity-at-scale test: x 2 parameter sets = 100,000 streams
N_SYMBOLS_AT_SCALE = 50_000
NARROW = ATCParams(
    ema_len=10, hma_len=12, wma_len=14, dema_len=9, lsma_len=20, kama_len=8,
    robustness="Narrow", La=0.05, De=0.1, cutout=40,
)  # fmt: skip
PARAMS = [ATCParams(), NARROW]


def walks(n, t, seed):
    rng = np.random.default_rng(seed)
    prices = rng.uniform(20, 200, n)[:, None] * np.exp(np.cumsum(rng.normal(0, 0.003, (n, t)), 1))
    return np.maximum(np.round(prices, 2), 0.01)  # a 0.01 grid: exact ties happen


def times_of(t):
    return BASE_TIME + BAR_MS * np.arange(t, dtype=np.int64)


def assert_same(got, expected, what=""):
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    differ = ~((got == expected) | (np.isnan(got) & np.isnan(expected)))
    assert not differ.any(), (
        f"{what}: {int(differ.sum())} entries differ, first {np.argwhere(differ)[:5]}"
    )


def assert_same_state(a, b):
    a.backend.pull_state()
    b.backend.pull_state()
    for name in ("ring", "values", "counters"):
        assert_same(getattr(a.store, name), getattr(b.store, name), name)


def names(n):
    return [f"S{i:05d}" for i in range(n)]


def warmed(backend, closes, bars, **kwargs):
    eng = Engine(PARAMS, backend=backend, capacity=2 * closes.shape[0], **kwargs, outputs="all")
    t = times_of(closes.shape[1])
    eng.warmup({s: (t[:bars], closes[i, :bars]) for i, s in enumerate(names(closes.shape[0]))})
    return eng


@pytest.fixture(scope="module")
def closes():
    return walks(N_SYMBOLS, 400, seed=7)


@pytest.fixture(scope="module")
def closes_at_scale():
    return walks(N_SYMBOLS_AT_SCALE, 400, seed=7)


@needs_device
def test_auto_picks_cuda_only_for_many_streams():
    from atc_stream.kernels import AUTO_MIN_STREAMS
    from atc_stream.kernels.cuda_backend import CudaBackend

    assert Engine(PARAMS, backend="auto", outputs="all").backend.name == "cpu"
    assert isinstance(
        Engine(PARAMS, backend="auto", capacity=AUTO_MIN_STREAMS, outputs="all").backend,
        CudaBackend,
    )


@needs_device
def test_parity_at_scale(closes_at_scale):
    """100,000 streams (50,000 symbols x 2 parameter sets): warmup, steps, rounds, rejections.

    Every output column is compared exactly (discrete ones must be equal; continuous
    ones are bit-identical by construction, which is stricter than the 1e-9 contract).
    """
    closes = closes_at_scale
    engines = [warmed("cuda", closes, 250), warmed("cpu", closes, 250)]
    t = times_of(closes.shape[1])
    slots = engines[0].store.in_use.nonzero()[0]
    assert_same(slots, engines[1].store.in_use.nonzero()[0])
    symbol_of = np.array([int(engines[0]._keys_by_slot[s].symbol[1:]) for s in slots])
    j = 250
    while j < closes.shape[1]:
        # now and then three bars per stream in one batch (fewer at the end of the data)
        k = min(1 if j % 7 else 3, closes.shape[1] - j)
        batch_slots = np.tile(slots, k)
        batch_times = np.repeat(t[j : j + k], slots.shape[0])
        batch_closes = closes[symbol_of, j : j + k].T.ravel()
        if j % 5 == 0:  # a duplicate and a bad close
            batch_slots = np.append(batch_slots, [slots[0], slots[1]])
            batch_times = np.append(batch_times, [t[j], t[j + k - 1] + 1])
            batch_closes = np.append(batch_closes, [1.0, np.nan])
        outs = [e.step_arrays(batch_slots, batch_times, batch_closes).outputs for e in engines]
        assert_same(outs[0], outs[1], f"bar {j}")
        j += k
    assert_same_state(*engines)


@needs_device
def test_preview_at_scale(closes):
    engines = [warmed("cuda", closes, 300), warmed("cpu", closes, 300)]
    engines[0].backend.pull_state()
    before = [getattr(engines[0].store, n).copy() for n in ("ring", "values", "counters")]
    t = times_of(301)
    bars = [(s, int(t[300]), float(closes[i, 300] * 1.002)) for i, s in enumerate(names(N_SYMBOLS))]
    pv = [e.preview(bars).outputs for e in engines]
    assert_same(pv[0], pv[1], "preview")
    engines[0].backend.pull_state()
    for name, old in zip(("ring", "values", "counters"), before, strict=True):
        assert_same(getattr(engines[0].store, name), old, f"{name} after preview")
    assert_same(pv[0], engines[0].step(bars).outputs, "preview vs step of the same bar")


@needs_device
@pytest.mark.parametrize("warmup_state", ["global", "local"])
def test_warmup_then_step_equals_longer_warmup(closes, warmup_state):
    t = times_of(closes.shape[1])
    a = warmed("cuda", closes, 300)
    b = Engine(PARAMS, backend="cuda", capacity=2 * N_SYMBOLS, outputs="all")
    a.backend.warmup_state = b.backend.warmup_state = warmup_state
    symbols = names(N_SYMBOLS)
    for j in range(300, 400):
        last = a.step([(s, int(t[j]), float(closes[i, j])) for i, s in enumerate(symbols)])
    full = b.warmup({s: (t, closes[i]) for i, s in enumerate(symbols)})
    assert_same(last.outputs, full.outputs, "last bar")
    assert_same_state(a, b)
    c = warmed("cpu", closes, 400)
    assert_same_state(b, c)


@needs_device
def test_move_cpu_gpu_cpu_at_scale(closes):
    t = times_of(closes.shape[1])
    moving, staying = warmed("cpu", closes, 200), warmed("cpu", closes, 200)
    symbols = names(N_SYMBOLS)
    for j in range(200, 260):
        if j == 210:
            moving.move_to("cuda")
            assert moving.backend.name == "cuda"
        if j == 240:
            moving.move_to("cpu")
            assert moving.backend.name == "cpu"
        bars = [(s, int(t[j]), float(closes[i, j])) for i, s in enumerate(symbols)]
        assert_same(moving.step(bars).outputs, staying.step(bars).outputs, f"bar {j}")
    assert_same_state(moving, staying)


# -- the compiler: no FMA contraction, no compile inside a step -----------------------------


def _launched_ptx(kernel) -> list[str]:
    """PTX of every specialisation the kernel was compiled with (what was linked)."""
    from atc_stream.kernels.ptx_guard import _kernel_ptx_strings

    return [ptx for overload in kernel.overloads.values() for ptx in _kernel_ptx_strings(overload)]


@needs_device
def test_step_ptx_has_no_fma():
    """The PTX that was linked for this device: no ``fma.rn.f64``, explicit ``mul.rn.f64``.

    Not the SASS: ``div.rn.f64`` itself expands to DFMA instructions (Newton steps of
    the correctly rounded division), so ``DFMA`` in the machine code is expected. What
    must not happen is NVVM contracting our own ``a*b + c``, visible in the PTX.
    """
    from atc_stream.kernels import cuda_kernels as kc
    from atc_stream.kernels.ptx_guard import check_no_fma, ptx_has_fma

    closes = walks(64, 80, seed=1)
    eng = warmed("cuda", closes, 60)
    t = times_of(80)
    for j in range(60, 62):
        eng.step([(s, int(t[j]), float(closes[i, j])) for i, s in enumerate(names(64))])
    eng.preview([("S00000", int(t[62]), 10.0)])
    for kernel in (kc.step_kernel, kc.preview_kernel, kc.warmup_kernel):
        ptxes = _launched_ptx(kernel)
        assert ptxes, kernel
        for ptx in ptxes:
            assert not ptx_has_fma(ptx), "FMA contraction in the parity path"
            assert "mul.rn.f64" in ptx  # explicit rounding: ptxas may not fuse these either
        check_no_fma(kernel)  # the backend's own guard agrees


@needs_device
def test_no_kernel_compiles_inside_a_step():
    """Every specialisation is compiled when the backend is built: m = 1, one-row stores too."""
    from atc_stream.kernels import cuda_kernels as kc

    kernels = (kc.step_kernel, kc.preview_kernel, kc.warmup_kernel, kc.transpose_kernel,
               kc.scatter_rows_kernel)  # fmt: skip
    for capacity in (1, 64):
        eng = Engine(PARAMS[:1], backend="cuda", capacity=capacity, outputs="all")
        before = [len(k.overloads) for k in kernels]
        closes = walks(1, 30, seed=3)
        t = times_of(31)
        eng.warmup({"S00000": (t[:20], closes[0, :20])})
        for j in range(20, 30):  # one update per step: m = 1
            eng.step([("S00000", int(t[j]), float(closes[0, j]))])
        eng.preview([("S00000", int(t[30]), 10.0)])
        assert [len(k.overloads) for k in kernels] == before, capacity


def test_growth_table_matches_cpu_growth_factor_exactly():
    """Host-only: the table the kernels read is the CPU's glibc exp, entry for entry."""
    if cuda_simulated():
        pytest.skip("covered by test_cuda_sim.py")
    from atc_stream.kernels.cuda_host import growth_table
    from atc_stream.state.arrays import StateStore

    store = StateStore()
    for p in (*PARAMS, ATCParams(La=0.9, cutout=3)):
        store.add_params(p)
    table = growth_table(store.params.lengths, store.params.values, 20_000)
    for row, p in enumerate(store.params.params):
        for k in (0, 1, 2, 4765, 4766, 19_999):
            assert table[row, k] == cpu.growth_factor(p.lam, p.cutout + k, p.cutout)
    assert table.shape == (3, 20_000)


@needs_device
@pytest.mark.parametrize("outputs", [("signal", "events"), "all"])
def test_cuda_graph_and_async_steps_equal_the_plain_path(closes, outputs):
    """The steady step as a CUDA graph (``cuda_graph=True``), submitted two at a time
    (``step_arrays_async``, double-buffered), equals the plain synchronous path bit for
    bit, and the graph was captured (when CuPy is installed) and replayed."""
    plain = warmed("cuda", closes, 300)
    graph = warmed("cuda", closes, 300, cuda_graph=True)
    for eng in (plain, graph):
        eng.outputs = outputs
    t = times_of(closes.shape[1])
    rng = np.random.default_rng(3)
    order = rng.permutation(plain.store.in_use.nonzero()[0])  # arrival order, repeated
    symbol_of = np.array([int(plain._keys_by_slot[s].symbol[1:]) for s in order])
    pending = []
    for j in range(300, 340):
        times, prices = np.full(order.shape[0], t[j]), closes[symbol_of, j]
        want = plain.step_arrays(order, times, prices)
        pending.append((graph.step_arrays_async(order, times, prices), want))
        if len(pending) == 2:
            for p, w in pending:
                assert_same(p.result().outputs, w.outputs, f"bar {j}")
            pending = []
    for p, w in pending:
        assert_same(p.result().outputs, w.outputs, "last bar")
    graphs = graph.backend.graphs
    try:
        import cupy  # noqa: F401
    except ImportError:
        assert graphs is None
    else:
        assert graphs is not None and not graphs.failed, "the capture failed (see the log)"
        assert graphs.captures <= 4 and graphs.launches >= 30
    assert_same_state(plain, graph)


@needs_device
def test_the_parity_gate_passes_on_this_device():
    """The check every process runs before it uses the GPU: CPU bits, outputs and state."""
    from atc_stream.kernels import cuda_parity
    from atc_stream.kernels.cuda_backend import CudaBackend

    assert cuda_parity.compare_backends(CudaBackend) == ""


@needs_device
def test_kernels_run_from_the_checked_ptx_not_from_lto(closes):
    """The machine code comes from the -fma=0 PTX the guard reads: no kernel of the backend
    was linked with LTO (nvJitLink is on this machine, where numba-cuda's default is LTO)."""
    from atc_stream.kernels import cuda_kernels

    warmed("cuda", closes[:64], 100)
    compiled = [
        overload
        for kernel, _ in cuda_kernels.kernel_signatures().values()
        for overload in kernel.overloads.values()
    ]
    assert compiled and not any(o.library._lto for o in compiled)
