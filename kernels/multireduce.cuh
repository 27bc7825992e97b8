// multireduce: every kernel, for one compilation unit (CuPy's RawModule and CI's nvcc check).
#pragma once
#include "common.cuh"
#include "block.cuh"
#include "reduce.cuh"
#include "scan.cuh"
