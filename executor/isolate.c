/* isolate.c - teams kept apart on a node (see isolate.h): uids from a
 * range, private mounts, job directories and cgroups (v1 and v2). */
#include "isolate.h"
#include "../common/util.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/bpf.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

enum { CTL_MEMORY = 0, CTL_CPU = 1, CTL_PIDS = 2, CTL_DEVICES = 3 };
static const char *const ctl_names[ISO_CTLS] = {"memory", "cpu", "pids", "devices"};

#define NVIDIA_MAJOR 195           /* /dev/nvidiaN, Documentation/admin-guide/devices.txt */
#define KILL_ROUNDS 100            /* x 10 ms: how long leftovers get to die */
#define CTR_CG_PREFIX "trainyard-ctr-" /* + agent pid: image tasks' container parents, per hierarchy */
#define CTR_OOM_MARGIN_MB 4        /* the parent's limit under the container's (a 2 MiB huge
                                    * page charge must meet the parent's first) */

/* ---------------------------------------------------------------- options and sizes */

void iso_options_default(iso_options *o) {
    memset(o, 0, sizeof *o);
    o->mode = ISO_AUTO;
    o->uid_first = 200000;
    o->uid_last = 299999;
    snprintf(o->task_root, sizeof o->task_root, "/var/lib/trainyard-tasks");
    snprintf(o->lock_dir, sizeof o->lock_dir, "/run/trainyard/uids");
    o->pids_max = 4096;
}

void iso_format_mb(int64_t mb, char *out, size_t outlen) {
    if (mb >= 1048576 && mb % 1048576 == 0) snprintf(out, outlen, "%lld TiB", (long long)(mb / 1048576));
    else if (mb >= 1024 && mb % 1024 == 0) snprintf(out, outlen, "%lld GiB", (long long)(mb / 1024));
    else if (mb >= 1024) snprintf(out, outlen, "%.1f GiB", (double)mb / 1024.0);
    else snprintf(out, outlen, "%lld MiB", (long long)mb);
}

/* ---------------------------------------------------------------- small file helpers */

/* Writes s to dir/file: 0, or -1 (errno). */
static int write_file(const char *dir, const char *file, const char *s) {
    char p[PATH_MAX + 64];
    if (sfmt(p, sizeof p, "%s/%s", dir, file) < 0) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int fd = open(p, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t n = strlen(s);
    ssize_t w = write(fd, s, n);
    int e = errno;
    close(fd);
    if (w != (ssize_t)n) {
        errno = w < 0 ? e : EIO;
        return -1;
    }
    return 0;
}

/* The number after "key " in dir/file (lines "key value"): >= 0, or -1. */
static long long read_keyed(const char *dir, const char *file, const char *key) {
    char p[PATH_MAX + 64];
    if (sfmt(p, sizeof p, "%s/%s", dir, file) < 0) return -1;
    size_t len = 0;
    char *s = file_read_all(p, 1 << 16, &len);
    if (!s) return -1;
    long long v = -1;
    size_t kl = strlen(key);
    for (char *line = s; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        if (strncmp(line, key, kl) == 0 && line[kl] == ' ') v = strtoll(line + kl + 1, NULL, 10);
        line = nl ? nl + 1 : NULL;
    }
    free(s);
    return v;
}

static int pid_alive(long pid) { return pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM); }

/* ---------------------------------------------------------------- cgroups */

/* Every pid in dir/cgroup.procs gets SIGKILL until none is left (or the
 * rounds run out). v2's cgroup.kill first where the kernel has it. */
static void cg_kill_all(const char *dir) {
    write_file(dir, "cgroup.kill", "1"); /* v2, Linux 5.14+; ENOENT elsewhere */
    char p[PATH_MAX + 32];
    if (sfmt(p, sizeof p, "%s/cgroup.procs", dir) < 0) return;
    for (int round = 0; round < KILL_ROUNDS; round++) {
        size_t len = 0;
        char *s = file_read_all(p, 1 << 20, &len);
        if (!s) return;
        int n = 0;
        for (char *q = s; *q;) {
            char *end;
            long pid = strtol(q, &end, 10);
            if (end == q) break;
            if (pid > 0) {
                kill((pid_t)pid, SIGKILL);
                n++;
            }
            q = end;
            while (*q == '\n') q++;
        }
        free(s);
        if (!n) return;
        usleep(10 * 1000);
    }
}

static void grave_add(isolator *iso, const char *dir) {
    iso->grave = xrealloc(iso->grave, (size_t)(iso->n_grave + 1) * sizeof *iso->grave);
    iso->grave[iso->n_grave++] = xstrdup(dir);
}

void iso_sweep(isolator *iso) {
    for (int i = 0; i < iso->n_grave;) {
        cg_kill_all(iso->grave[i]);
        if (rmdir(iso->grave[i]) == 0 || errno == ENOENT) {
            free(iso->grave[i]);
            iso->grave[i] = iso->grave[--iso->n_grave];
        } else {
            i++;
        }
    }
}

/* Removes a parent cgroup of an agent that is gone: its task cgroups
 * (killing what is left in them), then itself. */
static void cg_remove_stale(const char *base) {
    DIR *d = opendir(base);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (strncmp(e->d_name, "task-", 5) != 0) continue;
            char p[PATH_MAX + 300];
            if (sfmt(p, sizeof p, "%s/%s", base, e->d_name) < 0) continue;
            cg_kill_all(p);
            rmdir(p);
        }
        closedir(d);
    }
    rmdir(base);
}

/* In parent (a cgroup directory): removes trainyard-agent-PID children
 * whose agent is gone. */
static void cg_sweep_agents(const char *parent) {
    DIR *d = opendir(parent);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        long pid = 0;
        if (strncmp(e->d_name, "trainyard-agent-", 16) != 0 || parse_long(e->d_name + 16, 1, 1L << 30, &pid) < 0 ||
            pid == getpid() || pid_alive(pid))
            continue;
        char p[PATH_MAX + 300];
        if (sfmt(p, sizeof p, "%s/%s", parent, e->d_name) == 0) cg_remove_stale(p);
    }
    closedir(d);
}

/* The cgroup path of this process in the hierarchy named by `want`
 * (a v1 controller, or "" for the v2 line "0::"). 0, or -1. */
