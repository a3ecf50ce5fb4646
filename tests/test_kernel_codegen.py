"""The compiled CPU kernels: no fused multiply-add (fastmath stays off and LLVM must not
contract ``a * b + c``, docs/spec.md "Canonical arithmetic"), and the lane kernel's
arithmetic really runs on vectors of LANES doubles."""

from __future__ import annotations

import platform
import re

import numpy as np
import pytest
from numba import njit

from atc_stream.engine import Engine
from atc_stream.kernels import cpu
from atc_stream.kernels.simd import LANES, SUM_PARTS

pytestmark = pytest.mark.timeout(600)

FMA_IR = re.compile(r"llvm\.fma\.|llvm\.fmuladd\.|\bcontract\b|\bfast\b")
FMA_ASM = re.compile(r"\bv?f(n)?m(add|sub)\d*[ps][sd]\b|\bvfmaddsub|\bvfmsubadd")
#: an x86 packed-double add or multiply (SSE2 xmm, AVX ymm or AVX-512 zmm registers)
PACKED_ASM = re.compile(r"\bv?(add|mul|sub)pd\b[^\n]*%[xyz]mm")
#: a packed add whose accumulator is its destination register: a window sum's chain
#: kept in a register, one memory row added per step
CHAIN_ASM = re.compile(r"\bv?addpd\s+-?\d*\(%\w+[^)]*\), %([xyz]mm\d+), %\1\b")


def _fresh_code(dispatcher) -> tuple[str, str]:
    """IR and assembly of a fresh, uncached compile of ``dispatcher``'s first signature
    with its own options (numba shows nothing for code loaded from its cache)."""
    options = {k: v for k, v in dispatcher.targetoptions.items() if k != "nopython"}
    copy = njit(**options)(dispatcher.py_func)
    signature = dispatcher.signatures[0]
    copy.compile(signature)
    return copy.inspect_llvm(signature), copy.inspect_asm(signature)


@pytest.fixture(scope="module")
def compiled_kernels() -> None:
    """Run warmups and a step so every CPU driver has a compiled signature."""
    engine = Engine(backend="cpu", threads=1)
    times = np.arange(40, dtype=np.int64)
    engine.warmup({name: (times, 1.0 + np.arange(40) / 7) for name in "ABCDEFGHIJ"})
    engine.warmup({"K": (times, np.ones(40))})
    engine.step_arrays(engine.slots_of("A"), [40], [2.0])
    # the lane kernel is called only from compiled code: type it through its caller
    _fresh_code(cpu.warmup_blocks)


def test_cpu_kernels_contain_no_fma(compiled_kernels):
    for dispatcher in (cpu.warmup_blocks, cpu.block_warmup, cpu.step_serial):
        ir, asm = _fresh_code(dispatcher)
        assert "fadd" in ir and "fmul" in ir  # the arithmetic is there to inspect
        assert not FMA_IR.search(ir), FMA_IR.search(ir)
        assert not FMA_ASM.search(asm), FMA_ASM.search(asm)


def test_lane_kernel_is_vectorized(compiled_kernels):
    """The lane kernel's additions, multiplications and divisions are LLVM vector ops of
    LANES doubles, its window sums run on vectors of a row's part (``simd.SUM_PARTS``),
    and they add a memory row to a register accumulator."""
    ir, asm = _fresh_code(cpu.block_warmup)
    vector = f"<{LANES} x double>"
    sum_vector = f"<{LANES // SUM_PARTS} x double>"
    for operation in ("fadd", "fsub", "fmul", "fdiv"):
        count = len(re.findall(rf"= {operation} {re.escape(vector)} ", ir))
        assert count >= 6, f"{operation} on {vector}: {count} in the lane kernel's IR"
    # the nine chains of the plain and of the weighted family sums
    sum_adds = len(re.findall(rf"= fadd {re.escape(sum_vector)} ", ir))
    assert sum_adds >= 18, f"fadd on {sum_vector}: {sum_adds} in the lane kernel's IR"
    scalar_adds = len(re.findall(r"= fadd double ", ir))
    vector_adds = len(re.findall(r"= fadd <\d+ x double> ", ir))
    # a kernel whose lanes fell back to scalar code would have few vector adds and
    # thousands of scalar ones; where the sums run on whole rows (AVX-512, one part) the
    # lane kernel has ~590 vector adds against ~160 scalar ones (the streams' own sums)
    assert vector_adds > 2 * scalar_adds, (vector_adds, scalar_adds)
    if platform.machine() in ("x86_64", "AMD64"):
        assert len(PACKED_ASM.findall(asm)) >= 50, "few packed-double instructions"
        assert len(CHAIN_ASM.findall(asm)) >= 8, "no window sum chained in a register"
