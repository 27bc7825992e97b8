// multireduce: scan kernels. Every one keeps element order (op(earlier, later)), so non-commutative
// operators scan exactly.
//
// Data is viewed as ``rows`` rows of ``K`` contiguous elements (one row for a 1-d scan); no tile
// crosses a row. This file holds what algorithm="auto" launches: ``scan_lookback``, one pass with
// decoupled look-back and a carry-in per row read from device memory, and ``scan_columns``. The
// catalogue's block scans are in catalogue/scan.cuh.
#pragma once
#include "block.cuh"

namespace mr {

// ---- production: one pass with decoupled look-back ---------------------------------------------
// One block per tile; tile i is block i. A tile is BLOCK x ITEMS elements copied into shared memory with
// asynchronous 16-byte copies (cp.async: no registers spent on bytes in flight) followed by REG_ROWS
// layers of one 16-byte vector per thread loaded into registers. Each thread folds its ITEMS
// consecutive shared elements and each held vector, the block scans those folds, and warp 0 finds the
// fold of everything before the tile in one of two ways (the DETERMINISTIC template flag):
// - free (``look_back``): publish the tile's fold (status AGGREGATE), look back over the preceding
//   tiles 32 at a time until one whose inclusive prefix is known (status PREFIX), then publish PREFIX.
//   Which predecessors have published depends on timing, so float sums differ run to run; exact
//   combines (integers wrap exactly, min/max ignore order) give the same bits anyway.
// - fixed (``look_back_fixed``): every tile folds values that are fixed functions of the input, with
//   fixed trees, so the bits never depend on timing (see there).
// Tiles before a row's first tile read as that row's carry-in.
// Why the registers: a tile's life is mostly waiting in the look-back for the slowest of its
// predecessors to load, so the scan's speed follows the bytes an SM keeps in flight; shared memory
// alone caps that at ~220 KB, the register file adds ~60-90 KB (measured: docs/performance.md).
// Correctness needs no co-residency: a tile waits only for tiles of lower block index, and blocks are
// dispatched in index order (as CUB's scans assume), so every tile waited for is running or done and
// publishes without waiting for a later one. Any occupancy >= 1 block per SM is safe (sm_80 included).
// Status words must be zero before the launch.
enum : unsigned { kStatusNone = 0, kStatusAggregate = 1, kStatusPrefix = 2, kStatusWindow = 3 };

// Tile descriptors: the status and the value in one word written and read whole, so publishing needs
// no fence and a reader never sees a status without its value. Accumulators of up to 4 bytes share an
// 8-byte word with the status; 8-byte ones a 16-byte word (vector accesses, as CUB's tile state).
__device__ __forceinline__ void store_word(unsigned long long* p, unsigned long long status, unsigned long long bits) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(status), "l"(bits) : "memory");
}
__device__ __forceinline__ void load_word(const unsigned long long* p, unsigned long long* status,
                                          unsigned long long* bits) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(*status), "=l"(*bits) : "l"(p) : "memory");
}

template <class Acc>
struct LookbackState {
  static_assert(sizeof(Acc) <= 8, "accumulators are at most 8 bytes");
  static constexpr bool kNarrow = sizeof(Acc) <= 4;
  static constexpr int kWordsPerTile = kNarrow ? 1 : 2;  // in 8-byte units
  unsigned long long* words;  // kWordsPerTile per tile, zeroed before the launch

  __device__ __forceinline__ void publish(index_t tile, const Acc& v, unsigned status) const {
    if constexpr (kNarrow) {
      store_volatile(words + tile, (static_cast<unsigned long long>(status) << 32) | bits_as<unsigned>(v));
    } else {
      store_word(words + 2 * tile, status, bits_as<unsigned long long>(v));
    }
  }