static int own_cgroup(const char *want, char *out, size_t outlen) {
    size_t len = 0;
    char *s = file_read_all("/proc/self/cgroup", 1 << 16, &len);
    if (!s) return -1;
    int rc = -1;
    for (char *line = s; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (c1 && c2) {
            *c2 = '\0';
            const char *ctls = c1 + 1;
            int match = 0;
            if (!want[0]) {
                match = strcmp(line, "0:") == 0 || (line[0] == '0' && ctls[0] == '\0');
            } else {
                char tmp[256];
                snprintf(tmp, sizeof tmp, "%s", ctls);
                for (char *save = NULL, *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save))
                    if (strcmp(t, want) == 0) match = 1;
            }
            if (match && sfmt(out, outlen, "%s", c2 + 1) == 0) {
                rc = 0;
                break;
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    free(s);
    return rc;
}

/* The mount point of the hierarchy of `want` (a v1 controller; "" for
 * cgroup2) from /proc/self/mountinfo, with the mount's root (the part of
 * the hierarchy it shows). 0, or -1. */
static int cg_mount(const char *want, char *mnt, size_t mntlen, char *root, size_t rootlen) {
    size_t len = 0;
    char *s = file_read_all("/proc/self/mountinfo", 1 << 20, &len);
    if (!s) return -1;
    int rc = -1;
    for (char *line = s; line && *line && rc < 0;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        /* ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS */
        char *f[6] = {0};
        int nf = 0;
        char *dash = strstr(line, " - ");
        if (dash) *dash = '\0';
        char *save = NULL;
        for (char *t = strtok_r(line, " ", &save); t && nf < 6; t = strtok_r(NULL, " ", &save))
            f[nf++] = t;
        if (nf == 6 && dash) {
            char *rest = dash + 3, *s2 = NULL;
            char *fstype = strtok_r(rest, " ", &s2);
            char *src = fstype ? strtok_r(NULL, " ", &s2) : NULL;
            char *sopts = src ? strtok_r(NULL, " ", &s2) : NULL;
            int match = 0;
            if (fstype && !want[0]) {
                match = strcmp(fstype, "cgroup2") == 0;
            } else if (fstype && sopts && strcmp(fstype, "cgroup") == 0) {
                char *s3 = NULL;
                for (char *o = strtok_r(sopts, ",", &s3); o; o = strtok_r(NULL, ",", &s3))
                    if (strcmp(o, want) == 0) match = 1;
            }
            if (match && sfmt(mnt, mntlen, "%s", f[4]) == 0 && sfmt(root, rootlen, "%s", f[3]) == 0) rc = 0;
        }
        line = nl ? nl + 1 : NULL;
    }
    free(s);
    return rc;
}

/* The directory of this process's cgroup in the hierarchy of `want`. */
static int cg_own_dir(const char *want, char *out, size_t outlen) {
    char mnt[PATH_MAX] = "", root[PATH_MAX] = "", own[PATH_MAX] = "";
    if (cg_mount(want, mnt, sizeof mnt, root, sizeof root) < 0 || own_cgroup(want, own, sizeof own) < 0) return -1;
    const char *rel = own;
    size_t rl = strlen(root);
    if (strcmp(root, "/") != 0 && strncmp(own, root, rl) == 0) rel = own + rl; /* the mount shows a subtree */
    if (strcmp(rel, "/") == 0) rel = "";
    return sfmt(out, outlen, "%s%s", mnt, rel);
}

static int file_has_word(const char *path, const char *word) {
    size_t len = 0;
    char *s = file_read_all(path, 1 << 12, &len);
    if (!s) return 0;
    int found = 0;
    char *save = NULL;
    for (char *t = strtok_r(s, " \n", &save); t; t = strtok_r(NULL, " \n", &save))
        if (strcmp(t, word) == 0) found = 1;
    free(s);
    return found;
}

/* Every cgroup hierarchy's mount point (v1 and v2), at most max: their
 * number. */
static int cg_all_mounts(char (*mnt)[PATH_MAX], int max) {
    size_t len = 0;
    char *s = file_read_all("/proc/self/mountinfo", 1 << 20, &len);
    if (!s) return 0;
    int n = 0;
    for (char *line = s; line && *line && n < max;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        /* ID PARENT MAJ:MIN ROOT MOUNTPOINT ... - FSTYPE ... */
        char *dash = strstr(line, " - ");
        if (dash) {
            *dash = '\0';
            char *save = NULL, *f = NULL;
            int nf = 0;
            for (char *t = strtok_r(line, " ", &save); t && nf < 5; t = strtok_r(NULL, " ", &save), nf++) f = t;
            char *s2 = NULL, *fstype = strtok_r(dash + 3, " ", &s2);
            if (nf == 5 && fstype && (strcmp(fstype, "cgroup") == 0 || strcmp(fstype, "cgroup2") == 0) &&
                sfmt(mnt[n], PATH_MAX, "%s", f) == 0)
                n++;
        }
        line = nl ? nl + 1 : NULL;
    }
    free(s);
    return n;
}

/* Removes the cgroup dir and its children (depth levels below it),
 * killing what is left in each; what cannot go yet waits in the grave. */
static void cg_remove_tree(isolator *iso, const char *dir, int depth) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while (depth > 0 && (e = readdir(d))) {
        char p[PATH_MAX + 300];
        if (e->d_type != DT_DIR || e->d_name[0] == '.' || sfmt(p, sizeof p, "%s/%s", dir, e->d_name) < 0) continue;
        cg_remove_tree(iso, p, depth - 1);
    }
    closedir(d);
    cg_kill_all(dir);
    if (rmdir(dir) < 0 && errno != ENOENT) {
        if (iso) grave_add(iso, dir);
        else log_warn("cannot remove cgroup %s: %s", dir, strerror(errno));
    }
}

/* The container parents (CTR_CG_PREFIX PID) of agents that are gone. */
static void ctr_cg_sweep(void) {
    char mnt[16][PATH_MAX];
    int n = cg_all_mounts(mnt, 16);
    for (int i = 0; i < n; i++) {
        DIR *d = opendir(mnt[i]);
        if (!d) continue;
        struct dirent *e;
        while ((e = readdir(d))) {
            long pid = 0;
            size_t pl = strlen(CTR_CG_PREFIX);
            if (strncmp(e->d_name, CTR_CG_PREFIX, pl) != 0 || parse_long(e->d_name + pl, 1, 1L << 30, &pid) < 0 ||
                pid == getpid() || pid_alive(pid))
                continue;
            char p[PATH_MAX + 300];
            if (sfmt(p, sizeof p, "%s/%s", mnt[i], e->d_name) == 0) cg_remove_tree(NULL, p, 2);
        }
        closedir(d);
    }
}

/* cgroup v1: a parent per hierarchy under the agent's own cgroup. */
static void cg_setup_v1(isolator *iso) {
    ctr_cg_sweep();
    for (int c = 0; c < ISO_CTLS; c++) {
        char own[PATH_MAX];
        if (cg_own_dir(ctl_names[c], own, sizeof own) < 0) continue;
        cg_sweep_agents(own);
        if (sfmt(iso->cg_base[c], sizeof iso->cg_base[c], "%s/trainyard-agent-%d", own, (int)getpid()) < 0) continue;
        if (mkdir(iso->cg_base[c], 0755) < 0 && errno != EEXIST) {
            log_warn("cgroup v1 %s: cannot make %s: %s", ctl_names[c], iso->cg_base[c], strerror(errno));
            continue;
        }
        iso->have_ctl[c] = 1;
    }
    if (iso->have_ctl[CTL_MEMORY] || iso->have_ctl[CTL_CPU] || iso->have_ctl[CTL_PIDS] || iso->have_ctl[CTL_DEVICES])
        iso->cg = ISO_CG_V1;
}

/* cgroup v2 (unrun on the development machine, which has v1 controllers
 * only; docs/reliability.md says so). The "no internal processes" rule: the
 * agent moves itself into OWN/trainyard-agent-PID/agent, so that its parent
 * can hand the memory, cpu and pids controllers to the task cgroups beside
 * it. Needs OWN to be delegated to the agent alone (the systemd unit's
 * Delegate=yes). */
static void cg_setup_v2(isolator *iso) {
    char own[PATH_MAX], base[PATH_MAX], leaf[PATH_MAX + 16], ctl[PATH_MAX + 32];
    if (cg_own_dir("", own, sizeof own) < 0) return;
    if (sfmt(ctl, sizeof ctl, "%s/cgroup.controllers", own) < 0 || !file_has_word(ctl, "memory")) return;
    cg_sweep_agents(own);
    if (sfmt(base, sizeof base, "%s/trainyard-agent-%d", own, (int)getpid()) < 0 ||
        sfmt(leaf, sizeof leaf, "%s/agent", base) < 0)
        return;
    char pid[24];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    if ((mkdir(base, 0755) < 0 && errno != EEXIST) || (mkdir(leaf, 0755) < 0 && errno != EEXIST) ||
        write_file(leaf, "cgroup.procs", pid) < 0) {
        log_warn("cgroup v2: cannot set up %s: %s", base, strerror(errno));
        return;
    }
    /* OWN now holds no process of ours: hand the controllers down two levels */
    if (write_file(own, "cgroup.subtree_control", "+memory +cpu +pids") < 0 ||
        write_file(base, "cgroup.subtree_control", "+memory +cpu +pids") < 0) {
        log_warn("cgroup v2: cannot enable memory, cpu and pids under %s: %s (is the agent alone in a delegated "
                 "cgroup?)", own, strerror(errno));
        return;
    }
    snprintf(iso->cg_base[0], sizeof iso->cg_base[0], "%s", base);
    iso->have_ctl[CTL_MEMORY] = iso->have_ctl[CTL_CPU] = iso->have_ctl[CTL_PIDS] = 1;
    iso->have_ctl[CTL_DEVICES] = 1; /* a BPF program per task cgroup (iso_bpf_deny_gpus) */
    iso->cg = ISO_CG_V2;
}

/* ---------------------------------------------------------------- GPUs under cgroup v2 */

/* cgroup v2 has no devices files: a BPF_PROG_TYPE_CGROUP_DEVICE program
 * attached to the cgroup decides each open (and mknod) of a device node.
 * Ours denies the character devices NVIDIA_MAJOR:minor of the GPUs the
 * task does not hold and allows everything else (the v1 rules' effect):
 *
 *   r2 = ctx->access_type & 0xffff    the device type
 *   if r2 != BPF_DEVCG_DEV_CHAR goto allow
 *   r3 = ctx->major; if r3 != 195 goto allow
 *   r4 = ctx->minor; if r4 == m_i goto deny    (for each denied minor)
 * allow: r0 = 1; exit
 * deny:  r0 = 0; exit */
static struct bpf_insn insn(uint8_t code, uint8_t dst, uint8_t src, int16_t off, int32_t imm) {
    struct bpf_insn i;
    memset(&i, 0, sizeof i);
    i.code = code;
    i.dst_reg = dst & 0xf;
    i.src_reg = src & 0xf;
    i.off = off;
    i.imm = imm;
    return i;
}

int iso_bpf_deny_gpus(const char *cgdir, const int *minors, int n, char *err, size_t errlen) {
    if (n <= 0) return 0;
    if (n > ISO_MAX_GPUS) n = ISO_MAX_GPUS;
    struct bpf_insn prog[16 + ISO_MAX_GPUS];
    int k = 0;
    const int allow_at = 6 + n; /* index of "r0 = 1" */
    prog[k++] = insn(BPF_LDX | BPF_W | BPF_MEM, 2, 1, (int16_t)offsetof(struct bpf_cgroup_dev_ctx, access_type), 0);
    prog[k++] = insn(BPF_ALU | BPF_AND | BPF_K, 2, 0, 0, 0xffff);
    prog[k++] = insn(BPF_JMP | BPF_JNE | BPF_K, 2, 0, (int16_t)(allow_at - 3), BPF_DEVCG_DEV_CHAR);
    prog[k++] = insn(BPF_LDX | BPF_W | BPF_MEM, 3, 1, (int16_t)offsetof(struct bpf_cgroup_dev_ctx, major), 0);
    prog[k++] = insn(BPF_JMP | BPF_JNE | BPF_K, 3, 0, (int16_t)(allow_at - 5), NVIDIA_MAJOR);
    prog[k++] = insn(BPF_LDX | BPF_W | BPF_MEM, 4, 1, (int16_t)offsetof(struct bpf_cgroup_dev_ctx, minor), 0);
    for (int i = 0; i < n; i++, k++) /* to "r0 = 0", two after allow_at */
        prog[k] = insn(BPF_JMP | BPF_JEQ | BPF_K, 4, 0, (int16_t)(allow_at + 2 - k - 1), minors[i]);
    prog[k++] = insn(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 1); /* allow_at */
    prog[k++] = insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0);
    prog[k++] = insn(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 0); /* deny */
    prog[k++] = insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0);

    char log[4096] = "";
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.prog_type = BPF_PROG_TYPE_CGROUP_DEVICE;
    a.insns = (uint64_t)(uintptr_t)prog;
    a.insn_cnt = (uint32_t)k;
    a.license = (uint64_t)(uintptr_t) "Apache-2.0";
    a.log_buf = (uint64_t)(uintptr_t)log;
    a.log_size = sizeof log;
    a.log_level = 1;
    int pfd = (int)syscall(SYS_bpf, BPF_PROG_LOAD, &a, sizeof a);
    if (pfd < 0) {
        snprintf(err, errlen, "loading the GPU device filter: %s%s%.200s", strerror(errno), log[0] ? ": " : "", log);
        return -1;
    }
    int cfd = open(cgdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (cfd < 0) {
        snprintf(err, errlen, "cannot open %s: %s", cgdir, strerror(errno));
        close(pfd);
        return -1;
    }
    memset(&a, 0, sizeof a);
    a.target_fd = (uint32_t)cfd;
    a.attach_bpf_fd = (uint32_t)pfd;
    a.attach_type = BPF_CGROUP_DEVICE;
    int rc = (int)syscall(SYS_bpf, BPF_PROG_ATTACH, &a, sizeof a);
    if (rc < 0) snprintf(err, errlen, "attaching the GPU device filter to %s: %s", cgdir, strerror(errno));
    close(cfd);
    close(pfd); /* the cgroup holds the program */
    return rc < 0 ? -1 : 0;
}

