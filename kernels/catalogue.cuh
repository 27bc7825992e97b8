// multireduce: the catalogue kernels (``algorithm=`` other than "auto"), for their own compilation unit;
// the production kernels are in multireduce.cuh and never wait for these to compile.
#pragma once
#include "common.cuh"
#include "block.cuh"
#include "catalogue/reduce.cuh"
#include "catalogue/scan.cuh"