  // One read of tile ``j``'s descriptor: its status, and its value when the status is not NONE.
  __device__ __forceinline__ unsigned poll(index_t j, Acc* v) const {
    unsigned long long status, bits;
    if constexpr (kNarrow) {
      const unsigned long long w = load_volatile(words + j);
      status = w >> 32;
      bits = w & 0xffffffffull;
    } else {
      load_word(words + 2 * j, &status, &bits);
    }
    union {
      unsigned long long u;
      Acc a;
    } decoded;
    decoded.u = bits;
    *v = decoded.a;
    return static_cast<unsigned>(status);
  }
};

// Warp 0 only. Returns the fold of every element before ``tile`` (carry-in included) in all lanes.
// A window of 32 predecessors is read at once; only the tiles nearer than the nearest PREFIX in it
// are waited for (a slower tile further back does not hold this one up).
// A polling warp sleeps 32 ns after its first miss, doubling up to this cap. Measured (H200, 2^26-2^28):
// caps of 128-256 ns ran the fixed look-back ~1 % faster than 512 and the free one the same; 1024 and
// spinning without sleep were slower (docs/profiles.md).
constexpr unsigned kBackoffCapNs = 128;

template <class Acc, class Op>
__device__ Acc look_back(const LookbackState<Acc>& st, index_t tile, index_t row_first_tile, Acc row_carry,
                         Acc identity, Op op) {
  const int lane = threadIdx.x % kWarp;
  Acc exclusive = identity;
  for (index_t newest = tile - 1;; newest -= kWarp) {
    const index_t j = newest - lane;  // lane 0 is the nearest tile
    const bool before_row = j < row_first_tile;
    Acc v = row_carry;
    unsigned status = before_row ? static_cast<unsigned>(kStatusPrefix) : st.poll(j, &v);
    unsigned prefix_lanes;
    for (unsigned backoff = 32;; backoff = backoff < kBackoffCapNs ? backoff * 2 : backoff) {
      prefix_lanes = __ballot_sync(kFullMask, status == kStatusPrefix);
      const unsigned needed = prefix_lanes ? ((prefix_lanes & (0u - prefix_lanes)) << 1) - 1u : kFullMask;
      const unsigned missing = __ballot_sync(kFullMask, status == kStatusNone) & needed;
      if (!missing) break;
      __nanosleep(backoff);  // spinning warps would otherwise crowd L2
      if ((missing >> lane) & 1u) status = st.poll(j, &v);
    }
    const int stop = prefix_lanes ? __ffs(prefix_lanes) - 1 : kWarp;
    if (lane > stop) v = identity;
    // lanes hold tiles newest-first: fold with the higher (older) lane on the left
#pragma unroll
    for (int offset = 1; offset < kWarp; offset <<= 1) {
      Acc older = shfl_down(v, offset);
      if (lane + offset < kWarp) v = op(older, v);
    }
    exclusive = op(shfl_idx(v, 0), exclusive);
    if (prefix_lanes) return exclusive;
  }
}

// Warp 0 only, every lane. Lanes with ``need`` wait until tile ``j``'s descriptor is published (any
// status: in the fixed look-back each tile publishes exactly once, so the first value seen is final) and
// return its value; the other lanes return ``fallback``. One backoff for the warp.
template <class Acc>
__device__ __forceinline__ Acc wait_published(const LookbackState<Acc>& st, bool need, index_t j, Acc fallback) {
  Acc v = fallback;
  bool waiting = need && st.poll(j, &v) == kStatusNone;
  for (unsigned backoff = 32; __any_sync(kFullMask, waiting); backoff = backoff < kBackoffCapNs ? backoff * 2 : backoff) {
    __nanosleep(backoff);  // spinning warps would otherwise crowd L2
    if (waiting) waiting = st.poll(j, &v) == kStatusNone;
  }
  return need ? v : fallback;
}

