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
// consecutive shared elements and each held vector, the block scans those folds, and warp 0 publishes
// the tile's fold (status AGGREGATE) and looks back over the preceding tiles 32 at a time until it
// meets one whose inclusive prefix is known (status PREFIX). Tiles before a row's first tile read as
// that row's carry-in with status PREFIX.
// Why the registers: a tile's life is mostly waiting in the look-back for the slowest of its
// predecessors to load, so the scan's speed follows the bytes an SM keeps in flight; shared memory
// alone caps that at ~220 KB, the register file adds ~60-90 KB (measured: docs/performance.md).
// Status words must be zero before the launch.
enum : unsigned { kStatusNone = 0, kStatusAggregate = 1, kStatusPrefix = 2 };

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
    for (unsigned backoff = 32;; backoff = backoff < 512 ? backoff * 2 : backoff) {
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
template <class T, class Out, int BLOCK, int ITEMS, int REG_ROWS>
struct LookbackTile {
  static constexpr int kShared = BLOCK * ITEMS;          // elements staged in shared memory
  static constexpr int kVector = 16 / (int)sizeof(T);    // elements per 16-byte input vector
  static constexpr int kHeld = REG_ROWS * BLOCK * kVector;  // elements held in registers
  static constexpr int kTile = kShared + kHeld;
  static constexpr bool kInPlace = sizeof(Out) == sizeof(T);  // results overwrite the input tile
  static constexpr int kInBytes = kShared * (int)sizeof(T);
  static constexpr int kBytes = kInPlace ? kInBytes : kInBytes + kShared * (int)sizeof(Out);
  static constexpr int kSharedPerSm = 227 * 1024;  // sm_90; on sm_80 fewer blocks fit than this says
  static constexpr int kByThreads = 2048 / BLOCK;
  static constexpr int kByShared = kSharedPerSm / (kBytes + 1024);
  // held vectors need registers: 4 per layer, plus a prefix per layer (an estimate ptxas then meets)
  static constexpr int kRegisters = 32 + (REG_ROWS ? 4 * REG_ROWS + (REG_ROWS + 1) * ((int)sizeof(Out) / 4) + 4 : 0);
  static constexpr int kByRegisters = 65536 / (BLOCK * kRegisters);
  static constexpr int kByStorage = kByShared < kByRegisters ? kByShared : kByRegisters;
  static constexpr int kBlocksPerSm = kByThreads < kByStorage ? kByThreads : (kByStorage > 0 ? kByStorage : 1);
  static_assert(kInBytes % 16 == 0 && (kShared * sizeof(Out)) % 16 == 0, "tiles are whole vectors");
  static_assert(REG_ROWS == 0 || (sizeof(Out) >= sizeof(T) && (kVector * sizeof(Out)) % 16 == 0),
                "held layers are stored as whole output vectors");
};

template <class T, class Acc, class Out, class Op, int BLOCK, int ITEMS, int REG_ROWS = 0>
__global__ void __launch_bounds__(BLOCK, (LookbackTile<T, Out, BLOCK, ITEMS, REG_ROWS>::kBlocksPerSm))
    scan_lookback(const T* in, Out* out, index_t K, index_t tiles_per_row, Acc identity, const Acc* carry_in,
                  unsigned long long* words, int inclusive) {
  using Shape = LookbackTile<T, Out, BLOCK, ITEMS, REG_ROWS>;
  constexpr int kTile = Shape::kTile, kShared = Shape::kShared, kVector = Shape::kVector;
  constexpr int kParts = 1 + REG_ROWS;
  __shared__ __align__(16) unsigned char raw[Shape::kBytes];
  __shared__ Acc scratch[kParts * (BLOCK / kWarp)];
  __shared__ Acc tile_exclusive;
  Op op;
  const int t = threadIdx.x;
  const LookbackState<Acc> st{words};

  // tiles in block order, as CUB's scans: blocks of a grid are dispatched in index order, so every
  // tile a block waits for belongs to a block already running (a ticket counter cost ~2 %: an atomic
  // round trip before the loads could start)
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
  if (t < kWarp) {
    const Acc row_carry = carry_in ? carry_in[row] : identity;
    Acc before;
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
