"""The CUDA kernels under numba's CUDA simulator: exactly the CPU driver's results.

Run in their own process (the variable must be set before numba is imported)::

    NUMBA_ENABLE_CUDASIM=1 .venv/bin/python -m pytest -q -m cudasim tests/

The simulator runs the kernels' Python source one Python thread per CUDA thread, with
numpy float64 scalars, so it checks the kernels' logic (indexing, the F-order layout,
rounds, scratch rows, the host/device bookkeeping, the growth table), not the GPU
compiler: FMA contraction and the device ``exp`` are covered by ``test_cuda_ptx.py``
(PTX, no GPU needed) and ``test_cuda_gpu.py`` (the PTX linked on a device).
Sizes are tiny (a handful of streams, short lengths) because every simulated thread is
interpreted Python. Outputs and states are compared with ``np.array_equal(...,
equal_nan=True)``: equal values, NaN at the same places.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from cuda_targets import cuda_kernels_run, simulator_only
from golden_data import load_golden_cases
from short_params import SHORT, SHORT_UNCUT

from atc_stream.core import output_row
from atc_stream.core.params import FAMILIES, ATCParams
from atc_stream.engine.engine import Engine
from atc_stream.kernels import batch, cpu
from atc_stream.state import layout as L
from atc_stream.state.arrays import StateStore

pytestmark = [
    pytest.mark.cudasim,
    cuda_kernels_run,
]

BASE_TIME = 1_700_000_000_000
BAR_MS = 60_000

#: ``SHORT_WEIGHTED`` with weights, cut and thresholds off their defaults
SHORT_WEIGHTED = replace(
    SHORT, ema_w=1.5, kama_w=0.5, cut=0.3, long_threshold=0.05, short_threshold=-0.05
)
LONGER = ATCParams(
    ema_len=12, hma_len=12, wma_len=12, dema_len=12, lsma_len=12, kama_len=12,
    robustness="Wide",
)  # fmt: skip


def assert_same(got, expected, what=""):
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    if not np.array_equal(got, expected, equal_nan=True):
        bad = np.argwhere(~((got == expected) | (np.isnan(got) & np.isnan(expected))))
        raise AssertionError(f"{what}: {len(bad)} entries differ, first at {bad[:5].tolist()}")


def walks(n, t, seed, step=0.01):
    rng = np.random.default_rng(seed)
    prices = rng.uniform(50, 150, n)[:, None] * np.exp(np.cumsum(rng.normal(0, step, (n, t)), 1))
    return np.round(prices, 2)  # a price grid makes exact ties (close == MA) happen


def times_of(t):
    return BASE_TIME + BAR_MS * np.arange(t, dtype=np.int64)


def pulled_state(engine):
    engine.backend.pull_state()
    s = engine.store
    return s.ring.copy(), s.values.copy(), s.counters.copy()


def assert_same_state(a, b):
    for name, x, y in zip(
        ("ring", "values", "counters"), pulled_state(a), pulled_state(b), strict=True
    ):
        assert_same(x, y, name)


@pytest.fixture(scope="module")
def cuda_mod():
    from atc_stream.kernels import cuda_backend

    return cuda_backend


# -- backend choice ---------------------------------------------------------------------


@simulator_only
def test_backend_choice_under_the_simulator(cuda_mod):
    assert (
        type(Engine(SHORT_WEIGHTED, backend="cuda", outputs="all").backend) is cuda_mod.CudaBackend
    )
    # auto never picks the simulator, whatever the size
    assert (
        type(Engine(SHORT_WEIGHTED, backend="auto", capacity=10**5, outputs="all").backend)
        is cpu.CpuBackend
    )
    with pytest.raises(ValueError, match="warmup_state"):
        cuda_mod.CudaBackend(StateStore(), warmup_state="registers")


def test_the_parity_check_passes_the_cuda_kernels(cuda_mod):
    """The check that gates the GPU finds the CUDA kernels equal to the CPU's (on a real
    device this runs once a process before the first CUDA backend)."""
    from atc_stream.kernels.cuda_parity import compare_backends

    found = compare_backends(cuda_mod.CudaBackend, streams=1, bars=45, warmup_bars=35)
    assert found == ""


# -- golden vectors -------------------------------------------------------------------------

GOLDEN = load_golden_cases()
COLUMNS = {
    "bar_index": output_row.OUT_BAR_INDEX,
    "Average_Signal": output_row.OUT_SIGNAL,
    "long": output_row.OUT_LONG,
    "short": output_row.OUT_SHORT,
    **{f"{f}_Signal": output_row.OUT_LAYER1 + i for i, f in enumerate(FAMILIES)},
    **{f"{f}_S": output_row.OUT_LAYER2 + i for i, f in enumerate(FAMILIES)},
}


def run_history(backend, params, closes, record_cuts):
    """All bars of one stream: warmup (record_all) / step / warmup in three parts."""
    eng = Engine(params, backend=backend, outputs="all")
    eng.add_symbol("G")
    slot = eng.slots_of("G")
    t = times_of(closes.shape[0])
    a, b = record_cuts
    rows = []
    out = eng.backend.warmup(slot, t[None, :a], closes[None, :a], np.array([a]), True)
    rows.append(out[0])
    for i in range(a, b):
        rows.append(eng.step([("G", int(t[i]), float(closes[i]))]).outputs)
    n = closes.shape[0] - b
    if n:
        out = eng.backend.warmup(slot, t[None, b:], closes[None, b:], np.array([n]), True)
        rows.append(out[0])
    return np.concatenate(rows), eng


@pytest.mark.parametrize("case", GOLDEN, ids=[c[0] for c in GOLDEN])
def test_golden_vectors_cuda_equals_cpu(case):
    name, params, closes, expected = case
    cuts = (closes.shape[0] // 2, min(closes.shape[0] // 2 + 40, closes.shape[0]))
    got, eng_cuda = run_history("cuda", params, closes, cuts)
    ref, eng_cpu = run_history("cpu", params, closes, cuts)
    assert_same(got, ref, f"{name}: cuda vs cpu")
    assert_same_state(eng_cuda, eng_cpu)
    for column, index in COLUMNS.items():
        want = expected[column].astype(np.float64)
        if column in ("bar_index", "long", "short"):
            assert_same(got[:, index], want, f"{name}/{column}")
        else:
            np.testing.assert_allclose(got[:, index], want, rtol=0, atol=1e-9, err_msg=column)


def test_growth_table_is_the_cpu_growth_factor(cuda_mod):
    from atc_stream.kernels.cuda_host import growth_table

    store = StateStore()
    for p in (ATCParams(), SHORT_WEIGHTED, ATCParams(La=0.37, cutout=17)):
        store.add_params(p)
    table = growth_table(store.params.lengths, store.params.values, 3000)
    for row, p in enumerate(store.params.params):
        expected = [cpu.growth_factor(p.lam, p.cutout + k, p.cutout) for k in range(3000)]
        assert table[row].tolist() == expected


# -- many streams, mixed parameter sets --------------------------------------------------------


def drive(backend, closes, params, *, warm=40, extra_ops=True):
    """Warmup, steps (one and several bars per stream), rejections and previews."""
    eng = Engine(params, backend=backend, outputs="all")
    n, t_total = closes.shape
    t = times_of(t_total)
    names = [f"S{i}" for i in range(n)]
    outs = [eng.warmup({s: (t[:warm], closes[i, :warm]) for i, s in enumerate(names)}).outputs]
    i = warm
    while i < t_total:
        k = 1 if i % 3 else 3  # several bars of each stream in one batch: 3 rounds
        bars = [
            (s, int(t[j]), float(closes[m, j]))
            for j in range(i, min(i + k, t_total))
            for m, s in enumerate(names)
        ]
        if extra_ops and i % 5 == 0:
            bars += [("S0", int(t[i - 1]), 100.0), ("nope", int(t[i]), 1.0), ("S1", int(t[i]), -1)]
            bars += [("S2", int(t[i]) + 1, float("nan"))]
        res = eng.step(bars)
        outs.append(res.outputs)
        outs.append(res.slots.astype(np.float64)[:, None])
        if extra_ops and i % 4 == 0 and i + k < t_total:
            moved = [(s, int(t[i + k]), float(closes[m, i] * 1.001)) for m, s in enumerate(names)]
            pv = eng.preview([*moved, ("S0", int(t[i]), 5.0)])  # the last one: a duplicate
            outs.append(pv.outputs)
        i += k
    return outs, eng


def test_random_streams_mixed_params_cuda_equals_cpu():
    closes = walks(4, 100, seed=3)
    params = [ATCParams(), SHORT_WEIGHTED, SHORT_UNCUT]
    got, eng_cuda = drive("cuda", closes, params)
    ref, eng_cpu = drive("cpu", closes, params)
    assert len(got) == len(ref)
    for i, (a, b) in enumerate(zip(got, ref, strict=True)):
        assert_same(a, b, f"output block {i}")
    # the host counters that batch planning reads are current without any pull
    columns = [L.BAR_INDEX, L.LAST_TIME]
    assert_same(eng_cuda.store.counters[:, columns], eng_cpu.store.counters[:, columns], "host")
    assert_same_state(eng_cuda, eng_cpu)
    assert dict(eng_cuda.rejections) == dict(eng_cpu.rejections)


def test_backend_step_rounds_and_rejected_rows(cuda_mod):
    """Backend level: same planned batch on two stores; rejected rows are NaN."""
    stores = []
    for _ in range(2):
        store = StateStore(8)
        store.add_params(SHORT_WEIGHTED)
        store.add_params(SHORT_UNCUT)
        for k in range(5):
            store.allocate(k % 2)
        stores.append(store)
    backends = [cpu.CpuBackend(stores[0]), cuda_mod.CudaBackend(stores[1])]
    closes = walks(5, 30, seed=9)
    t = times_of(30)
    for step in range(12):
        # a shuffled batch: 2 bars for some streams, a duplicate, an unknown slot
        slots = np.array([3, 0, 1, 3, 4, 2, 0, 7, 1], np.int64)
        j = 2 * step
        times = np.array([t[j], t[j], t[j], t[j + 1], t[j], t[j], t[j + 1], t[j], t[j]], np.int64)
        px = closes[slots % 5, j]
        outs = []
        for store, backend in zip(stores, backends, strict=True):
            reasons = np.zeros(slots.shape[0], np.int64)
            order, starts = batch.plan_rounds(
                store.counters, store.in_use, store.pending_last, store.pending_count,
                slots, times, px, reasons,
            )  # fmt: skip
            assert order.shape[0] == 7 and starts.shape[0] == 3
            outs.append(backend.step(slots, times, px, order, starts))
        assert_same(outs[1], outs[0], f"step {step}")
        assert np.isnan(outs[1][[7, 8]]).all()  # unknown slot 7, duplicate bar of slot 1
        columns = [L.BAR_INDEX, L.LAST_TIME]
        assert_same(stores[1].counters[:, columns], stores[0].counters[:, columns], "host")
    backends[1].pull_state()
    for name in ("ring", "values", "counters"):
        assert_same(getattr(stores[1], name), getattr(stores[0], name), name)


# -- preview -------------------------------------------------------------------------------


def test_preview_leaves_state_untouched_and_equals_the_step():
    closes = walks(3, 50, seed=5)
    t = times_of(51)
    eng = Engine([SHORT_WEIGHTED, SHORT_UNCUT], backend="cuda", outputs="all")
    ref = Engine([SHORT_WEIGHTED, SHORT_UNCUT], backend="cpu", outputs="all")
    hist = {f"S{i}": (t[:50], closes[i]) for i in range(3)}
    eng.warmup(hist)
    ref.warmup(hist)
    before = pulled_state(eng)
    bars = [(f"S{i}", int(t[50]), float(closes[i, -1] * 0.997)) for i in range(3)]
    pv = eng.preview(bars + [("S1", int(t[49]), 1.0)])
    assert len(pv) == 6 and [r.symbol for r in pv.rejected] == ["S1"]
    for a, b in zip(before, pulled_state(eng), strict=True):
        assert_same(b, a, "state after preview")
    assert_same(pv.outputs, ref.preview(bars).outputs, "preview cuda vs cpu")
    assert_same(pv.outputs, eng.step(bars).outputs, "preview vs step of the same bar")


# -- warmup --------------------------------------------------------------------------------


@pytest.mark.parametrize("warmup_state", ["global", "local"])
def test_warmup_then_step_equals_longer_warmup(cuda_mod, warmup_state):
    closes = walks(3, 90, seed=11)
    t = times_of(90)

    def engine():
        eng = Engine([SHORT_WEIGHTED, LONGER], backend="cuda", outputs="all")
        eng.backend.warmup_state = warmup_state
        return eng

    a, b = engine(), engine()
    a.warmup({f"S{i}": (t[:70], closes[i, :70]) for i in range(3)})
    for j in range(70, 90):
        last_a = a.step([(f"S{i}", int(t[j]), float(closes[i, j])) for i in range(3)])
    last_b = b.warmup({f"S{i}": (t, closes[i]) for i in range(3)})
    assert_same(last_a.outputs, last_b.outputs, "last bar")
    assert_same_state(a, b)
    cpu_eng = Engine([SHORT_WEIGHTED, LONGER], backend="cpu", outputs="all")
    on_cpu = cpu_eng.warmup({f"S{i}": (t, closes[i]) for i in range(3)})
    assert_same(on_cpu.outputs, last_b.outputs, "cpu")
    assert_same_state(b, cpu_eng)


def test_warmup_ragged_histories_record_all(cuda_mod):
    """Different history lengths in one launch (padding), every bar recorded."""
    closes = walks(4, 40, seed=13)
    t = np.tile(times_of(40), (4, 1))
    counts = np.array([40, 0, 17, 33])
    outs = []
    for backend_cls in (cpu.CpuBackend, cuda_mod.CudaBackend):
        store = StateStore(4)
        store.add_params(SHORT_WEIGHTED)
        slots = np.array([store.allocate(0) for _ in range(4)])
        outs.append((backend_cls(store).warmup(slots, t, closes, counts, True), store))
    assert_same(outs[1][0], outs[0][0], "outputs")
    assert np.isnan(outs[1][0][1]).all() and np.isnan(outs[1][0][2, 17:]).all()
    columns = [L.BAR_INDEX, L.LAST_TIME]
    assert_same(outs[1][1].counters[:, columns], outs[0][1].counters[:, columns], "host")


# -- moving and reshaping live state ---------------------------------------------------------


def test_move_cpu_cuda_cpu_keeps_results():
    closes = walks(3, 80, seed=17)
    t = times_of(80)
    hist = {f"S{i}": (t[:40], closes[i, :40]) for i in range(3)}
    moving = Engine([SHORT_WEIGHTED, SHORT_UNCUT], backend="cpu", outputs="all")
    staying = Engine([SHORT_WEIGHTED, SHORT_UNCUT], backend="cpu", outputs="all")
    moving.warmup(hist)
    staying.warmup(hist)
    for j in range(40, 80):
        if j == 50:
            moving.move_to("cuda")
            assert moving.backend.name == "cuda"
        if j == 65:
            moving.move_to("cpu")
            assert moving.backend.name == "cpu"
        bars = [(f"S{i}", int(t[j]), float(closes[i, j])) for i in range(3)]
        assert_same(moving.step(bars).outputs, staying.step(bars).outputs, f"bar {j}")
    assert_same_state(moving, staying)


def test_move_to_unavailable_backend_keeps_the_engine():
    eng = Engine(SHORT_WEIGHTED, backend="cuda", outputs="all")
    with pytest.raises(ValueError, match="backend must be"):
        eng.move_to("tpu")
    assert eng.backend.name == "cuda"


def test_streams_and_params_added_while_live():
    """Slot reuse, capacity growth and a longer parameter set (ring growth) mid-run."""
    closes = walks(12, 60, seed=19)
    t = times_of(60)

    def run(backend):
        eng = Engine(SHORT_WEIGHTED, backend=backend, capacity=4, outputs="all")
        outs = [eng.warmup({f"S{i}": (t[:20], closes[i, :20]) for i in range(3)}).outputs]
        active = [0, 1, 2]
        for j in range(20, 60):
            if j == 25:
                eng.remove_symbol("S1")  # frees a slot ...
                active.remove(1)
            if j == 27:
                eng.add_symbol("S3")  # ... reused by a fresh stream
                active.append(3)
            if j == 30:
                for i in range(4, 10):  # capacity 4 -> 16
                    eng.add_symbol(f"S{i}")
                active += list(range(4, 10))
            if j == 40:
                eng.add_params(LONGER)  # longer windows: every ring grows
                eng.add_symbol("S10")
                eng.add_symbol("S0", [1])
                active.append(10)
            if j == 45:
                eng.warmup({"S11": (t[:j], closes[11, :j])})
                active.append(11)
            bars = [(f"S{i}", int(t[j]), float(closes[i, j])) for i in active]
            outs.append(eng.step(bars).outputs)
        return outs, eng

    got, eng_cuda = run("cuda")
    ref, eng_cpu = run("cpu")
    for i, (a, b) in enumerate(zip(got, ref, strict=True)):
        assert_same(a, b, f"output block {i}")
    assert_same_state(eng_cuda, eng_cpu)
    assert eng_cuda.stream_state(eng_cuda.streams[0]) == eng_cpu.stream_state(eng_cpu.streams[0])


# -- host-side step plan: cached plan, m = 1, shuffled slots, small stores, chunked warmup ------


def test_step_plan_cache_m1_shuffled_slots_and_one_row_store(cuda_mod):
    """The plan cache, one-update steps and slot orders never change a result.

    A one-row store (its F-order state would type as C order), steps with one update,
    then more streams (the store grows) arriving in a shuffled order that repeats (the
    cached device plan is reused) and then changes; the warmup split by a tiny memory
    budget. Every output and the final state equal the CPU's.
    """
    closes = walks(6, 60, seed=11)
    t = times_of(60)
    engines = [
        Engine(SHORT_WEIGHTED, backend=b, capacity=1, outputs="all") for b in ("cuda", "cpu")
    ]
    cuda_backend = engines[0].backend
    cuda_backend.warmup_memory_budget = 1  # one stream per warmup chunk
    for eng in engines:
        eng.warmup({"S0": (t[:10], closes[0, :10])})
    for j in range(10, 14):  # m = 1
        outs = [e.step([("S0", int(t[j]), float(closes[0, j]))]).outputs for e in engines]
        assert_same(outs[0], outs[1], f"m=1 bar {j}")
    for eng in engines:  # five more streams: the store grows past one row
        eng.warmup({f"S{i}": (t[:14], closes[i, :14]) for i in range(1, 6)})
    order = np.array([4, 0, 5, 2, 1, 3])
    plans = []
    for j in range(14, 30):
        if j == 24:
            order = order[::-1].copy()  # a new arrival order: the plan is rebuilt
        slots = np.array([engines[0].slot_of(engines[0].streams[i]) for i in order])
        outs = [e.step_arrays(slots, np.full(6, t[j]), closes[order, j]).outputs for e in engines]
        assert_same(outs[0], outs[1], f"bar {j}")
        plans.append(cuda_backend._plan_slots)
    assert plans[1] is plans[9], "the plan of a repeating slot set was rebuilt"
    assert plans[10] is not plans[9] and plans[11] is plans[10]
    moves = [("S3", int(t[30]), 99.0), ("S1", int(t[30]), 98.0), ("S3", int(t[30]), 97.0)]
    pv = [e.preview(moves).outputs for e in engines]  # S3 twice: two scratch rows
    assert_same(pv[0], pv[1], "preview")
    assert_same_state(*engines)


def test_threads_per_block_is_a_checked_parameter(cuda_mod):
    store = StateStore(4)
    store.add_params(SHORT_WEIGHTED)
    for bad in (0, 48, 2048, 64.0):
        with pytest.raises(ValueError, match="threads_per_block"):
            cuda_mod.CudaBackend(store, threads_per_block=bad)
    assert cuda_mod.CudaBackend(store, threads_per_block=256).threads_per_block == 256


def test_requested_outputs_subset_cuda_equals_cpu():
    """Only the requested columns come back (the rest NaN), equal to the CPU's."""
    closes = walks(3, 40, seed=13)
    t = times_of(41)
    engines = [Engine(SHORT_WEIGHTED, backend=b, outputs="all") for b in ("cuda", "cpu")]
    for eng in engines:
        eng.warmup({f"S{i}": (t[:30], closes[i, :30]) for i in range(3)})
        eng.request_outputs("signal", "events")
    wanted = [
        output_row.OUT_SIGNAL,
        output_row.OUT_LONG,
        output_row.OUT_SHORT,
        output_row.OUT_BAR_INDEX,
    ]
    others = [c for c in range(output_row.N_OUT) if c not in wanted]
    for j in range(30, 34):
        bars = [(f"S{i}", int(t[j]), float(closes[i, j])) for i in range(3)]
        bars.append(("S1", int(t[j - 1]), 5.0))  # a duplicate: rejected
        outs = [e.step(bars).outputs for e in engines]
        assert_same(outs[0], outs[1], f"bar {j}")
        assert np.isnan(outs[0][:, others]).all() and not np.isnan(outs[0][:, wanted]).any()
    pv = [e.preview([("S2", int(t[34]), 77.0)]).outputs for e in engines]
    assert_same(pv[0], pv[1], "preview")
    for eng in engines:
        eng.request_outputs()  # all columns again
    full = [e.step([("S0", int(t[34]), float(closes[0, 34]))]).outputs for e in engines]
    assert_same(full[0], full[1], "all columns")
    assert not np.isnan(full[0]).any()