// Deterministic look-back. Tiles of a row form windows of 32 tiles, and windows super-windows of 32
// windows (1024 tiles), aligned at the row's first tile. Each tile publishes exactly one descriptor:
//   - not last in its window: AGGREGATE, its own fold A, before it waits for anything;
//   - last in its window (not in its super-window): WINDOW, the window's fold W = E0 op A, published as
//     soon as its own window's aggregates are in (never after another window: no chain of windows);
//   - last in its super-window: PREFIX, P = P' op (E1 op W), the fold of the row up to its end;
// (a row's last tile publishes nothing: no later tile of its row reads it) where, for a tile,
//   E0 = tree of the AGGREGATEs of the tiles before it in its window,
//   E1 = tree of the WINDOWs of the windows before its own in its super-window,
//   P' = the PREFIX of the previous super-window's last tile (the row's carry-in for the first),
// and the tile's exclusive prefix is (P' op E1) op E0. "tree" is warp_reduce_ordered over the 32 lanes,
// lane l holding the l-th value in order and missing lanes the identity: its shape is fixed, so E0, E1
// are fixed functions of the values read. Each value read is published once and waited for until
// published, so by induction over tiles every descriptor, and so every output, is a fixed function of
// the input: the same bits on every run. Non-commutative operators are folded in element order.
// Cost: the only chain is one PREFIX per 1024 tiles (~24 hops at 2^28 float32, each covering ~45 MB of
// input, far more than an SM pipeline holds in flight); the free look-back also waits for the loads
// of the tiles nearest to it, here those of up to two windows back.
template <class Acc, class Op>
__device__ Acc look_back_fixed(const LookbackState<Acc>& st, index_t tile, index_t row_first_tile,
                               index_t tiles_per_row, Acc row_carry, Acc aggregate, Acc identity, Op op) {
  const int lane = threadIdx.x % kWarp;
  const index_t p = tile - row_first_tile;
  const int in_window = static_cast<int>(p % kWarp);
  const index_t window = p / kWarp;
  const int in_super = static_cast<int>(window % kWarp);
  const index_t super = window / kWarp;
  const bool publishes = p + 1 < tiles_per_row;
  const bool window_end = in_window == kWarp - 1, super_end = window_end && in_super == kWarp - 1;
  if (!window_end && lane == 0 && publishes) st.publish(tile, aggregate, kStatusAggregate);

  // level 0: lane l < in_window reads the l-th tile of this window
  const index_t window_first = row_first_tile + window * kWarp;
  // level 1: lane l < in_super reads the l-th window of this super-window (at its last tile); lane 31,
  // never a window lane (in_super <= 31), reads the previous super-window's PREFIX
  const bool need_window = lane < in_super;
  const bool need_prefix = lane == kWarp - 1 && super > 0;
  const index_t j1 = need_prefix ? row_first_tile + super * kWarp * kWarp - 1
                                 : row_first_tile + (super * kWarp + lane) * kWarp + (kWarp - 1);
  Acc e0, v1;
  if (window_end) {  // its window's fold goes out before anything further back is waited for
    e0 = warp_reduce_ordered(wait_published(st, lane < in_window, window_first + lane, identity), op);
    e0 = shfl_idx(e0, 0);
    if (!super_end && lane == 0 && publishes) st.publish(tile, op(e0, aggregate), kStatusWindow);
    v1 = wait_published(st, need_window || need_prefix, j1, identity);
  } else {  // both levels at once: one wait instead of two round trips
    Acc v0 = identity;
    v1 = identity;
    bool wait0 = lane < in_window, wait1 = need_window || need_prefix;
    if (wait0) wait0 = st.poll(window_first + lane, &v0) == kStatusNone;
    if (wait1) wait1 = st.poll(j1, &v1) == kStatusNone;
    for (unsigned backoff = 32; __any_sync(kFullMask, wait0 || wait1); backoff = backoff < kBackoffCapNs ? backoff * 2 : backoff) {
      __nanosleep(backoff);
      if (wait0) wait0 = st.poll(window_first + lane, &v0) == kStatusNone;
      if (wait1) wait1 = st.poll(j1, &v1) == kStatusNone;
    }
    if (lane >= in_window) v0 = identity;
    e0 = shfl_idx(warp_reduce_ordered(v0, op), 0);
  }
  const Acc before_super = super > 0 ? shfl_idx(v1, kWarp - 1) : row_carry;
  if (!need_window) v1 = identity;
  const Acc e1 = shfl_idx(warp_reduce_ordered(v1, op), 0);
  if (super_end && lane == 0 && publishes) st.publish(tile, op(before_super, op(e1, op(e0, aggregate))), kStatusPrefix);
  return op(op(before_super, e1), e0);
}