/* ---------------------------------------------------------------- memory of the node */

/* A number of bytes in a one-line file (memory.limit_in_bytes, memory.max):
 * MiB, or 0 for none ("max", absent, or a v1 "unlimited" near 2^63). */
static int64_t limit_file_mb(const char *dir, const char *file) {
    char p[PATH_MAX + 64];
    if (sfmt(p, sizeof p, "%s/%s", dir, file) < 0) return 0;
    size_t len = 0;
    char *s = file_read_all(p, 64, &len);
    if (!s) return 0;
    long long b = strtoll(s, NULL, 10);
    free(s);
    return b > 0 && b < (1LL << 60) ? (int64_t)(b >> 20) : 0;
}

static int64_t node_memory_mb(void) {
    int64_t total = 0;
    long long kb = read_keyed("/proc", "meminfo", "MemTotal:");
    if (kb > 0) total = kb / 1024;
    /* a limit on the agent's own cgroup lowers what its tasks can have */
    char own[PATH_MAX];
    int64_t lim = 0;
    if (cg_own_dir("memory", own, sizeof own) == 0) lim = limit_file_mb(own, "memory.limit_in_bytes");
    else if (cg_own_dir("", own, sizeof own) == 0) lim = limit_file_mb(own, "memory.max");
    if (lim > 0 && (total == 0 || lim < total)) total = lim;
    /* kept for the node's own processes: a tenth, at most 4 GiB */
    int64_t keep = total / 10 < 4096 ? total / 10 : 4096;
    return total - keep;
}

