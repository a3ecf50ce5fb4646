"""The CUDA kernels' PTX, compiled without a GPU: no FMA contraction, no device ``exp``.

Runs in the main CI suite (not marked ``gpu``, not ``cudasim``): libNVVM and NVRTC come
from the ``nvidia-nvvm``/``nvidia-cuda-nvrtc`` wheels of the ``test`` extra, and PTX
needs no device. Select with ``pytest -k "ptx or fma"``. Outside CI the tests skip when
libNVVM cannot be loaded; in CI (``CI`` set) that is a failure, so the guard can never
silently stop being checked. Also here: ``backend="auto"`` on a machine without a GPU.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types

import pytest

from atc_stream.kernels import cuda_available, cuda_simulated

pytestmark = pytest.mark.skipif(
    cuda_simulated(), reason="PTX is compiled by libNVVM, not by the simulator"
)

CCS = [pytest.param((8, 0), id="sm_80"), pytest.param((9, 0), id="sm_90")]
FLOAT_KERNELS = ("step_kernel", "preview_kernel", "warmup_kernel", "local_warmup_kernel(70)")


def _ptx_toolchain() -> str:
    """'' when numba can compile PTX here (libNVVM + NVRTC), else why not."""
    from numba import cuda

    from atc_stream.kernels.ptx_guard import restore_numpy_names_numba_cuda_uses

    restore_numpy_names_numba_cuda_uses()  # the tests below compile without the guard too

    def probe(out):
        out[0] = 1.0

    try:
        cuda.compile_ptx(probe, "void(float64[:])", cc=(8, 0))
    except Exception as exc:  # DynamicLibNotFoundError, NvvmSupportError, ...
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return ""


@pytest.fixture(scope="module")
def toolchain():
    why = _ptx_toolchain()
    if why:
        message = f"cannot compile PTX here ({why}); install the test extra (nvidia-nvvm)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="module")
def guard():
    from atc_stream.kernels import ptx_guard

    return ptx_guard


@pytest.fixture(scope="module")
def kernels():
    from atc_stream.kernels import cuda_kernels

    return cuda_kernels


def _contractible(a, b, c, out):
    out[0] = a[0] * b[0] + c[0]


_SIG = "void(float64[:], float64[:], float64[:], float64[:])"


def test_fma_hook_control_ptx(toolchain, guard):
    """numba-cuda's default contracts a*b + c into fma.rn.f64; inside ``no_fma()`` it does not.

    The control proves the check below can fail: if numba-cuda changed its default or
    the hook stopped taking effect, one of these two assertions breaks.
    """
    from numba import cuda

    assert guard.ptx_has_fma(cuda.compile_ptx(_contractible, _SIG, cc=(9, 0))[0])
    with guard.no_fma():
        ptx = cuda.compile_ptx(_contractible, _SIG, cc=(9, 0))[0]
    assert not guard.ptx_has_fma(ptx)
    assert "mul.rn.f64" in ptx and "add.rn.f64" in ptx


def test_ptx_compiles_with_a_numpy_that_lacks_row_stack(toolchain):
    """numpy 2.5 removed ``np.row_stack``, which numba-cuda 0.30 registers at its first
    compile: without the alias every compile fails (seen on a device with numpy 2.5). The
    name is removed in a fresh process, where numba-cuda has not compiled yet."""
    code = (
        "import numpy as np, sys\n"
        "del np.row_stack\n"
        "sys.path.insert(0, 'tests')\n"
        "from numba import cuda\n"
        "def probe(out):\n"
        "    out[0] = 1.0\n"
        "try:\n"
        "    cuda.compile_ptx(probe, 'void(float64[:])', cc=(8, 0))\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('the control compiled: numba-cuda no longer needs row_stack')\n"
        "from test_cuda_ptx import _ptx_toolchain\n"
        "raise SystemExit(_ptx_toolchain() or None)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("cc", CCS)
def test_kernel_ptx_has_no_fma_and_no_device_exp(toolchain, guard, kernels, cc):
    """Every kernel the backend launches, with its launch types, for sm_80 and sm_90."""
    ptxes = kernels.kernel_ptx(cc=cc)
    assert set(ptxes) == set(kernels.kernel_signatures()), "a kernel was left out"
    target = f".target sm_{cc[0]}{cc[1]}"
    for name, ptx in ptxes.items():
        assert target in ptx, name
        assert not guard.ptx_has_fma(ptx), f"{name}: FMA contraction in the parity path"
        assert "ex2." not in ptx, f"{name}: exp on the device (growth must come from the host)"
        if name in FLOAT_KERNELS:  # explicit rounding: ptxas may not fuse these either
            assert "mul.rn.f64" in ptx and "add.rn.f64" in ptx, name
            guard.check_ptx_no_fma(name, [ptx])  # what the backend runs at first compile


def test_fma_guard_refuses_contracted_step_ptx(toolchain, guard, kernels):
    """The backend's guard raises on the step kernel compiled *without* the hook."""
    from numba import cuda

    kernel, argtypes = kernels.kernel_signatures()["step_kernel"]
    with guard.compute_capability_stand_in((9, 0)):
        contracted, _ = cuda.compile_ptx(kernel.py_func, argtypes, cc=(9, 0))
    assert "fma.rn.f64" in contracted  # the control: NVVM's default contracts
    with pytest.raises(guard.FmaContractionError, match="step_kernel.*fma.rn.f64.*Refusing"):
        guard.check_ptx_no_fma("step_kernel", [contracted])