// ---- thread-block clusters (sm_90): the tiles of a cluster look back once -------------------------------
// A cluster of CLUSTER consecutive tiles of one row: every block writes its aggregate into every block of
// the cluster (distributed shared memory) and the cluster synchronizes; the first block folds the CLUSTER
// aggregates, runs the fixed look-back over the row's clusters (one descriptor each, the same windows and
// trees as for tiles: look_back_fixed), hands the fold before the cluster to every block, and the cluster
// synchronizes again. Block r's exclusive prefix is then (before the cluster) op aggregate_0 op ... op
// aggregate_{r-1}: fixed functions of the input, the same bits on every run, element order kept. Measured
// on an H200 (float32 2^28 / 2^30: 0.852 / 0.843 -> 0.886 / 0.893 x copy, docs/profiles.md): one look-back
// through L2 per cluster instead of one per tile. Every thread of the block calls it; it returns the
// tile's exclusive prefix in every thread, and leaves the cluster free of remote accesses (a block may
// exit after it).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
__device__ __forceinline__ void cluster_barrier() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// *local's place in the shared memory of block ``rank`` of this cluster gets ``v``
template <class Acc>
__device__ __forceinline__ void store_in_block(Acc* local, unsigned rank, const Acc& v) {
  static_assert(sizeof(Acc) == 4 || sizeof(Acc) == 8, "4- or 8-byte accumulators");
  const unsigned here = static_cast<unsigned>(__cvta_generic_to_shared(local));
  unsigned there;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(there) : "r"(here), "r"(rank));
  if constexpr (sizeof(Acc) == 4) {
    asm volatile("st.shared::cluster.u32 [%0], %1;" ::"r"(there), "r"(bits_as<unsigned>(v)) : "memory");
  } else {
    asm volatile("st.shared::cluster.u64 [%0], %1;" ::"r"(there), "l"(bits_as<unsigned long long>(v)) : "memory");
  }
}

template <class Acc, class Op, int CLUSTER>
__device__ __forceinline__ Acc cluster_before_tile(const LookbackState<Acc>& st, index_t tile, index_t tiles_per_row,
                                                   const Acc* carry_in, const Acc& aggregate, Acc identity, Op op) {
  __shared__ Acc peer[CLUSTER];   // peer[r]: the aggregate of the cluster's block r
  __shared__ Acc cluster_before;  // the fold of the row before the cluster
  const int t = threadIdx.x;
  const unsigned block = static_cast<unsigned>(tile);  // a grid's block index fits 32 bits
  const unsigned rank = block % CLUSTER;                 // a 1-d cluster's blocks: consecutive indices
  if (t < CLUSTER) store_in_block(&peer[rank], static_cast<unsigned>(t), aggregate);
  cluster_barrier();
  const index_t row = block / static_cast<unsigned>(tiles_per_row), clusters_per_row = tiles_per_row / CLUSTER;
  const index_t cluster = block / CLUSTER, row_first_cluster = row * clusters_per_row;
  if (rank == 0 && t < kWarp) {
    Acc all = peer[0];
#pragma unroll
    for (int r = 1; r < CLUSTER; ++r) all = op(all, peer[r]);
    const Acc row_carry = carry_in ? carry_in[row] : identity;
    Acc before = look_back_fixed(st, cluster, row_first_cluster, clusters_per_row, row_carry, all, identity, op);
    if (cluster == row_first_cluster) before = row_carry;  // the carry itself, no identity folded in (keeps -0.0)
    if (t < CLUSTER) store_in_block(&cluster_before, static_cast<unsigned>(t), before);
  }
  cluster_barrier();
  Acc before = cluster_before;
  for (unsigned r = 0; r < rank; ++r) before = op(before, peer[r]);
  return before;
}
#else
template <class Acc, class Op, int CLUSTER>
__device__ __forceinline__ Acc cluster_before_tile(const LookbackState<Acc>&, index_t, index_t, const Acc*, const Acc&,
                                                   Acc identity, Op) {
  __trap();
  return identity;
}
#endif

