"""Associative operators: the bottom layer that everything else is generic over.

An operator is a name, an identity, a binary function for the CPU (a NumPy ufunc or a vectorised
callable), a binary function for the GPU (a CUDA functor or expression in ``a`` and ``b``), and
whether it is commutative. Non-commutative operators are only ever applied as ``op(left, right)``
with ``left`` holding earlier elements; every layer above keeps that order.

Operators travel inside Dask tasks as objects, so a worker never needs the client's registry.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import dtypes as _dt

__all__ = ["Operator", "register_operator", "get_operator", "operators", "unregister_operator"]


@dataclass(frozen=True, eq=False)
class Operator:
    """An associative binary operator with an identity.

    ``family`` selects NumPy's dtype rules: "sum" (sum, prod: small integers promote),
    "order" (min, max: result keeps the input dtype, empty input is an error), "user".
    """

    name: str
    family: str
    cpu: Callable[[Any, Any], Any]
    cuda: str
    commutative: bool
    kinds: str
    identity_value: Any = None
    cuda_preamble: str = ""
    builtin: bool = False
    _identity_fn: Callable[[np.dtype], Any] | None = field(default=None, repr=False)

    # -- identity -------------------------------------------------------------------------------
    def identity(self, dtype: np.dtype) -> Any:
        """The identity as a NumPy scalar of ``dtype``."""
        dtype = np.dtype(dtype)
        value = self._identity_fn(dtype) if self._identity_fn is not None else self.identity_value
        return np.array(value).astype(dtype)[()]

    @property
    def empty_is_error(self) -> bool:
        """NumPy raises for min/max of nothing; sum, prod and user operators return the identity."""
        return self.family == "order"

    # -- the CPU side ---------------------------------------------------------------------------
    @property
    def ufunc(self) -> np.ufunc | None:
        return self.cpu if isinstance(self.cpu, np.ufunc) else None

    def combine(self, left, right):
        """``left op right`` elementwise, ``left`` holding the earlier elements."""
        return self.cpu(left, right)

    # -- the GPU side ---------------------------------------------------------------------------
    @property
    def cuda_functor(self) -> str:
        """The C++ type name of the functor the kernels are instantiated with."""
        return self.cuda if self.builtin else f"mr_user::op_{self.name}"

    def cuda_source(self) -> str:
        """Device code defining the functor (empty for built-in operators, which live in kernels/)."""
        if self.builtin:
            return ""
        return (
            "namespace mr_user {\n"
            f"{self.cuda_preamble}\n"
            f"struct op_{self.name} {{\n"
            "  template <class A>\n"
            "  __device__ __forceinline__ A operator()(const A& a, const A& b) const {\n"
            f"    return static_cast<A>({self.cuda});\n"
            "  }\n"
            "};\n"
            "}  // namespace mr_user\n"
        )

    def __dask_tokenize__(self):
        from dask.base import tokenize

        return (
            "multireduce.Operator",
            self.name,
            self.family,
            self.cuda,
            self.cuda_preamble,
            self.commutative,
            self.kinds,
            repr(self.identity_value),
            tokenize(self.cpu),
        )

    def __repr__(self) -> str:
        kind = "commutative" if self.commutative else "non-commutative"
        return f"<multireduce operator {self.name!r} ({kind})>"


# ------------------------------------------------------------------------------------------------
# Built-in operators
# ------------------------------------------------------------------------------------------------
def _min_identity(dtype: np.dtype):
    if dtype.kind == "f":
        return np.inf
    if dtype.kind == "b":
        return True
    return np.iinfo(dtype).max


def _max_identity(dtype: np.dtype):
    if dtype.kind == "f":
        return -np.inf
    if dtype.kind == "b":
        return False
    return np.iinfo(dtype).min


_BUILTINS = {
    "sum": Operator("sum", "sum", np.add, "mr::Sum", True, _dt.ARITHMETIC_KINDS, 0, builtin=True),
    "prod": Operator("prod", "sum", np.multiply, "mr::Prod", True, _dt.ARITHMETIC_KINDS, 1, builtin=True),
    "min": Operator(
        "min", "order", np.minimum, "mr::Min", True, _dt.ORDERED_KINDS, builtin=True, _identity_fn=_min_identity
    ),
    "max": Operator(
        "max", "order", np.maximum, "mr::Max", True, _dt.ORDERED_KINDS, builtin=True, _identity_fn=_max_identity
    ),
}

_REGISTRY: dict[str, Operator] = dict(_BUILTINS)
_LISTENERS: list[Callable[[], None]] = []


def on_registry_change(callback: Callable[[], None]) -> None:
    """Call ``callback`` whenever a name is registered or unregistered (caches keyed by names drop then)."""
    _LISTENERS.append(callback)


def _changed() -> None:
    for callback in _LISTENERS:
        callback()
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def register_operator(
    name: str,
    *,
    identity: Any,
    cpu: Callable[[Any, Any], Any],
    cuda: str | None = None,
    commutative: bool,
    cuda_preamble: str = "",
    kinds: str = _dt.USER_KINDS,
    replace: bool = False,
) -> Operator:
    """Register an associative operator once, under ``name``, for ``reduce`` and ``scan``.

    Parameters
    ----------
    name : a Python identifier, not one of the built-in names.
    identity : the value ``e`` with ``op(e, x) == op(x, e) == x``; required, because empty chunks and
        padding need it.
    cpu : a NumPy ufunc or a vectorised callable ``f(left, right)`` on arrays.
    cuda : a CUDA C++ expression in ``a`` (left, earlier elements) and ``b`` (right); its type is the
        accumulator type ``A``. Optional: without it the operator runs on the CPU only.
    commutative : whether ``op(a, b) == op(b, a)``. Non-commutative operators keep element order in
        every kernel and across chunks; algorithms that reorder elements refuse them.
    cuda_preamble : device code (helper ``__device__`` functions) the expression may call.
    kinds : the dtype kinds (NumPy ``dtype.kind`` letters) the operator accepts.
    """
    if not isinstance(name, str) or not _NAME.match(name) or keyword.iskeyword(name):
        raise ValueError(f"register_operator: argument 'name' must be a Python identifier; got {name!r}")
    if name in _BUILTINS:
        raise ValueError(
            f"register_operator: argument 'name' is {name!r}, a built-in operator; choose another name"
        )
    if identity is None:
        raise TypeError(
            f"register_operator: argument 'identity' is required for operator {name!r}: "
            "expected the value e with op(e, x) == x (0 for a sum, 1 for a product); got None"
        )
    if not callable(cpu):
        raise TypeError(
            f"register_operator: argument 'cpu' must be a NumPy ufunc or a callable f(left, right); "
            f"got {type(cpu).__name__}"
        )
    if cuda is not None and (not isinstance(cuda, str) or not cuda.strip()):
        raise TypeError(f"register_operator: argument 'cuda' must be a CUDA expression string; got {cuda!r}")
    if not isinstance(commutative, bool):
        raise TypeError(f"register_operator: argument 'commutative' must be True or False; got {commutative!r}")
    if not kinds or set(kinds) - set(_dt.KIND_NAMES):
        raise ValueError(
            f"register_operator: argument 'kinds' must be letters out of {''.join(_dt.KIND_NAMES)!r}; got {kinds!r}"
        )
    op = Operator(
        name,
        "user",
        cpu,
        cuda or "",
        commutative,
        kinds,
        identity_value=identity,
        cuda_preamble=cuda_preamble,
    )
    if name in _REGISTRY and not replace:
        raise ValueError(
            f"register_operator: an operator named {name!r} is already registered; pass replace=True to replace it"
        )
    _REGISTRY[name] = op
    _changed()
    return op


def unregister_operator(name: str) -> None:
    if name in _BUILTINS:
        raise ValueError(f"unregister_operator: {name!r} is a built-in operator")
    _REGISTRY.pop(name, None)
    _changed()


def operators() -> list[str]:
    """Names of every operator known to ``reduce`` and ``scan``."""
    return sorted(_REGISTRY)


def get_operator(op: str | Operator, *, caller: str = "multireduce") -> Operator:
    if isinstance(op, Operator):
        return op
    if isinstance(op, str) and op in _REGISTRY:
        return _REGISTRY[op]
    known = ", ".join(repr(n) for n in operators())
    raise ValueError(
        f"{caller}: argument 'op' must be one of {known} or an operator registered with "
        f"multireduce.register_operator; got {op!r}"
    )
