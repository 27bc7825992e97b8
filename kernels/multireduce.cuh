// multireduce: the production kernels (what algorithm="auto" launches), for one compilation unit (CuPy's
// RawModule and CI's nvcc check); the catalogue is catalogue.cuh.
#pragma once
#include "common.cuh"
#include "block.cuh"
#include "reduce.cuh"
#include "scan.cuh"