// ---- asynchronous global -> shared copies (sm_80+; a plain copy through registers before) ---------
__device__ __forceinline__ void copy_16_async(void* shared_dst, const void* global_src) {
#if __CUDA_ARCH__ >= 800
  unsigned dst;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(dst) : "l"(shared_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(global_src) : "memory");
#else
  *reinterpret_cast<uint4*>(shared_dst) = __ldg(reinterpret_cast<const uint4*>(global_src));
#endif
}
// Waits for every asynchronous copy this thread has issued.
__device__ __forceinline__ void copies_wait_all() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// Shared memory of one scan_lookback block, and so how many blocks an SM holds (for launch bounds).
// A tile is BLOCK x ITEMS elements in shared memory followed by REG_ROWS layers of one 16-byte vector
// per thread held in registers: the register file then carries part of the tile, so that more bytes
// are in flight per SM than shared memory alone can hold.
template <class T, class Acc, class Out, int BLOCK, int ITEMS, int REG_ROWS>
struct LookbackTile {
  static constexpr int kShared = BLOCK * ITEMS;          // elements staged in shared memory
  static constexpr int kVector = 16 / (int)sizeof(T);    // elements per 16-byte input vector
  static constexpr int kHeld = REG_ROWS * BLOCK * kVector;  // elements held in registers
  static constexpr int kTile = kShared + kHeld;
  static constexpr bool kInPlace = sizeof(Out) == sizeof(T);  // results overwrite the input tile
  static constexpr int kInBytes = kShared * (int)sizeof(T);
  static constexpr int kBytes = kInPlace ? kInBytes : kInBytes + kShared * (int)sizeof(Out);
  // A compile-time hint for __launch_bounds__ (it shapes ptxas's register budget), per target: the
  // launcher asks the driver for the real blocks per SM (cupy_backend.scan_occupancy).
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 800 || __CUDA_ARCH__ == 870)
  static constexpr int kSharedPerSm = 163 * 1024;
#elif defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 890 || __CUDA_ARCH__ >= 1200)
  static constexpr int kSharedPerSm = 99 * 1024;
#else
  static constexpr int kSharedPerSm = 227 * 1024;  // sm_90, sm_100
#endif
  static constexpr int kByThreads = 2048 / BLOCK;
  static constexpr int kByShared = kSharedPerSm / (kBytes + 1024);
  // held vectors need registers: 4 per layer, plus a prefix per layer (an estimate ptxas then meets)
  // (a float32 scan accumulated in float64 holds its prefixes in 8 bytes)
  static constexpr int kPrefixWords = (sizeof(Acc) == 8 && sizeof(Out) < 8 ? 8 : (int)sizeof(Out)) / 4;
  static constexpr int kRegisters = 32 + (REG_ROWS ? 4 * REG_ROWS + (REG_ROWS + 1) * kPrefixWords + 4 : 0);
  static constexpr int kByRegisters = 65536 / (BLOCK * kRegisters);
  static constexpr int kByStorage = kByShared < kByRegisters ? kByShared : kByRegisters;
  static constexpr int kBlocksPerSm = kByThreads < kByStorage ? kByThreads : (kByStorage > 0 ? kByStorage : 1);
  static_assert(kInBytes % 16 == 0 && (kShared * sizeof(Out)) % 16 == 0, "tiles are whole vectors");
  static_assert(REG_ROWS == 0 || (sizeof(Out) >= sizeof(T) && (kVector * sizeof(Out)) % 16 == 0),
                "held layers are stored as whole output vectors");
};