@pytest.fixture(scope="module")
def full_outputs_cpu():
    from output_subsets import drive as drive_subset

    return drive_subset("cpu", "all")


@pytest.mark.parametrize(
    "outputs", [None, ("layers",), ("signal", "equities", "growth"), (), "all"], ids=repr
)
def test_requested_output_subsets_cuda_equal_all_cpu_outputs(outputs, full_outputs_cpu):
    """``Engine(backend="cuda", outputs=...)``: each requested column (packed on the
    device, events as bytes, bar_index from the host) equals the CPU's full result, in
    the narrow types; m = 1, a repeated shuffled slot set, two rounds with rejections,
    a preview holding one slot twice (tests/output_subsets.py)."""
    from output_subsets import assert_subset_matches
    from output_subsets import drive as drive_subset

    assert_subset_matches(drive_subset("cuda", outputs), full_outputs_cpu, outputs)


def test_only_the_requested_columns_are_packed(cuda_mod):
    from atc_stream.core import schema

    eng = Engine(SHORT_WEIGHTED, backend="cuda", outputs=("signal", "events"))
    t = times_of(12)
    eng.warmup({"A": (t[:10], walks(1, 10, seed=1)[0])})
    eng.step([("A", int(t[10]), 101.0)])
    backend = eng.backend
    assert backend._packed_k == 1  # the signal: one float column, events one byte each
    eng.outputs = "all"
    eng.step([("A", int(t[11]), 102.0)])
    assert backend._packed_k == schema.float_columns(schema.ALL_OUTPUTS).shape[0] == 14


