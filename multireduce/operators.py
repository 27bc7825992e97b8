"""Associative operators: the bottom layer that everything else is generic over.

An operator is a name, an identity, a binary function for the CPU (a NumPy ufunc or a vectorised
callable), a binary function for the GPU (a CUDA functor or expression in ``a`` and ``b``), and
whether it is commutative. Non-commutative operators are only ever applied as ``op(left, right)``
with ``left`` holding earlier elements; every layer above keeps that order.

Operators travel inside Dask tasks as objects, so a worker never needs the client's registry.
"""

from __future__ import annotations

import keyword
import warnings
import numbers
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import dtypes as _dt

__all__ = ["Operator", "register_operator", "get_operator", "operators", "unregister_operator", "on_register"]


@dataclass(frozen=True, eq=False)
class Operator:
    """An associative binary operator with an identity.

    ``family`` selects NumPy's dtype rules: "sum" (sum, prod: small integers promote),
    "order" (min, max: result keeps the input dtype, empty input is an error), "user".

    Examples
    --------
    >>> import numpy as np, multireduce as mr
    >>> from multireduce.operators import get_operator
    >>> op = get_operator("min")
    >>> op.name, op.family, op.commutative
    ('min', 'order', True)
    >>> print(op.identity(np.dtype(np.int8)))
    127
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
    #: the built-in operator that folds partial results, for an operator that transforms its input as it
    #: is read (``load``); None: this operator folds its own partials
    base: str | None = None

    # -- the load transform ---------------------------------------------------------------------
    @property
    def masks_nan(self) -> bool:
        """True where input elements are read through ``load`` (kernels/common.cuh's ``Op::load``): the
        nan-family's NaN -> identity, after elementwise steps for ``fusion.FusedOperator``; partial results
        are folded by ``partials`` as they are."""
        return self.base is not None

    @property
    def nan_mask_only(self) -> bool:
        """The built-in nan-family: ``load`` is the NaN mask and nothing else, so a backend may skip NaN its
        own way (the NumPy backend's fmin/fmax and piecewise passes)."""
        return self.builtin and self.base is not None

    def load(self, x):
        """Input elements as the operator reads them (NumPy, CPU): NaN -> the identity for the nan-family,
        ``x`` itself otherwise. Never applied to partial results: inf - inf stays NaN in nansum."""
        if self.base is None or x.dtype.kind != "f":
            return x
        return np.where(np.isnan(x), self.identity(x.dtype), x)

    @property
    def partials(self) -> "Operator":
        """The operator that folds partial results (already loaded): ``sum`` for ``nansum``."""
        return self if self.base is None else _BUILTINS[self.base]

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

# The nan-family (numpy.nansum, nanprod, nanmin, nanmax): NaN input reads as the identity, in the same
# pass as the reduction or scan (the kernels' load transform). Floating dtypes only: other dtypes hold no
# NaN, and multireduce.nansum & co. send them to the plain operator. Listed by ``operators()`` and usable by
# ``reduce``/``scan`` by name like the other built-ins. nanmin/nanmax of an all-NaN slice give the identity
# (+inf / -inf) here; multireduce.nanmin/nanmax finish that case as NumPy (a warning and NaN).
for _name, _base in (("nansum", "sum"), ("nanprod", "prod"), ("nanmin", "min"), ("nanmax", "max")):
    _plain = _BUILTINS[_base]
    _BUILTINS[_name] = Operator(_name, _plain.family, _plain.cpu, "mr::Nan" + _base.capitalize(), True, "f",
                                _plain.identity_value, builtin=True, _identity_fn=_plain._identity_fn, base=_base)
del _name, _base, _plain

_REGISTRY: dict[str, Operator] = dict(_BUILTINS)
#: ``registered(name, default)``: the Operator registered under ``name``, else ``default``; no checks (the
#: lookup of a repeated call, timed in nanoseconds: the dict's own bound method)
registered = _REGISTRY.get
_CHECKS: list[Callable[[Operator], None]] = []


def on_register(check: Callable[[Operator], None]) -> None:
    """Run ``check(op)`` on every new operator before it is registered; it raises to refuse the operator.
    Layers above (the GPU) add checks here, so this module needs none of them.

    Examples
    --------
    >>> import numpy as np, multireduce as mr
    >>> from multireduce.operators import on_register
    >>> def no_floats(op):
    ...     if "f" in op.kinds:
    ...         raise ValueError(f"{op.name}: floating-point operators are not allowed here")
    >>> on_register(no_floats)  # for the rest of the process
    >>> mr.register_operator("fmax_example", identity=-np.inf, cpu=np.fmax, commutative=True, kinds="f")
    Traceback (most recent call last):
    ...
    ValueError: fmax_example: floating-point operators are not allowed here
    """
    _CHECKS.append(check)


# ------------------------------------------------------------------------------------------------
# Checks at registration: samples, not proofs
# ------------------------------------------------------------------------------------------------
#: the dtype each kind is sampled in: the widest, where wrap-around and rounding are least likely to hide
#: a wrong identity
SAMPLE_DTYPES = {"b": np.bool_, "i": np.int64, "u": np.uint64, "f": np.float64, "c": np.complex128}
_SAMPLES = 64
#: float results may differ by this many units of the dtype's epsilon, relative to the operands'
#: magnitude, between the two groupings (a + b) + c and a + (b + c)
FLOAT_TOLERANCE_EPS = 16


def samples(dtype, n: int = _SAMPLES, seed: int = 0) -> np.ndarray:
    """``n`` reproducible values of ``dtype``: small ones, 0, 1, -1, and (integers) the full range."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    if dtype.kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        small = rng.integers(max(info.min, -1000), 1000, n // 2, dtype=dtype)
        wide = rng.integers(info.min, info.max, n - n // 2, dtype=dtype, endpoint=True)
        values = np.concatenate([small, wide])
    else:
        values = (rng.standard_normal(n) * 100).astype(dtype)
        if dtype.kind == "c":
            values = values + 1j * (rng.standard_normal(n) * 100).astype(dtype)
    values[:3] = [0, 1, -1] if dtype.kind in "ifc" else [0, 1, 2]
    return values


def _close(left: np.ndarray, right: np.ndarray, scale: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Elementwise: equal for integers and bools, within FLOAT_TOLERANCE_EPS * eps * scale for floats."""
    if dtype.kind in "biu":
        return left == right
    tol = FLOAT_TOLERANCE_EPS * np.finfo(dtype).eps * scale
    same = (left == right) | (np.isnan(left) & np.isnan(right))
    return same | (np.abs(left - right) <= tol)


def _first_failure(ok: np.ndarray):
    bad = np.flatnonzero(~np.asarray(ok, dtype=bool))
    return None if bad.size == 0 else int(bad[0])


def check_algebra(name: str, identity, combine: Callable, commutative: bool, kinds: str, where: str = "cpu") -> None:
    """Refuse an operator whose identity or associativity (and commutativity, if claimed) fails on samples
    of every kind it accepts. ``combine(a, b, dtype)`` applies the operator elementwise. An error raised by
    the CPU function is reported as a kind it does not accept; other sides' errors (a CUDA compile error)
    pass through as they are."""
    for kind in kinds:
        dtype = np.dtype(SAMPLE_DTYPES[kind])
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                e = np.array(identity).astype(dtype)[()]
                exact = bool(e == identity)
        except (TypeError, ValueError, OverflowError) as exc:
            exact, e = False, exc
        if not exact:
            raise TypeError(f"register_operator: argument 'identity' is {identity!r}, which does not convert to "
                            f"{dtype} exactly (operator {name!r} accepts {_dt.KIND_NAMES[kind]} dtypes; "
                            f"converted: {e!r}); narrow kinds= or register one operator per kind")
        a, b, c = samples(dtype, seed=1), samples(dtype, seed=2)[::-1], samples(dtype, seed=3)[::2].repeat(2)
        try:
            with np.errstate(all="ignore"):
                ex = combine(np.full_like(a, e), a, dtype)
                xe = combine(a, np.full_like(a, e), dtype)
                left = combine(combine(a, b, dtype), c, dtype)
                right = combine(a, combine(b, c, dtype), dtype)
                swapped = combine(b, a, dtype) if commutative else None
                ab = combine(a, b, dtype) if commutative else None
        except Exception as exc:
            if where != "cpu":
                raise
            raise TypeError(f"register_operator: operator {name!r} ({where}) fails on {dtype} values, a kind it "
                            f"accepts (kinds={kinds!r}); pass kinds= without {kind!r}: "
                            f"{type(exc).__name__}: {exc}") from None
        with np.errstate(all="ignore"):
            # an infinite identity (max: -inf) must give x exactly, so it adds no tolerance
            finite_e = np.abs(e) if np.isfinite(e) else 0
            scale = (np.abs(a) + finite_e).astype(np.float64) if dtype.kind in "fc" else None
            i = _first_failure(_close(ex, a, scale, dtype) & _close(xe, a, scale, dtype))
            if i is not None:
                raise ValueError(f"register_operator: argument 'identity' is {identity!r}, which is not an identity "
                                 f"of operator {name!r} ({where}) on {dtype}: with e={e!r}, x={a[i]!r}: "
                                 f"op(e, x) = {ex[i]!r}, op(x, e) = {xe[i]!r}, expected x")
            if dtype.kind in "fc":
                scale = np.abs(a) + np.abs(b) + np.abs(c) + np.abs(left)
                scale = np.where(np.isfinite(scale), scale, np.inf).astype(np.float64)
            i = _first_failure(_close(left, right, scale, dtype))
            if i is not None:
                tolerance = (f" (beyond the tolerance of {FLOAT_TOLERANCE_EPS} x eps relative to the operands)"
                             if dtype.kind in "fc" else "")
                raise ValueError(f"register_operator: operator {name!r} ({where}) is not associative on {dtype}"
                                 f"{tolerance}: a={a[i]!r}, b={b[i]!r}, c={c[i]!r}: op(op(a, b), c) = {left[i]!r} "
                                 f"but op(a, op(b, c)) = {right[i]!r}")
            if commutative:
                if dtype.kind in "fc":
                    scale = (np.abs(a) + np.abs(b) + np.abs(ab)).astype(np.float64)
                i = _first_failure(_close(ab, swapped, scale, dtype))
                if i is not None:
                    raise ValueError(f"register_operator: operator {name!r} ({where}) was declared commutative=True "
                                     f"but on {dtype}, a={a[i]!r}, b={b[i]!r}: op(a, b) = {ab[i]!r}, "
                                     f"op(b, a) = {swapped[i]!r}; pass commutative=False")


def _cpu_combine(cpu: Callable) -> Callable:
    # as the NumPy backend applies it: the result is held in the accumulator dtype
    return lambda a, b, dtype: np.asarray(cpu(a, b)).astype(dtype, copy=False)


_CUDA_FORBIDDEN = (";", "{", "}", "#", "//", "/*", "*/", "\\", "\"", "'")
_PAIRS = {"(": ")", "[": "]"}


def check_cuda_expression(cuda: str, name: str) -> None:
    """One C++ expression and nothing else: it is pasted between ``return static_cast<A>(`` and ``);``, so a
    ``;``, a brace, a preprocessor line, a comment, a string or an unbalanced bracket could end the
    function and add code of its own. Refused with the offending token named; needs no compiler."""
    for token in _CUDA_FORBIDDEN:
        if token in cuda:
            raise ValueError(f"register_operator: argument 'cuda' must be a single expression in a and b; "
                             f"{token!r} is not allowed (operator {name!r}); got {cuda!r}. Put helper functions "
                             "in cuda_preamble=")
    stack = []
    for ch in cuda:
        if ch in _PAIRS:
            stack.append(_PAIRS[ch])
        elif ch in ")]":
            if not stack or stack.pop() != ch:
                raise ValueError(f"register_operator: argument 'cuda' has an unbalanced {ch!r} (operator {name!r}); "
                                 f"got {cuda!r}")
    if stack:
        raise ValueError(f"register_operator: argument 'cuda' leaves {''.join(reversed(stack))!r} unclosed "
                         f"(operator {name!r}); got {cuda!r}")


def check_cuda_preamble(preamble: str, name: str) -> None:
    """Device code may hold braces, but they must close inside the preamble: one more ``}`` would end the
    ``mr_user`` namespace and let what follows out of it."""
    depth = 0
    for line in preamble.splitlines():
        code = line.split("//", 1)[0]
        if "/*" in code:
            raise ValueError(f"register_operator: argument 'cuda_preamble' may use // comments only "
                             f"(operator {name!r})")
        for ch in code:
            depth += {"{": 1, "}": -1}.get(ch, 0)
            if depth < 0:
                raise ValueError(f"register_operator: argument 'cuda_preamble' closes a brace it did not open "
                                 f"(operator {name!r}): {line.strip()!r}")
    if depth:
        raise ValueError(f"register_operator: argument 'cuda_preamble' leaves {depth} brace(s) open (operator {name!r})")


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
    replace : replace an operator registered under the same name.

    Checks at registration, before anything is registered (each failure raises, naming the values):

    - ``identity`` is a number that converts to every accepted kind, and ``op(e, x) == x == op(x, e)``;
    - associativity, ``op(op(a, b), c) == op(a, op(b, c))``: exact for integers and booleans, for floats
      within ``FLOAT_TOLERANCE_EPS`` (16) times the dtype's epsilon relative to the operands;
    - ``op(a, b) == op(b, a)`` where ``commutative=True`` is claimed;
    - ``cuda`` is a single expression (no ``;``, braces, ``#``, comments, strings; balanced brackets), and
      ``cuda_preamble`` closes every brace it opens;
    - on a machine with CuPy and a GPU, the CUDA expression is compiled and passes the same identity and
      associativity checks on the GPU.

    These are checks on 64 random samples per kind (in the widest dtype of the kind), not proofs: an
    operator can pass them and still be wrong on values the samples miss.

    Examples
    --------
    >>> import numpy as np, dask.array as da, multireduce as mr
    >>> op = mr.register_operator("bitor_example", identity=0, cpu=np.bitwise_or, cuda="a | b",
    ...                           commutative=True, kinds="biu")
    >>> x = np.array([1, 4, 2, 4], dtype=np.uint8)
    >>> print(mr.reduce(x, "bitor_example"))
    7
    >>> mr.scan(da.from_array(x, chunks=2), op).compute()
    array([1, 5, 7, 7], dtype=uint8)
    >>> mr.register_operator("bitor_example", identity=1, cpu=np.bitwise_or, commutative=True, kinds="iu",
    ...                      replace=True)
    Traceback (most recent call last):
    ...
    ValueError: register_operator: argument 'identity' is 1, which is not an identity of operator 'bitor_example' ...
    >>> mr.unregister_operator("bitor_example")
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
    if not isinstance(kinds, str) or not kinds or set(kinds) - set(_dt.KIND_NAMES):
        raise ValueError(
            f"register_operator: argument 'kinds' must be letters out of {''.join(_dt.KIND_NAMES)!r}; got {kinds!r}"
        )
    if not isinstance(cuda_preamble, str):
        raise TypeError(f"register_operator: argument 'cuda_preamble' must be a string; got {cuda_preamble!r}")
    if not isinstance(replace, bool):
        raise TypeError(f"register_operator: argument 'replace' must be True or False; got {replace!r}")
    if isinstance(identity, (str, bytes)) or not isinstance(identity, (numbers.Number, np.generic, np.ndarray)):
        raise TypeError(f"register_operator: argument 'identity' must be a number; got {identity!r}")
    if cuda is not None:
        check_cuda_expression(cuda, name)
        check_cuda_preamble(cuda_preamble, name)
    check_algebra(name, identity, _cpu_combine(cpu), commutative, kinds)
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
    for check in _CHECKS:
        check(op)
    _REGISTRY[name] = op
    return op


def unregister_operator(name: str) -> None:
    """Forget the operator registered under ``name`` (nothing happens if there is none).

    Parameters
    ----------
    name : str
        A name given to ``register_operator``; the built-in operators cannot be unregistered
        (ValueError).

    Examples
    --------
    >>> import numpy as np, multireduce as mr
    >>> op = mr.register_operator("gcd_example", identity=0, cpu=np.gcd, commutative=True, kinds="u")
    >>> "gcd_example" in mr.operators()
    True
    >>> mr.unregister_operator("gcd_example")
    >>> "gcd_example" in mr.operators()
    False
    """
    if name in _BUILTINS:
        raise ValueError(f"unregister_operator: {name!r} is a built-in operator")
    _REGISTRY.pop(name, None)


def operators() -> list[str]:
    """Names of every operator known to ``reduce`` and ``scan``, sorted: the built-in ones and those
    registered with ``register_operator``.

    Examples
    --------
    >>> import multireduce as mr
    >>> [name for name in mr.operators() if not name.startswith("nan")][:4]
    ['max', 'min', 'prod', 'sum']
    """
    return sorted(_REGISTRY)


def get_operator(op: str | Operator, *, caller: str = "multireduce") -> Operator:
    """The Operator registered under the name ``op`` (an Operator is returned as it is); an unknown name
    raises ValueError naming ``caller`` and the known operators.

    Examples
    --------
    >>> from multireduce.operators import get_operator
    >>> get_operator("prod").family
    'sum'
    >>> get_operator("median", caller="mr.reduce")
    Traceback (most recent call last):
    ...
    ValueError: mr.reduce: argument 'op' must be one of 'max', ...; got 'median'
    """
    if isinstance(op, Operator):
        return op
    if isinstance(op, str) and op in _REGISTRY:
        return _REGISTRY[op]
    known = ", ".join(repr(n) for n in operators())
    raise ValueError(
        f"{caller}: argument 'op' must be one of {known} or an operator registered with "
        f"multireduce.register_operator; got {op!r}"
    )
