"""register_operator on a GPU machine: the CUDA expression is compiled at registration and must pass the
identity, associativity and commutativity samples on the GPU as well as on the CPU. The CPU side of the
same logic is tests/test_bad_input.py (check_algebra through the NumPy path of the API)."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
pytestmark = pytest.mark.gpu

import multireduce as mr  # noqa: E402
from multireduce.kernels import KernelError  # noqa: E402


def _refused(exc, match, **kw):
    kw = {"identity": 0, "cpu": np.add, "commutative": True, **kw}
    with pytest.raises(exc, match=match):
        mr.register_operator("gpu_hostile", replace=True, **kw)
    assert "gpu_hostile" not in mr.operators()


def test_cuda_expression_that_disagrees_with_cpu_identity_is_refused_on_the_gpu():
    # the CPU function is a correct sum; the CUDA expression adds one, so 0 is no identity there
    _refused(ValueError, r"not an identity of operator 'gpu_hostile' \(cuda\)", cuda="a + b + 1", kinds="iu")


def test_cuda_expression_that_is_not_associative_is_refused_on_the_gpu():
    # identity 0 holds on both sides, but the CUDA side subtracts: (5 - 3) - 1 != 5 - (3 - 1)
    cuda = "(b == 0 ? a : (a == 0 ? b : a - b))"
    _refused(ValueError, r"\(cuda\) is not associative", cpu=np.add, cuda=cuda, commutative=False, kinds="i")


def test_cuda_expression_that_is_not_commutative_is_refused_when_claimed():
    # the first non-zero element: identity 0 and associative, but not commutative (the CPU side, a sum, is)
    _refused(ValueError, r"operator 'gpu_hostile' \(cuda\)", cuda="(a == 0 ? b : a)", kinds="i")


def test_compile_error_is_raised_at_registration():
    _refused(KernelError, r"gpu_hostile.*mr_user::op_gpu_hostile", cuda="a +* b", kinds="i")
    _refused(KernelError, r"gpu_hostile", cuda="undefined_function(a, b)", kinds="f")


def test_a_correct_operator_is_accepted_and_runs():
    op = mr.register_operator("gpu_bor", identity=0, cpu=np.bitwise_or, cuda="(a | b)", commutative=True,
                              kinds="biu", replace=True)
    try:
        x = np.random.default_rng(3).integers(0, 2**20, 1025, dtype=np.uint32)
        assert int(mr.reduce(cupy.asarray(x), op)) == int(np.bitwise_or.reduce(x))
    finally:
        mr.unregister_operator("gpu_bor")
