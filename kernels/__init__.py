"""multireduce's CUDA C++ sources (``*.cuh``), installed as the package ``multireduce._cuda``.

CuPy compiles them at run time (``multireduce/kernels.py``); CI compiles every instantiation with nvcc.
"""