/* ---------------------------------------------------------------- init */

/* Can this process make a private mount namespace, and mount a /proc that
 * hides other users? Tried in a child, which exits with a bit set for each. */
static int probe_mounts(const char *scratch) {
    pid_t pid = fork();
    if (pid < 0) return 0;
    if (pid == 0) {
        int r = 0;
        if (unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
            mount(scratch, scratch, NULL, MS_BIND, NULL) == 0) {
            r |= 1;
            if (mount("proc", scratch, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2") == 0) r |= 2;
        }
        _exit(r);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 0;
}

int iso_init(isolator *iso, const iso_options *o, const char *exe, char *err, size_t errlen) {
    memset(iso, 0, sizeof *iso);
    iso->opt = *o;
    iso->exe_fd = -1;
    for (int i = 0; i < ISO_MAX_JOBS; i++) iso->jobs[i].lock_fd = -1;
    int root = geteuid() == 0;
    if (o->mode == ISO_USER && !root) {
        snprintf(err, errlen, "--isolation user needs the agent to run as root (it runs as uid %u)",
                 (unsigned)geteuid());
        return -1;
    }
    if (o->uid_first == 0 || o->uid_last < o->uid_first) {
        snprintf(err, errlen, "--task-uids: an empty range or one that includes root");
        return -1;
    }
    /* before the cgroups: a v2 agent moves itself into a leaf with no limit */
    iso->memory_mb = o->memory_mb > 0 ? o->memory_mb : node_memory_mb();
    if (root) {
        /* cgroups: v1 where its memory controller is mounted, else v2 */
        char mnt[PATH_MAX], r[PATH_MAX];
        if (cg_mount("memory", mnt, sizeof mnt, r, sizeof r) == 0) cg_setup_v1(iso);
        else cg_setup_v2(iso);
    }
    if (!root) {
        snprintf(iso->reason, sizeof iso->reason,
                 "the agent runs as uid %u, not root: every task runs as uid %u and can read the others' files, "
                 "tokens and processes; nothing limits a task's memory",
                 (unsigned)geteuid(), (unsigned)geteuid());
        return 0;
    }
    if (o->mode == ISO_NONE) {
        snprintf(iso->reason, sizeof iso->reason,
                 "--isolation none: every task runs as the agent (root) and can read the others' files and tokens");
        return 0;
    }
    /* the job directories: TASK_ROOT/agent-PID, traversable (0711) but not listable */
    if (mkdir_p(o->task_root, 0711) < 0 || chmod(o->task_root, 0711) < 0) {
        snprintf(err, errlen, "cannot make the task directory %s: %s (choose one with --task-dir, or run tasks "
                 "without isolation: --isolation none)", o->task_root, strerror(errno));
        return -1;
    }
    /* the job directories of agents that are gone */
    DIR *d = opendir(o->task_root);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            long pid = 0;
            if (strncmp(e->d_name, "agent-", 6) != 0 || parse_long(e->d_name + 6, 1, 1L << 30, &pid) < 0 ||
                pid_alive(pid))
                continue;
            char p[PATH_MAX + 300];
            if (sfmt(p, sizeof p, "%s/%s", o->task_root, e->d_name) == 0) rm_tree(p);
        }
        closedir(d);
    }
    if (sfmt(iso->agent_dir, sizeof iso->agent_dir, "%s/agent-%d", o->task_root, (int)getpid()) < 0 ||
        (mkdir(iso->agent_dir, 0711) < 0 && errno != EEXIST) || chmod(iso->agent_dir, 0711) < 0) {
        snprintf(err, errlen, "cannot make %s: %s", iso->agent_dir, strerror(errno));
        return -1;
    }
    if (mkdir_p(o->lock_dir, 0700) < 0) {
        snprintf(err, errlen, "cannot make the uid lock directory %s: %s (--isolation none runs tasks without "
                 "isolation)", o->lock_dir, strerror(errno));
        return -1;
    }
    /* the /dev/shm directories of jobs whose uid no agent holds any more
     * (an agent killed with -9 left them) */
    DIR *shm = opendir("/dev/shm");
    if (shm) {
        struct dirent *e;
        while ((e = readdir(shm))) {
            const char *dash = strrchr(e->d_name, '-');
            long uid = 0;
            if (strncmp(e->d_name, "trainyard-job", 13) != 0 || !dash ||
                parse_long(dash + 1, (long)o->uid_first, (long)o->uid_last, &uid) < 0)
                continue;
            char lock[PATH_MAX + 32], p[PATH_MAX + 300];
            if (sfmt(lock, sizeof lock, "%s/%ld", o->lock_dir, uid) < 0 ||
                sfmt(p, sizeof p, "/dev/shm/%s", e->d_name) < 0)
                continue;
            int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
            if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0) rm_tree(p);
            if (fd >= 0) close(fd);
        }
        closedir(shm);
    }
    iso->exe_fd = open(exe, O_PATH | O_CLOEXEC);
    if (iso->exe_fd < 0) {
        snprintf(err, errlen, "cannot open %s: %s", exe, strerror(errno));
        return -1;
    }
    int m = probe_mounts(iso->agent_dir);
    iso->mount_ns = (m & 1) != 0;
    iso->hidepid = (m & 2) != 0;
    struct stat sb;
    iso->have_var_tmp = stat("/var/tmp", &sb) == 0 && S_ISDIR(sb.st_mode);
    iso->have_shm = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode);
    /* The data root is the tree tasks share: it stays where it is for
     * them, read-only, also where they could not reach it by its path:
     * under /tmp (the private /tmp hides it) or below a directory others
     * cannot enter (say /root/project: a tmpfs hides the rest of /root). */
    char real[PATH_MAX];
    if (iso->mount_ns && o->data_root[0] && realpath(o->data_root, real) && strcmp(real, "/") != 0) {
        int under_tmp = strncmp(real, "/tmp/", 5) == 0 || strncmp(real, "/var/tmp/", 9) == 0;
        char cover[PATH_MAX] = "";
        if (!under_tmp) {
            char p[PATH_MAX];
            snprintf(p, sizeof p, "%s", real);
            for (char *slash = strchr(p + 1, '/'); ; slash = strchr(slash + 1, '/')) {
                if (slash) *slash = '\0';
                struct stat ps;
                if (stat(p, &ps) == 0 && !(ps.st_mode & S_IXOTH) && strcmp(p, real) != 0) {
                    snprintf(cover, sizeof cover, "%s", p);
                    break;
                }
                if (!slash) break;
                *slash = '/';
            }
        }
        if (under_tmp || cover[0]) {
            snprintf(iso->opt.data_root, sizeof iso->opt.data_root, "%s", real);
            snprintf(iso->data_cover, sizeof iso->data_cover, "%s", cover);
            iso->data_bind = 1;
        }
        struct stat rs;
        if (stat(real, &rs) == 0 && (rs.st_mode & (S_IROTH | S_IXOTH)) != (S_IROTH | S_IXOTH))
            log_warn("the data root %s is mode %o: tasks (other uids) cannot read it; chmod o+rX it", real,
                     (unsigned)(rs.st_mode & 07777));
    }
    unsigned r0 = 0;
    if (getrandom(&r0, sizeof r0, GRND_NONBLOCK) != (ssize_t)sizeof r0) r0 = (unsigned)getpid() * 2654435761u;
    iso->cursor = r0 % (o->uid_last - o->uid_first + 1);
    iso->user = 1;
    if (!iso->mount_ns)
        snprintf(iso->reason, sizeof iso->reason,
                 "no private mount namespace (CAP_SYS_ADMIN missing?): /tmp and /dev/shm are shared; file modes "
                 "and uids still keep tasks apart");
    return 0;
}