# -- double-buffered steps, CUDA graph option ------------------------------------------------


def test_async_steps_double_buffered_equal_the_cpu(cuda_mod):
    """Three steps submitted before any result is read (the third reuses the first's
    buffer set, so the first is waited for and copied out); previews and a snapshot
    in between; every result equals the CPU's synchronous one."""
    closes = walks(3, 40, seed=21)
    t = times_of(40)
    outputs = ("signal", "events", "layers")
    engines = [Engine([SHORT_WEIGHTED, SHORT_UNCUT], backend=b, outputs=outputs)
               for b in ("cuda", "cpu")]  # fmt: skip
    for eng in engines:
        eng.warmup({f"S{i}": (t[:20], closes[i, :20]) for i in range(3)})
    order = [2, 0, 1]
    got, want = [], []
    j = 20
    while j < 38:
        bars = [(f"S{i}", int(t[j]), float(closes[i, j])) for i in order]
        pend = [engines[0].step_async(bars)]
        want.append(engines[1].step(bars))
        j += 1
        bars = [(f"S{i}", int(t[j]), float(closes[i, j])) for i in order]
        pend.append(engines[0].step_async(bars))
        want.append(engines[1].step(bars))
        io = engines[0].backend._io
        assert io[0].pending is not None and io[1].pending is not None  # both in flight
        j += 1
        if j % 4 == 0:  # a preview while two steps are pending
            pv = [e.preview([("S1", int(t[j]), 50.0)]) for e in engines]
            assert_same(pv[0].outputs, pv[1].outputs, f"preview {j}")
        bars = [(f"S{i}", int(t[j]), float(closes[i, j])) for i in order]
        pend.append(engines[0].step_async(bars))
        want.append(engines[1].step(bars))
        j += 1
        got += [p.result() for p in pend]
    assert got[0] is not None and pend[-1].result() is got[-1]  # built once
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.column_names == b.column_names
        for name, values in b.columns().items():
            assert np.array_equal(a.columns()[name], values, equal_nan=values.dtype.kind == "f"), (
                k, name,
            )  # fmt: skip
    assert_same_state(*engines)


