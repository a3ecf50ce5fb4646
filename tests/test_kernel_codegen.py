"""The compiled CPU kernels contain no fused multiply-add: fastmath stays off and LLVM
must not contract ``a * b + c`` (docs/spec.md, "Canonical arithmetic")."""

from __future__ import annotations

import re

import numpy as np
import pytest
from numba import njit

from atc_stream.engine import Engine
from atc_stream.kernels import cpu

pytestmark = pytest.mark.timeout(600)

FMA_IR = re.compile(r"llvm\.fma\.|llvm\.fmuladd\.|\bcontract\b|\bfast\b")
FMA_ASM = re.compile(r"\bv?f(n)?m(add|sub)\d*[ps][sd]\b|\bvfmaddsub|\bvfmsubadd")


def _fresh_code(dispatcher) -> tuple[str, str]:
    """IR and assembly of a fresh, uncached compile of ``dispatcher``'s first signature
    (numba shows nothing for code loaded from its cache)."""
    copy = njit(error_model="numpy")(dispatcher.py_func)
    signature = dispatcher.signatures[0]
    copy.compile(signature)
    return copy.inspect_llvm(signature), copy.inspect_asm(signature)


def test_cpu_warmup_and_step_kernels_contain_no_fma():
    engine = Engine(backend="cpu", threads=1)
    times = np.arange(40, dtype=np.int64)
    engine.warmup({name: (times, 1.0 + np.arange(40) / 7) for name in "ABCDEFG"})
    engine.warmup({"H": (times, np.ones(40))})
    engine.step_arrays(engine.slots_of("A"), [40], [2.0])
    for dispatcher in (cpu.warmup_blocks_serial, cpu.warmup_serial, cpu.step_serial):
        ir, asm = _fresh_code(dispatcher)
        assert "fadd" in ir and "fmul" in ir  # the arithmetic is there to inspect
        assert not FMA_IR.search(ir), FMA_IR.search(ir)
        assert not FMA_ASM.search(asm), FMA_ASM.search(asm)
