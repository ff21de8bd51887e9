/* fuzz_memfile.h - the fuzz input as a file for loaders that take paths: an
 * anonymous memfd reached through /proc/self/fd/N (a regular file, no disk).
 * Header-only, for the tests/fuzz targets. */
#ifndef TRAINYARD_FUZZ_MEMFILE_H
#define TRAINYARD_FUZZ_MEMFILE_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct memfile {
    int fd;
    char path[64];
} memfile;

/* Opens (once) a memfd named name; aborts when the kernel refuses. */
static inline void memfile_open(memfile *f, const char *name) {
    f->fd = memfd_create(name, MFD_CLOEXEC);
    if (f->fd < 0) {
        perror("memfd_create");
        abort();
    }
    snprintf(f->path, sizeof f->path, "/proc/self/fd/%d", f->fd);
}

/* Replaces the file's contents with data (n bytes). */
static inline void memfile_set(memfile *f, const void *data, size_t n) {
    if (ftruncate(f->fd, 0) < 0) abort();
    size_t off = 0;
    while (off < n) {
        ssize_t w = pwrite(f->fd, (const char *)data + off, n - off, (off_t)off);
        if (w <= 0) abort();
        off += (size_t)w;
    }
}

#endif
