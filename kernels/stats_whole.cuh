// multireduce: stats_whole (kernels/stats.cuh) alone, as a module of its own (kernels.STANDALONE): the
// fast path of a whole-array statistic loads these few kernels on a first call, not the whole
// statistics module, whose load time grows with its kernel count.
#pragma once
#include "stats.cuh"
