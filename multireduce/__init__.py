"""multireduce: reductions and scans of arrays too large for one GPU, through Dask.

>>> import numpy as np, multireduce as mr
>>> int(mr.sum(np.arange(10)))
45
"""

from .api import cumprod, cumsum, max, mean, min, prod, reduce, scan, sum
from .catalogue import algorithms
from .statistics import (all, any, argmax, argmin, count_nonzero, nanargmax, nanargmin, nancumprod, nancumsum,
                         nanmax, nanmean, nanmin, nanprod, nanstd, nansum, nanvar, segment_reduce, segment_scan, std,
                         var)
from .groupby import groupby_reduce
from .operators import Operator, operators, register_operator, unregister_operator
from .persist import persist

__version__ = "0.1.0"

__all__ = [
    "sum", "prod", "min", "max", "mean", "reduce",
    "cumsum", "cumprod", "scan",
    "argmax", "argmin", "nanargmax", "nanargmin", "var", "std", "nanvar", "nanstd", "nanmean",
    "nansum", "nanprod", "nanmin", "nanmax", "nancumsum", "nancumprod", "any", "all", "count_nonzero",
    "segment_reduce", "segment_scan", "groupby_reduce", "persist",
    "register_operator", "unregister_operator", "operators", "Operator", "algorithms",
    "__version__",
]
