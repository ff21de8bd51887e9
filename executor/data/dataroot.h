/* dataroot.h - where a job's data.path may lead: inside the agent's data
 * roots only. The worker resolves the path here before any loader opens it.
 *
 * Roots: the agent's --data-root (TRAINYARD_DATA_ROOT of its workers; the
 * worker's working directory when none is set) and the system dataset
 * directory (DATAROOT_SYSTEM). A relative path resolves under the first
 * root, an absolute one as it is; either way it is refused when it has a
 * ".." component or when its realpath (every symlink followed) leaves the
 * roots. A directory (IDX sets) is also refused when one of its entries is
 * a symlink that leads out.
 *
 * defines: data_path_confine, data_path_has_dotdot */
#ifndef TRAINYARD_DATAROOT_H
#define TRAINYARD_DATAROOT_H

#include <stddef.h>

#define DATAROOT_SYSTEM "/usr/share/datasets"

/* 1 when the path has a ".." component. */
int data_path_has_dotdot(const char *path);

/* Resolves path (a job's data.path, non-empty) against root (NULL or "" =
 * the working directory) into out (its realpath). 0, or -1 with a message
 * for the job's reason in err (naming data.path and the roots). */
int data_path_confine(const char *path, const char *root, char *out, size_t cap, char *err, size_t errlen);

#endif