// One tile of scan_lookback / scan_lookback_clustered (below): CLUSTER = 1, each tile looks back for
// itself; CLUSTER > 1 (sm_90 thread-block clusters, the fixed look-back), the cluster's tiles hand their
// aggregates to each other in distributed shared memory and one of them looks back for the cluster.
template <class T, class Acc, class Out, class Op, int BLOCK, int ITEMS, int REG_ROWS, bool DETERMINISTIC, int CLUSTER>
__device__ __forceinline__ void lookback_tile(const T* in, Out* out, index_t K, index_t tiles_per_row, Acc identity,
                                              const Acc* carry_in, unsigned long long* words, int inclusive) {
  using Shape = LookbackTile<T, Acc, Out, BLOCK, ITEMS, REG_ROWS>;
  constexpr int kTile = Shape::kTile, kShared = Shape::kShared, kVector = Shape::kVector;
  constexpr int kParts = 1 + REG_ROWS;
  // 128-byte aligned: with the clustered kernel's few shared words placed before it, a tile at a 48-byte
  // offset made the asynchronous copies into it cost 7 % of the scan's bandwidth (H200, docs/profiles.md)
  __shared__ __align__(128) unsigned char raw[Shape::kBytes];
  __shared__ Acc scratch[kParts * (BLOCK / kWarp)];
  __shared__ Acc tile_exclusive;
  Op op;
  const int t = threadIdx.x;
  const LookbackState<Acc> st{words};

  // tiles in block order, as CUB's scans: blocks of a grid are dispatched in index order, so every
  // tile a block waits for belongs to a block already running (a ticket counter cost ~2 %: an atomic
  // round trip before the loads could start)
  // (a 32-bit division here measured 0.5 % faster for float32, but made ptxas spill 8 bytes in float64's
  // fixed look-back and take 71 registers instead of 64 in int32 -> int64's: 1-2 % slower, nvcc 13.0)
  const index_t tile = blockIdx.x;
  const index_t row = tile / tiles_per_row, tile_in_row = tile % tiles_per_row;
  const index_t first = tile_in_row * kTile;
  const int valid = (int)(K - first < kTile ? K - first : kTile);
  const index_t base = row * K + first;
  T* s_in = reinterpret_cast<T*>(raw);
  Out* s_out = Shape::kInPlace ? reinterpret_cast<Out*>(raw) : reinterpret_cast<Out*>(raw + Shape::kInBytes);
  // held layer r, element e of thread t is tile element kShared + (r * BLOCK + t) * kVector + e
  union Vector {
    uint4 bits;
    T e[kVector];
  };
  Vector held[REG_ROWS > 0 ? REG_ROWS : 1];
  auto held_at = [&](int r, int e) { return kShared + (r * BLOCK + t) * kVector + e; };

  // load: asynchronous 16-byte copies into shared memory (vector j of the tile by thread j % BLOCK) and
  // coalesced 16-byte loads into registers, when the tile is whole and aligned; element by element
  // otherwise (a row's last tile, rows not 16-byte aligned)
  const bool whole_in = valid == kTile && reinterpret_cast<unsigned long long>(in + base) % 16 == 0;
  if (whole_in) {
    constexpr int kVectors = Shape::kInBytes / 16;
    const uint4* src = reinterpret_cast<const uint4*>(in + base);
#pragma unroll
    for (int j = t; j < kVectors; j += BLOCK) copy_16_async(reinterpret_cast<uint4*>(raw) + j, src + j);
#pragma unroll
    for (int r = 0; r < REG_ROWS; ++r) held[r].bits = __ldg(src + kVectors + r * BLOCK + t);
    copies_wait_all();
  } else {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int j = k * BLOCK + t;
      if (j < valid) s_in[j] = in[base + j];
    }
#pragma unroll
    for (int r = 0; r < REG_ROWS; ++r)
#pragma unroll
      for (int e = 0; e < kVector; ++e)
        if (held_at(r, e) < valid) held[r].e[e] = in[base + held_at(r, e)];
  }
  __syncthreads();

  // pass 1: each thread folds its ITEMS consecutive elements in shared memory (one accumulator, not
  // ITEMS: registers decide how many tiles an SM holds) and each of its held vectors
  const int mine = t * ITEMS;
  Acc part[kParts];
  part[0] = identity;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    if (mine + k < valid) part[0] = op(part[0], load_as<Acc, Op>(s_in[mine + k]));
  }
