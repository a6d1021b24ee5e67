/* One thread pool for everything: OpenMP for our loops, and the OpenMP build of OpenBLAS,
 * which joins the same pool and runs single-threaded inside our parallel regions. */
#include "meshtrain/kernels.h"

#include <cblas.h>
#include <omp.h>

void mt_kernels_set_threads(int threads)
{
    if (threads < 1)
        threads = 1;
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
}

void mt_kernels_set_blas_threads(int threads)
{
    openblas_set_num_threads(threads < 1 ? 1 : threads);
}