void iso_release(isolator *iso) {
    for (int i = 0; i < iso->n_jobs; i++) {
        if (iso->jobs[i].shm[0]) rm_tree(iso->jobs[i].shm);
        if (iso->jobs[i].lock_fd >= 0) close(iso->jobs[i].lock_fd);
    }
    iso->n_jobs = 0;
    iso_sweep(iso);
    for (int i = 0; i < iso->n_grave; i++) free(iso->grave[i]);
    free(iso->grave);
    iso->grave = NULL;
    iso->n_grave = 0;
    for (int c = 0; c < ISO_CTLS; c++) {
        if (!iso->cg_base[c][0]) continue;
        if (iso->cg == ISO_CG_V2) {
            char leaf[PATH_MAX + 16];
            snprintf(leaf, sizeof leaf, "%s/agent", iso->cg_base[c]);
            rmdir(leaf); /* fails while the agent is in it: the next agent sweeps it */
        }
        rmdir(iso->cg_base[c]);
    }
    if (iso->cg == ISO_CG_V1) {
        char mnt[16][PATH_MAX], p[PATH_MAX + 64];
        int n = cg_all_mounts(mnt, 16);
        for (int i = 0; i < n; i++)
            if (sfmt(p, sizeof p, "%s/%s%d", mnt[i], CTR_CG_PREFIX, (int)getpid()) == 0) rmdir(p);
    }
    if (iso->agent_dir[0]) rm_tree(iso->agent_dir);
    if (iso->exe_fd >= 0) close(iso->exe_fd);
    iso->exe_fd = -1;
}

char *iso_describe(const isolator *iso) {
    cJSON *o = cJSON_CreateObject();
    if (!o) abort();
    cJSON_AddStringToObject(o, "mode", iso->user ? "user" : "none");
    cJSON_AddStringToObject(o, "cgroup", iso->cg == ISO_CG_V1 ? "v1" : iso->cg == ISO_CG_V2 ? "v2" : "none");
    cJSON *en = cJSON_AddArrayToObject(o, "enforced");
    if (iso->user) cJSON_AddItemToArray(en, cJSON_CreateString("uid"));
    if (iso->user && iso->mount_ns) cJSON_AddItemToArray(en, cJSON_CreateString("private_tmp"));
    if (iso->user && iso->hidepid) cJSON_AddItemToArray(en, cJSON_CreateString("hidepid"));
    for (int c = 0; c < ISO_CTLS; c++)
        if (iso->have_ctl[c]) cJSON_AddItemToArray(en, cJSON_CreateString(ctl_names[c]));
    if (iso->reason[0]) cJSON_AddStringToObject(o, "reason", iso->reason);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) abort();
    return s;
}

/* ---------------------------------------------------------------- uids */

static iso_job *job_find(isolator *iso, int64_t job) {
    for (int i = 0; i < iso->n_jobs; i++)
        if (iso->jobs[i].job == job) return &iso->jobs[i];
    return NULL;
}

static int uid_ours(const isolator *iso, unsigned uid) {
    for (int i = 0; i < iso->n_jobs; i++)
        if (iso->jobs[i].uid == uid) return 1;
    return 0;
}

/* A uid of the range that no job of this agent holds, no other agent of
 * the host holds (its lock file is flocked), and no account names. */
static int uid_take(isolator *iso, unsigned *uid, int *lock_fd) {
    unsigned n = iso->opt.uid_last - iso->opt.uid_first + 1;
    unsigned tries = n < 65536 ? n : 65536;
    for (unsigned k = 0; k < tries; k++) {
        unsigned u = iso->opt.uid_first + (iso->cursor + k) % n;
        if (u == (unsigned)geteuid() || u == (unsigned)getuid() || uid_ours(iso, u)) continue;
        struct passwd pw, *res = NULL;
        char pwbuf[4096];
        if (getpwuid_r((uid_t)u, &pw, pwbuf, sizeof pwbuf, &res) == 0 && res) continue; /* a real account */
        char p[PATH_MAX + 32];
        if (sfmt(p, sizeof p, "%s/%u", iso->opt.lock_dir, u) < 0) return -1;
        int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0) return -1;
        if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
            close(fd);
            continue;
        }
        iso->cursor = (iso->cursor + k + 1) % n;
        *uid = u;
        *lock_fd = fd;
        return 0;
    }
    errno = EAGAIN;
    return -1;
}