#pragma unroll
  for (int r = 0; r < REG_ROWS; ++r) {
    part[1 + r] = identity;
#pragma unroll
    for (int e = 0; e < kVector; ++e)
      if (held_at(r, e) < valid) part[1 + r] = op(part[1 + r], load_as<Acc, Op>(held[r].e[e]));
  }
  Acc aggregate;
  block_exclusive_scan_parts<BLOCK>(part, op, identity, scratch, &aggregate);

  // the fold of everything before this tile
  if constexpr (CLUSTER > 1) {
    const Acc before =
        cluster_before_tile<Acc, Op, CLUSTER>(st, tile, tiles_per_row, carry_in, aggregate, identity, op);
    if (t == 0) tile_exclusive = before;
  } else if (t < kWarp) {
    const Acc row_carry = carry_in ? carry_in[row] : identity;
    Acc before;
    if constexpr (DETERMINISTIC) {
      before = look_back_fixed(st, tile, row * tiles_per_row, tiles_per_row, row_carry, aggregate, identity, op);
      if (tile_in_row == 0) before = row_carry;  // the carry itself, no identity folded in (keeps -0.0)
      if (t == 0) tile_exclusive = before;
    } else {
      if (tile_in_row == 0) {
        before = row_carry;
      } else {
        if (t == 0) st.publish(tile, aggregate, kStatusAggregate);
        before = look_back(st, tile, row * tiles_per_row, row_carry, identity, op);
      }
      if (t == 0) {
        Acc through = op(before, aggregate);
        if (tile_in_row + 1 < tiles_per_row) st.publish(tile, through, kStatusPrefix);
        tile_exclusive = before;
      }
    }
  }
  __syncthreads();
  const Acc before = tile_exclusive;
  const bool whole_out = valid == kTile && reinterpret_cast<unsigned long long>(out + base) % 16 == 0;

  // pass 2: rescan the same elements, seeded. Held vectors are stored straight from registers
  // (coalesced: thread t's vector of layer r sits next to thread t+1's).
#pragma unroll
  for (int r = 0; r < REG_ROWS; ++r) {
    constexpr int kOutVectors = kVector * (int)sizeof(Out) / 16;
    union {
      uint4 bits[kOutVectors > 0 ? kOutVectors : 1];
      Out e[kVector];
    } result;
    Acc running = op(before, part[1 + r]);
#pragma unroll
    for (int e = 0; e < kVector; ++e) {
      const Acc next = op(running, load_as<Acc, Op>(held[r].e[e]));
      result.e[e] = convert<Out>(inclusive ? next : running);
      running = next;
    }
    if (whole_out) {
      uint4* dst = reinterpret_cast<uint4*>(out + base + kShared) + (r * BLOCK + t) * kOutVectors;
#pragma unroll
      for (int k = 0; k < kOutVectors; ++k) dst[k] = result.bits[k];
    } else {
#pragma unroll
      for (int e = 0; e < kVector; ++e)
        if (held_at(r, e) < valid) out[base + held_at(r, e)] = result.e[e];
    }
  }
  // shared part: each thread rewrites only the slots it has just read, so in-place results are safe
  Acc running = op(before, part[0]);
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int j = mine + k;
    if (j < valid) {
      Acc next = op(running, load_as<Acc, Op>(s_in[j]));
      s_out[j] = convert<Out>(inclusive ? next : running);
      running = next;
    }
  }
  __syncthreads();
  if (whole_out) {
    constexpr int kVectors = kShared * sizeof(Out) / 16;
    const uint4* src = reinterpret_cast<const uint4*>(s_out);
    uint4* dst = reinterpret_cast<uint4*>(out + base);
#pragma unroll
    for (int j = t; j < kVectors; j += BLOCK) dst[j] = src[j];
  } else {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int j = k * BLOCK + t;
      if (j < valid) out[base + j] = s_out[j];
    }
  }
}

