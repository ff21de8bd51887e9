/* mpi_allreduce.c - OpenMPI's MPI_Allreduce (float32 sum, in place) timed
 * exactly as comm_bench times ours: per size, 3 + 5 warm-up calls (the
 * last 5 size the repetitions: about --rep-ms each, rank 0's count
 * broadcast), REPS repetitions between barriers, the median per call.
 *
 *   mpirun -np 2 mpi_allreduce [--reps 7] [--rep-ms 150] BYTES...
 *
 * Prints one JSON object per size from rank 0 (gbps: algorithm bandwidth). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size, reps = 7, rep_ms = 150, nsizes = 0;
    long sizes[16];
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = (int)strtol(argv[++i], &end, 10);
        else if (!strcmp(argv[i], "--rep-ms") && i + 1 < argc)
            rep_ms = (int)strtol(argv[++i], &end, 10);
        else if (nsizes < 16)
            sizes[nsizes++] = strtol(argv[i], &end, 10);
        if (!end || *end) {
            if (rank == 0)
                fprintf(stderr, "usage: mpi_allreduce [--reps R] [--rep-ms MS] BYTES...\n");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (reps < 1 || reps > 31)
        reps = 7;
    long maxn = 0;
    for (int s = 0; s < nsizes; s++)
        maxn = sizes[s] / 4 > maxn ? sizes[s] / 4 : maxn;
    float *b = NULL;
    if (posix_memalign((void **)&b, 64, (size_t)maxn * sizeof(float)) != 0)
        MPI_Abort(MPI_COMM_WORLD, 1);
    for (long i = 0; i < maxn; i++)
        b[i] = 1e-3f * (float)(i % 97);
    for (int s = 0; s < nsizes; s++) {
        int n = (int)(sizes[s] / 4);
        for (int i = 0; i < 3; i++)
            MPI_Allreduce(MPI_IN_PLACE, b, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < 5; i++)
            MPI_Allreduce(MPI_IN_PLACE, b, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double per = (MPI_Wtime() - t0) / 5;
        int k = (int)(rep_ms / 1000.0 / per);
        k = k < 3 ? 3 : k > 100000 ? 100000 : k;
        MPI_Bcast(&k, 1, MPI_INT, 0, MPI_COMM_WORLD);
        double t[31];
        for (int r = 0; r < reps; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double a = MPI_Wtime();
            for (int i = 0; i < k; i++)
                MPI_Allreduce(MPI_IN_PLACE, b, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            MPI_Barrier(MPI_COMM_WORLD);
            t[r] = (MPI_Wtime() - a) / k;
        }
        qsort(t, (size_t)reps, sizeof t[0], cmp_double);
        double med = t[reps / 2];
        if (rank == 0) {
            printf("{\"impl\":\"openmpi\",\"ranks\":%d,\"bytes\":%ld,\"iters\":%d,\"us\":%.2f,\"us_min\":%.2f,"
                   "\"gbps\":%.3f}\n",
                   size, (long)n * 4, k, med * 1e6, t[0] * 1e6, (double)n * 4 / med / 1e9);
            fflush(stdout);
        }
    }
    free(b);
    MPI_Finalize();
    return 0;
}
