// Row-major matrix products through the BLAS that LibTorch itself calls (libblas.so.3: OpenBLAS
// when installed, see measure/environment.cpp). The tiles of fused attention are small
// products between vector passes; calling sgemm_ directly costs no dispatch per tile.
#pragma once

#include <cstdint>

extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc);
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc);
// MKL's C entry (pip's libtorch_cpu exports it; its lower-case names are the Fortran one, which
// takes a pointer); absent from other BLAS libraries, so weak: null there.
int MKL_Set_Num_Threads_Local(int threads) __attribute__((weak));
}

namespace opfuse::cpu {

// C[m×n] = alpha · op(A) · op(B) + beta · C, all row-major with leading dimensions lda, ldb,
// ldc; op(X) is Xᵀ when its flag is set. A row-major matrix is its transpose to column-major
// BLAS, so this is Cᵀ = op(B)ᵀ · op(A)ᵀ: the operands swap, the flags stay.
template <typename A>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, A alpha, const A* a, int64_t lda, const A* b,
          int64_t ldb, A beta, A* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
  const int M = int(m), N = int(n), K = int(k), LDA = int(lda), LDB = int(ldb), LDC = int(ldc);
  if constexpr (sizeof(A) == sizeof(float))
    sgemm_(&tb, &ta, &N, &M, &K, &alpha, b, &LDB, a, &LDA, &beta, c, &LDC);
  else
    dgemm_(&tb, &ta, &N, &M, &K, &alpha, b, &LDB, a, &LDA, &beta, c, &LDC);
}

// One BLAS thread for the products of one parallel task while it lives. MKL's results depend on
// the threads it may use even where it runs on one: inside at::parallel_for under
// at::set_num_threads(2), attention's float64 tiles came out 1e-15 off the one-thread run's
// (Sapphire Rapids; MKL_CBWR=AUTO,STRICT gave the same bits). Pinned to one, a task's products
// are the same whatever the thread count. Other BLAS libraries have no such switch.
class OneBlasThread {
 public:
  OneBlasThread() : previous_(MKL_Set_Num_Threads_Local ? MKL_Set_Num_Threads_Local(1) : 0) {}
  ~OneBlasThread() {
    if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(previous_);
  }
  OneBlasThread(const OneBlasThread&) = delete;
  OneBlasThread& operator=(const OneBlasThread&) = delete;

 private:
  int previous_;
};

}  // namespace opfuse::cpu