/* The job's entry, allocated with a uid and its /dev/shm on first use. */
static iso_job *job_hold(isolator *iso, int64_t job, char *err, size_t errlen) {
    iso_job *j = job_find(iso, job);
    if (j) {
        j->refs++;
        return j;
    }
    if (iso->n_jobs == ISO_MAX_JOBS) {
        snprintf(err, errlen, "too many jobs on this node");
        return NULL;
    }
    j = &iso->jobs[iso->n_jobs];
    memset(j, 0, sizeof *j);
    j->lock_fd = -1;
    if (uid_take(iso, &j->uid, &j->lock_fd) < 0) {
        snprintf(err, errlen, "no free uid in --task-uids %u-%u: %s", iso->opt.uid_first, iso->opt.uid_last,
                 strerror(errno));
        return NULL;
    }
    j->job = job;
    j->refs = 1;
    if (iso->mount_ns && iso->have_shm) {
        if (sfmt(j->shm, sizeof j->shm, "/dev/shm/trainyard-job%lld-%u", (long long)job, j->uid) < 0) j->shm[0] = '\0';
        if (j->shm[0]) {
            rm_tree(j->shm); /* a leftover of a killed agent */
            if (mkdir(j->shm, 0700) < 0 || chown(j->shm, j->uid, j->uid) < 0) {
                snprintf(err, errlen, "cannot make %s: %s", j->shm, strerror(errno));
                rm_tree(j->shm);
                close(j->lock_fd);
                return NULL;
            }
        }
    }
    iso->n_jobs++;
    return j;
}

static void job_drop(isolator *iso, int64_t job) {
    iso_job *j = job_find(iso, job);
    if (!j || --j->refs > 0) return;
    if (j->shm[0]) rm_tree(j->shm);
    if (j->lock_fd >= 0) close(j->lock_fd);
    *j = iso->jobs[--iso->n_jobs];
}

/* ---------------------------------------------------------------- tasks */

static void task_undo(isolator *iso, iso_task *t, int job_held) {
    for (int c = 0; c < t->n_cg; c++) rmdir(t->cg[c]);
    t->n_cg = 0;
    if (t->dir[0]) rm_tree(t->dir);
    if (job_held) job_drop(iso, t->job);
    t->on = 0;
}

/* The task's cgroup(s) with its limits. */
static int task_cgroups(isolator *iso, iso_task *t, const int *deny_minor, int n_deny, char *err, size_t errlen) {
    char v[64];
    for (int c = 0; c < ISO_CTLS; c++) {
        if (!iso->have_ctl[c] || (iso->cg == ISO_CG_V2 && c > 0)) continue;
        int k = t->n_cg;
        if (sfmt(t->cg[k], sizeof t->cg[k], "%s/task-%lld", iso->cg_base[c], (long long)t->id) < 0) return -1;
        if (mkdir(t->cg[k], 0755) < 0 && errno != EEXIST) {
            snprintf(err, errlen, "cannot make cgroup %s: %s", t->cg[k], strerror(errno));
            return -1;
        }
        t->n_cg++;
        int v2 = iso->cg == ISO_CG_V2;
        int rc = 0;
        if ((v2 || c == CTL_MEMORY) && t->memory_mb > 0) {
            snprintf(v, sizeof v, "%lld", (long long)(t->memory_mb << 20));
            rc = write_file(t->cg[k], v2 ? "memory.max" : "memory.limit_in_bytes", v);
            /* no swap beyond the limit (absent without swap accounting) */
            if (rc == 0 && write_file(t->cg[k], v2 ? "memory.swap.max" : "memory.memsw.limit_in_bytes",
                                      v2 ? "0" : v) < 0 && errno != ENOENT && errno != EINVAL)
                rc = -1;
            if (rc < 0) snprintf(err, errlen, "cannot set the memory limit in %s: %s", t->cg[k], strerror(errno));
        }
        if (rc == 0 && (v2 || c == CTL_CPU)) {
            if (v2) snprintf(v, sizeof v, "%d", t->slots * 100 > 10000 ? 10000 : t->slots * 100);
            else snprintf(v, sizeof v, "%d", t->slots * 1024);
            rc = write_file(t->cg[k], v2 ? "cpu.weight" : "cpu.shares", v);
            if (rc < 0) snprintf(err, errlen, "cannot set the CPU weight in %s: %s", t->cg[k], strerror(errno));
        }
        if (rc == 0 && (v2 || c == CTL_PIDS)) {
            if (iso->opt.pids_max > 0) snprintf(v, sizeof v, "%d", iso->opt.pids_max);
            else snprintf(v, sizeof v, "max");
            rc = write_file(t->cg[k], "pids.max", v);
            if (rc < 0) snprintf(err, errlen, "cannot set the pids limit in %s: %s", t->cg[k], strerror(errno));
        }
        if (rc == 0 && v2 && n_deny > 0) rc = iso_bpf_deny_gpus(t->cg[k], deny_minor, n_deny, err, errlen);
        if (rc == 0 && !v2 && c == CTL_DEVICES) {
            for (int i = 0; i < n_deny && rc == 0; i++) {
                snprintf(v, sizeof v, "c %d:%d rwm", NVIDIA_MAJOR, deny_minor[i]);
                rc = write_file(t->cg[k], "devices.deny", v);
            }
            if (rc < 0) snprintf(err, errlen, "cannot deny the other GPUs in %s: %s", t->cg[k], strerror(errno));
        }
        if (rc < 0) return -1;
        if (strlen(t->cg[k]) + sizeof "/cgroup.procs" > sizeof t->cg[k]) {
            snprintf(err, errlen, "cgroup path too long: %s", t->cg[k]);
            return -1;
        }
    }
    return 0;
}