def test_fma_hook_numba_cuda_version_is_the_verified_one(guard):
    """An upgrade of numba-cuda past the verified range must be a decision, not an accident."""
    from importlib.metadata import version

    from packaging.specifiers import SpecifierSet

    installed = version("numba-cuda")
    assert installed in SpecifierSet(guard.NUMBA_CUDA_VERIFIED), (
        f"numba-cuda {installed} is outside {guard.NUMBA_CUDA_VERIFIED}: re-verify the no-FMA "
        "hook (tests in this file) and widen NUMBA_CUDA_VERIFIED and the pyproject pins"
    )


def test_ptx_fma_spelling_of_the_guard(guard):
    """The guard's pattern: every rounding mode of an f64 FMA, not f32 ones or mul/add."""
    assert guard.ptx_has_fma("\tfma.rn.f64 \t%fd3, %fd1, %fd2, %fd0;")
    assert guard.ptx_has_fma("fma.rz.f64 %fd3, %fd1, %fd2, %fd0;")
    assert not guard.ptx_has_fma("fma.rn.f32 %f3, %f1, %f2, %f0;")
    assert not guard.ptx_has_fma("mul.rn.f64 %fd3, %fd1, %fd2;\nadd.rn.f64 %fd4, %fd3, %fd0;")


def test_auto_backend_without_a_gpu_picks_the_cpu():
    """No GPU here: ``auto`` (even with many streams) runs on the CPU; ``cuda`` says why not."""
    from atc_stream.engine.engine import Engine
    from atc_stream.kernels import AUTO_MIN_STREAMS

    available, why = cuda_available()
    if available:
        pytest.skip("a usable CUDA device is present")
    assert why
    eng = Engine(backend="auto", capacity=AUTO_MIN_STREAMS)
    assert eng.backend.name == "cpu"
    with pytest.raises(RuntimeError, match="CUDA is unavailable: " + re.escape(why)):
        Engine(backend="cuda")
    assert cuda_available() == (available, why)  # probed once, same answer


def test_paper_kernel_ptx_has_no_fma(toolchain, guard):
    """The live strategy step on the device (``cuda_paper.py``), with its launch types."""
    from numba import cuda

    from atc_stream.kernels.cuda_paper import paper_signatures

    for name, (kernel, argtypes) in paper_signatures().items():
        with guard.compute_capability_stand_in((9, 0)), guard.no_fma():
            ptx, _ = cuda.compile_ptx(kernel.py_func, argtypes, cc=(9, 0), lineinfo=False)
        assert not guard.ptx_has_fma(ptx), f"{name}: FMA contraction in the parity path"
        if name.startswith("paper"):  # the strategy arithmetic, explicitly rounded
            assert "mul.rn.f64" in ptx and "add.rn.f64" in ptx, name
        guard.check_ptx_no_fma(name, [ptx])


def _add(out):
    out[0] = out[0] * out[1] + out[2]


def test_kernels_compile_without_link_time_optimisation_where_nvjitlink_is(monkeypatch, guard):
    """With nvJitLink installed, numba-cuda links with LTO by default, and its decorator form
    ``cuda.jit(lto=False)`` drops the argument: the kernel's machine code would then come
    from nvJitLink (FMA contraction on), not from the checked PTX."""
    from numba import cuda
    from numba.cuda import decorators

    monkeypatch.setattr(decorators, "_have_nvjitlink", lambda: True)
    assert cuda.jit(lto=False)(_add).targetoptions["lto"] is True  # the control: dropped
    assert guard.kernel(_add).targetoptions["lto"] is False


def test_the_guard_refuses_a_kernel_linked_with_lto(guard):
    overload = types.SimpleNamespace(library=types.SimpleNamespace(_lto=True), _name="k")
    with pytest.raises(guard.FmaContractionError, match="link-time optimisation"):
        guard.check_ptx_no_fma("k", guard._kernel_ptx_strings(overload))