@simulator_only
def test_cuda_graph_falls_back_with_one_warning_under_the_simulator(cuda_mod, caplog):
    closes = walks(2, 30, seed=4)
    t = times_of(30)
    with caplog.at_level("WARNING", logger="atc_stream"):
        eng = Engine(SHORT_WEIGHTED, backend="cuda", cuda_graph=True, outputs="all")
    warned = [r for r in caplog.records if "CUDA graphs need CuPy" in r.getMessage()]
    assert len(warned) == 1 and eng.backend.graphs is None and eng.cuda_graph
    ref = Engine(SHORT_WEIGHTED, backend="cpu", outputs="all")
    for e in (eng, ref):
        e.warmup({f"S{i}": (t[:25], closes[i, :25]) for i in range(2)})
    for j in range(25, 28):
        bars = [(f"S{i}", int(t[j]), float(closes[i, j])) for i in range(2)]
        assert_same(eng.step(bars).outputs, ref.step(bars).outputs, f"bar {j}")
    eng.move_to("cuda")  # the option carries over (and warns again for the new backend)
    assert eng.backend.graphs is None


def test_replay_calls_of_many_bar_times_cuda_equals_cpu():
    """A replay's calls of many bar times (the warmup kernel, every bar kept) on the
    simulated device give the CPU's one-bar-time steps, rows and state."""
    from atc_stream.connectors.replay.player import BarPlayer
    from atc_stream.io.readers import BarTable

    closes = walks(3, 40, seed=5)
    closes[1, 7] = -1.0  # rejected on both
    times = BASE_TIME + BAR_MS * np.arange(40)
    symbols = np.repeat(np.array(["S0", "S1", "S2"], object)[None, :], 40, axis=0).ravel()
    table = BarTable(symbols, np.repeat(times, 3), closes.T.ravel())
    rows, engines = [], []
    for backend, batch_rows in (("cuda", 65_536), ("cpu", 0)):
        eng = Engine([SHORT, SHORT_WEIGHTED], backend=backend)
        results = []
        BarPlayer(eng, table, warmup_bars=5, on_result=results.append,
                  batch_rows=batch_rows).run()  # fmt: skip
        rows.append([row for r in results for row in zip(*r.column_values(), strict=True)])
        engines.append(eng)
    assert rows[0] == rows[1] and len(rows[0]) == 2 * (3 * 36 - 1)  # the warmup: one a stream
    assert_same_state(*engines)
    assert dict(engines[0].rejections) == dict(engines[1].rejections)