int iso_task_prepare(isolator *iso, int64_t task_id, int64_t job_id, int64_t memory_mb, int slots,
                     const char *gpus, iso_task *t, char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    t->id = task_id;
    t->job = job_id;
    if (!iso->user && iso->cg == ISO_CG_NONE) return 0; /* nothing to enforce */
    /* which GPUs: held ones stay, the node's others are denied */
    int held[ISO_MAX_GPUS] = {0}, n_held = 0;
    for (const char *p = gpus ? gpus : ""; *p;) {
        char *end;
        long ix = strtol(p, &end, 10);
        if (end == p) break;
        if (ix >= 0 && ix < ISO_MAX_GPUS) held[ix] = 1, n_held++;
        p = *end == ',' ? end + 1 : end;
    }
    int deny[ISO_MAX_GPUS], n_deny = 0;
    for (int i = 0; i < iso->opt.n_gpus && i < ISO_MAX_GPUS; i++)
        if (!held[i]) deny[n_deny++] = iso->opt.gpu_minor[i];
    /* the memory limit: asked for, or the node's share for these devices */
    if (memory_mb <= 0) {
        if (n_held && iso->opt.n_gpus > 0) memory_mb = iso->memory_mb * n_held / iso->opt.n_gpus;
        else if (iso->opt.cpu_slots > 0) memory_mb = iso->memory_mb * (slots > 0 ? slots : 1) / iso->opt.cpu_slots;
    }
    t->memory_mb = iso->have_ctl[CTL_MEMORY] ? memory_mb : 0;
    if (n_held && iso->opt.n_gpus > 0) slots = iso->opt.cpu_slots * n_held / iso->opt.n_gpus;
    t->slots = slots > 0 ? slots : 1;
    t->on = 1;
    int job_held = 0;
    if (iso->user) {
        iso_job *j = job_hold(iso, job_id, err, errlen);
        if (!j) {
            t->on = 0;
            return -1;
        }
        job_held = 1;
        t->uid = j->uid;
        snprintf(t->shm, sizeof t->shm, "%s", j->shm);
        if (sfmt(t->dir, sizeof t->dir, "%s/task%lld-XXXXXX", iso->agent_dir, (long long)task_id) < 0 ||
            !mkdtemp(t->dir)) {
            snprintf(err, errlen, "cannot make the job directory under %s: %s", iso->agent_dir, strerror(errno));
            t->dir[0] = '\0';
            task_undo(iso, t, job_held);
            return -1;
        }
        if (sfmt(t->tmp, sizeof t->tmp, "%s/tmp", t->dir) < 0 || mkdir(t->tmp, 0700) < 0 ||
            chown(t->tmp, t->uid, t->uid) < 0 || chown(t->dir, t->uid, t->uid) < 0 || chmod(t->dir, 0700) < 0) {
            snprintf(err, errlen, "cannot prepare the job directory %s: %s", t->dir, strerror(errno));
            task_undo(iso, t, job_held);
            return -1;
        }
        t->mount_ns = iso->mount_ns;
        t->hidepid = iso->hidepid;
        t->var_tmp = iso->have_var_tmp;
        t->exe_fd = iso->exe_fd;
        if (iso->data_bind) {
            t->data_bind = 1;
            snprintf(t->data_path, sizeof t->data_path, "%s", iso->opt.data_root);
            snprintf(t->data_cover, sizeof t->data_cover, "%s", iso->data_cover);
        }
    }
    if (task_cgroups(iso, t, deny, n_deny, err, errlen) < 0) {
        task_undo(iso, t, job_held);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- in the child */

/* Digits of v into out (>= 24 bytes); the length. Async-signal-safe. */
static size_t fmt_long(long v, char *out) {
    char tmp[24];
    size_t n = 0;
    int neg = v < 0;
    unsigned long u = neg ? (unsigned long)(-(v + 1)) + 1 : (unsigned long)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u && n < sizeof tmp);
    size_t k = 0;
    if (neg) out[k++] = '-';
    while (n) out[k++] = tmp[--n];
    out[k] = '\0';
    return k;
}

static int enter_fail(const char *what) {
    int e = errno;
    char msg[256], num[24];
    size_t n = 0;
    fmt_long(e, num);
    const char *parts[] = {"trainyard agent: cannot isolate the task: ", what, " (errno ", num, ")\n"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        for (const char *p = parts[i]; *p && n < sizeof msg; p++) msg[n++] = *p;
    ssize_t w = write(2, msg, n);
    (void)w;
    errno = e;
    return -1;
}

/* mkdir -p of path's components below the directory `below` (a mount
 * point: /tmp, or the tmpfs over a parent others cannot enter). */
static void mkdirs_below(const char *path, const char *below) {
    char p[PATH_MAX];
    size_t n = 0, skip = 0;
    while (below[skip]) skip++;
    while (path[n] && n < sizeof p - 1) {
        p[n] = path[n];
        n++;
    }
    p[n] = '\0';
    for (size_t i = skip + 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        char keep = p[i];
        p[i] = '\0';
        mkdir(p, 0755);
        p[i] = keep;
    }
}

int iso_task_enter(const iso_task *t) {
    if (!t->on) return 0;
    char num[24];
    size_t n = fmt_long((long)getpid(), num);
    for (int c = 0; c < t->n_cg; c++) {
        char p[PATH_MAX];
        size_t k = 0;
        for (const char *q = t->cg[c]; *q && k < sizeof p - 1; q++) p[k++] = *q;
        for (const char *q = "/cgroup.procs"; *q && k < sizeof p - 1; q++) p[k++] = *q;
        p[k] = '\0';
        int fd = open(p, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, num, n) != (ssize_t)n) return enter_fail("joining its cgroup");
        close(fd);
    }
    if (!t->uid) return 0; /* limits only (--isolation none) */
    if (t->keep_root) {
        /* podman's worker: the container is the task's isolation */
        if (chdir(t->dir) < 0) return enter_fail("entering the job directory");
        if (setsid() < 0) return enter_fail("setsid");
        return 0;
    }
    if (t->mount_ns) {
        if (unshare(CLONE_NEWNS) < 0) return enter_fail("unshare(CLONE_NEWNS)");
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return enter_fail("making mounts private");
        /* the data root, held open before the mounts below hide it; opened
         * here, in the new namespace: a bind takes its source from there */
        int data_fd = -1;
        char data_src[40] = "/proc/self/fd/";
        if (t->data_bind) {
            data_fd = open(t->data_path, O_PATH | O_DIRECTORY | O_CLOEXEC);
            if (data_fd < 0) return enter_fail("opening the data root");
            fmt_long(data_fd, data_src + 14);
        }
        if (mount(t->tmp, "/tmp", NULL, MS_BIND, NULL) < 0) return enter_fail("a private /tmp");
        if (t->var_tmp && mount(t->tmp, "/var/tmp", NULL, MS_BIND, NULL) < 0) return enter_fail("a private /var/tmp");
        if (t->shm[0] && mount(t->shm, "/dev/shm", NULL, MS_BIND, NULL) < 0) return enter_fail("a private /dev/shm");
        if (data_fd >= 0) {
            if (t->data_cover[0] &&
                mount("tmpfs", t->data_cover, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m") < 0)
                return enter_fail("a tmpfs over the data root's parent");
            mkdirs_below(t->data_path, t->data_cover[0] ? t->data_cover : "/tmp");
            if (mount(data_src, t->data_path, NULL, MS_BIND | MS_REC, NULL) < 0)
                return enter_fail("binding the data root");
            if (mount(NULL, t->data_path, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) < 0)
                return enter_fail("making the data root read-only");
            close(data_fd);
        }
        if (t->hidepid && mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2") < 0)
            return enter_fail("a /proc that hides other users");
    }
    if (chdir(t->dir) < 0) return enter_fail("entering the job directory");
    if (setsid() < 0) return enter_fail("setsid");
    if (setgroups(0, NULL) < 0) return enter_fail("dropping supplementary groups");
    if (setresgid(t->uid, t->uid, t->uid) < 0) return enter_fail("setresgid");
    if (setresuid(t->uid, t->uid, t->uid) < 0) return enter_fail("setresuid");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return enter_fail("PR_SET_NO_NEW_PRIVS");
    return 0;
}

/* ---------------------------------------------------------------- after */

/* ---------------------------------------------------------------- containers (image tasks) */

int iso_ctr_cgroup(isolator *iso, iso_task *t, const char *name, char *parent, size_t parentlen, char *err,
                   size_t errlen) {
    parent[0] = '\0';
    if (!t->on || iso->cg != ISO_CG_V1 || !iso->have_ctl[CTL_MEMORY] || t->memory_mb <= 0 || t->ctr_rel[0])
        return 0;
    char mnt[PATH_MAX], root[PATH_MAX], dir[PATH_MAX + 64], p[PATH_MAX + 128], v[32];
    if (cg_mount("memory", mnt, sizeof mnt, root, sizeof root) < 0) {
        snprintf(err, errlen, "no cgroup v1 memory hierarchy");
        return -1;
    }
    if (sfmt(t->ctr_rel, sizeof t->ctr_rel, "/%s%d/%s", CTR_CG_PREFIX, (int)getpid(), name) < 0 ||
        sfmt(parent, parentlen, "%s%s", strcmp(root, "/") == 0 ? "" : root, t->ctr_rel) < 0 ||
        sfmt(dir, sizeof dir, "%s/%s%d", mnt, CTR_CG_PREFIX, (int)getpid()) < 0) {
        snprintf(err, errlen, "the container's cgroup path is too long");
        goto fail;
    }
    if ((mkdir(dir, 0755) < 0 && errno != EEXIST) || sfmt(dir, sizeof dir, "%s%s", mnt, t->ctr_rel) < 0 ||
        mkdir(dir, 0755) < 0) {
        snprintf(err, errlen, "cannot make cgroup %s: %s", dir, strerror(errno));
        goto fail;
    }
    /* the limit the kernel enforces: the task's, less a margin, so that this
     * cgroup (not the container's own, at the task's limit) meets it first
     * and is the one whose OOM notification fires */
    int64_t mb = t->memory_mb > 4 * CTR_OOM_MARGIN_MB ? t->memory_mb - CTR_OOM_MARGIN_MB : t->memory_mb;
    snprintf(v, sizeof v, "%lld", (long long)(mb << 20));
    if (write_file(dir, "memory.limit_in_bytes", v) < 0 ||
        (write_file(dir, "memory.memsw.limit_in_bytes", v) < 0 && errno != ENOENT && errno != EINVAL)) {
        snprintf(err, errlen, "cannot set the memory limit in %s: %s", dir, strerror(errno));
        goto fail_dir;
    }
    /* cgroup v1's OOM notification: an eventfd the kernel signals each time
     * this cgroup's limit invokes the OOM killer (and once when the cgroup
     * is removed, which only iso_task_finish does, after reading it) */
    t->ctr_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    int ofd = -1;
    if (t->ctr_efd < 0 || sfmt(p, sizeof p, "%s/memory.oom_control", dir) < 0 ||
        (ofd = open(p, O_RDONLY | O_CLOEXEC)) < 0) {
        snprintf(err, errlen, "cannot watch %s: %s", p, strerror(errno));
        goto fail_fd;
    }
    snprintf(v, sizeof v, "%d %d", t->ctr_efd, ofd);
    int rc = write_file(dir, "cgroup.event_control", v);
    int e = errno;
    close(ofd);
    if (rc < 0) {
        snprintf(err, errlen, "cannot register for %s's OOM notification: %s", dir, strerror(e));
        goto fail_fd;
    }
    t->ctr_efd_on = 1;
    return 0;
fail_fd:
    if (t->ctr_efd >= 0) close(t->ctr_efd);
fail_dir:
    rmdir(dir);
fail:
    t->ctr_rel[0] = '\0';
    parent[0] = '\0';
    return -1;
}

/* An image task's container parent: whether its limit invoked the OOM
 * killer, then the parent removed in every hierarchy (runc made it in
 * each; conmon's child cgroup is in it). */
static int ctr_cg_finish(isolator *iso, iso_task *t) {
    if (!t->ctr_rel[0]) return 0;
    int oom = 0;
    if (t->ctr_efd_on) {
        uint64_t n = 0;
        oom = read(t->ctr_efd, &n, sizeof n) == (ssize_t)sizeof n && n > 0;
        close(t->ctr_efd);
        t->ctr_efd_on = 0;
    }
    char mnt[16][PATH_MAX], p[PATH_MAX + PATH_MAX];
    int n = cg_all_mounts(mnt, 16);
    for (int i = 0; i < n; i++)
        if (sfmt(p, sizeof p, "%s%s", mnt[i], t->ctr_rel) == 0) cg_remove_tree(iso, p, 1);
    t->ctr_rel[0] = '\0';
    return oom;
}

void iso_task_finish(isolator *iso, iso_task *t, int *oom) {
    *oom = 0;
    if (!t->on) return;
    *oom = ctr_cg_finish(iso, t);
    if (t->n_cg) {
        /* every process of the task is in each of its cgroups: kill through the first */
        cg_kill_all(t->cg[0]);
        if (iso->have_ctl[CTL_MEMORY]) {
            long long k = iso->cg == ISO_CG_V2 ? read_keyed(t->cg[0], "memory.events", "oom_kill")
                                               : read_keyed(t->cg[0], "memory.oom_control", "oom_kill");
            *oom |= k > 0;
        }
        for (int c = 0; c < t->n_cg; c++)
            if (rmdir(t->cg[c]) < 0 && errno != ENOENT) grave_add(iso, t->cg[c]);
        t->n_cg = 0;
    }
    if (t->dir[0]) rm_tree(t->dir);
    t->dir[0] = '\0';
    if (t->uid) job_drop(iso, t->job);
    t->on = 0;
}

int iso_env_keep(const char *e) {
    static const char *const exact[] = {"PATH", "LANG", "LANGUAGE", "TZ", "TERM", "LD_LIBRARY_PATH",
                                        "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "PYTHONPATH",
                                        "PYTHONUNBUFFERED", "PYTHONHASHSEED", NULL};
    static const char *const prefix[] = {"LC_", "OPENBLAS_", "OMP_", "MKL_", "GOTO", "CUDA_", "NCCL_", NULL};
    const char *eq = strchr(e, '=');
    if (!eq) return 0;
    size_t n = (size_t)(eq - e);
    for (int i = 0; exact[i]; i++)
        if (strlen(exact[i]) == n && strncmp(e, exact[i], n) == 0) return 1;
    for (int i = 0; prefix[i]; i++)
        if (strncmp(e, prefix[i], strlen(prefix[i])) == 0) return 1;
    return 0;
}
