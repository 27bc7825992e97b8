import cupy, numpy as np
rows, tiles, K = 5, 1, 75
w = cupy.full((rows, tiles + 1, K), -7, dtype=np.int64)
slots = np.arange(rows * K, dtype=np.int64).reshape(rows, K)
rb = K * 8
cupy.cuda.runtime.memcpy2DAsync(w.data.ptr, (tiles + 1) * rb, slots.ctypes.data, rb, rb, rows,
                                cupy.cuda.runtime.memcpyHostToDevice, cupy.cuda.get_current_stream().ptr)
got = cupy.asnumpy(w[:, 0])
print("memcpy2DAsync slots right:", bool((got == slots).all()), "rows right:", [bool((got[r] == slots[r]).all()) for r in range(rows)])