template <class T, class Acc, class Out, class Op, int BLOCK, int ITEMS, int REG_ROWS = 0, bool DETERMINISTIC = false>
__global__ void __launch_bounds__(BLOCK, (LookbackTile<T, Acc, Out, BLOCK, ITEMS, REG_ROWS>::kBlocksPerSm))
    scan_lookback(const T* in, Out* out, index_t K, index_t tiles_per_row, Acc identity, const Acc* carry_in,
                  unsigned long long* words, int inclusive) {
  lookback_tile<T, Acc, Out, Op, BLOCK, ITEMS, REG_ROWS, DETERMINISTIC, 1>(in, out, K, tiles_per_row, identity,
                                                                         carry_in, words, inclusive);
}

// The fixed look-back with tiles in thread-block clusters of CLUSTER (sm_90 and later; the launcher asks for
// it only there: tuning.Policy.scan_cluster). ``tiles_per_row`` is a whole number of clusters (the row's
// last ones may hold no element); one descriptor per cluster. Below sm_90 it compiles to a trap.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define MR_CLUSTER_DIMS(n)
#else
#define MR_CLUSTER_DIMS(n) __cluster_dims__(n, 1, 1)
#endif
template <class T, class Acc, class Out, class Op, int BLOCK, int ITEMS, int REG_ROWS, int CLUSTER>
__global__ void MR_CLUSTER_DIMS(CLUSTER)
    __launch_bounds__(BLOCK, (LookbackTile<T, Acc, Out, BLOCK, ITEMS, REG_ROWS>::kBlocksPerSm))
    scan_lookback_clustered(const T* in, Out* out, index_t K, index_t tiles_per_row, Acc identity,
                            const Acc* carry_in, unsigned long long* words, int inclusive) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();
#else
  lookback_tile<T, Acc, Out, Op, BLOCK, ITEMS, REG_ROWS, true, CLUSTER>(in, out, K, tiles_per_row, identity, carry_in,
                                                                      words, inclusive);
#endif
}
#undef MR_CLUSTER_DIMS

// ---- one axis with inner > 1: one thread per (outer, inner) column, in order ---------------------
template <class T, class Acc, class Out, class Op>
__global__ void scan_columns(const T* in, Out* out, index_t outer, index_t K, index_t inner, Acc identity,
                             const Acc* carry_in, int inclusive) {
  Op op;
  const index_t columns = outer * inner;
  for (index_t c = (index_t)blockIdx.x * blockDim.x + threadIdx.x; c < columns; c += (index_t)gridDim.x * blockDim.x) {
    const index_t o = c / inner, i = c % inner;
    const index_t at = o * K * inner + i;
    Acc running = carry_in ? carry_in[c] : identity;
    for (index_t k = 0; k < K; ++k) {
      Acc next = op(running, load_as<Acc, Op>(in[at + k * inner]));
      out[at + k * inner] = convert<Out>(inclusive ? next : running);
      running = next;
    }
  }
}

}  // namespace mr
