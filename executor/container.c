/* container.c - a command job's program in an OCI image (see container.h). */
#include "container.h"
#include "proc.h"
#include "../common/util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <ftw.h>
#include <openssl/evp.h>

#define CTR_OUT_KEEP 4096          /* the end of podman's output kept for an error */

static int json_str(const cJSON *o, const char *k, char *out, size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v) {
        out[0] = '\0';
        return 0;
    }
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= cap) return -1;
    snprintf(out, cap, "%s", v->valuestring);
    return 0;
}

static double json_num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

int ctr_parse(ctr_opts *o, char *err, size_t errlen) {
    memset(o, 0, sizeof *o);
    const char *s = getenv("TRAINYARD_CONTAINER");
    if (!s || !*s) return 0;
    cJSON *j = cJSON_Parse(s);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        snprintf(err, errlen, "TRAINYARD_CONTAINER is not a JSON object");
        return -1;
    }
    int bad = json_str(j, "podman", o->podman, sizeof o->podman) < 0 ||
              json_str(j, "runtime", o->runtime, sizeof o->runtime) < 0 ||
              json_str(j, "name", o->name, sizeof o->name) < 0 || json_str(j, "dir", o->dir, sizeof o->dir) < 0 ||
              json_str(j, "data_root", o->data_root, sizeof o->data_root) < 0 ||
              json_str(j, "gpus", o->gpus, sizeof o->gpus) < 0 ||
              json_str(j, "lock_dir", o->lock_dir, sizeof o->lock_dir) < 0 ||
              json_str(j, "cgroup_parent", o->cgroup_parent, sizeof o->cgroup_parent) < 0;
    double uid = json_num(j, "uid");
    o->uid = uid > 0 && uid < 4294967295.0 ? (unsigned)uid : 0;
    o->memory_mb = (int64_t)json_num(j, "memory_mb");
    o->pids = (int)json_num(j, "pids");
    o->cpu_shares = (int)json_num(j, "cpu_shares");
    o->nofile = (long)json_num(j, "nofile");
    o->nproc = (long)json_num(j, "nproc");
    o->agent = (long)json_num(j, "agent");
    cJSON_Delete(j);
    if (bad || !o->podman[0] || !o->name[0] || !o->dir[0] || !o->uid) {
        snprintf(err, errlen, "TRAINYARD_CONTAINER lacks podman, name, dir or uid");
        return -1;
    }
    return 1;
}

/* Runs argv (podman) to its end with stdout and stderr kept (the last
 * CTR_OUT_KEEP bytes) and env as its environment (NULL: ours). Returns its
 * wait status, or -1. Gives up (SIGKILL) after timeout_s. */
static int run_capture(char *const argv[], char *const env[], int timeout_s, char *out, size_t outcap) {
    int p[2];
    if (out && outcap) out[0] = '\0';
    if (pipe2(p, O_CLOEXEC) < 0) return -1;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        if (proc_child_setup(parent, 1, SIGKILL, 1) < 0) _exit(126);
        if (dup2(p[1], 1) < 0 || dup2(p[1], 2) < 0) _exit(126);
        if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) < 0) _exit(126); /* podman gets none of ours */
        if (env) execve(argv[0], argv, env);
        else execv(argv[0], argv);
        _exit(127);
    }
    close(p[1]);
    size_t len = 0;
    int64_t deadline = mono_ms() + (int64_t)timeout_s * 1000;
    char chunk[1024];
    for (;;) {
        struct pollfd pf = {.fd = p[0], .events = POLLIN};
        int64_t left = deadline - mono_ms();
        if (left <= 0) {
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            break;
        }
        int r = poll(&pf, 1, (int)(left > 1000 ? 1000 : left));
        if (r < 0 && errno != EINTR) break;
        if (r <= 0) continue;
        ssize_t n = read(p[0], chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        if (out && outcap > 1) {
            /* keep the end: what a failure says last */
            size_t k = (size_t)n;
            if (k >= outcap - 1) {
                memcpy(out, chunk + k - (outcap - 1), outcap - 1);
                len = outcap - 1;
            } else {
                if (len + k > outcap - 1) {
                    size_t drop = len + k - (outcap - 1);
                    memmove(out, out + drop, len - drop);
                    len -= drop;
                }
                memcpy(out + len, chunk, k);
                len += k;
            }
            out[len] = '\0';
        }
    }
    close(p[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return st;
}

/* What the registry answered, on one line: podman's last "Error: " line
 * ("manifest unknown", "unauthorized", "connection refused"), else its last
 * non-empty line. */
static void tail_lines(const char *text, char *out, size_t cap) {
    const char *e = NULL;
    for (const char *p = strstr(text, "Error: "); p; p = strstr(p + 1, "Error: ")) e = p;
    const char *start = e;
    if (!start) {
        size_t n = strlen(text);
        while (n && (text[n - 1] == '\n' || text[n - 1] == ' ')) n--;
        size_t b = n;
        while (b > 0 && text[b - 1] != '\n') b--;
        start = text + b;
    }
    size_t k = 0;
    for (const char *p = start; *p && *p != '\n' && k + 1 < cap; p++) out[k++] = *p;
    out[k] = '\0';
}

/* Whether team is in the pullers' list (one id a line). */
static int team_pulled(const char *path, int64_t team) {
    size_t len = 0;
    char *s = file_read_all(path, 1 << 20, &len);
    if (!s) return 0;
    int found = 0;
    for (char *p = s; *p && !found;) {
        found = strtoll(p, NULL, 10) == team;
        p = strchr(p, '\n');
        if (!p) break;
        p++;
    }
    free(s);
    return found;
}

int ctr_pull(const ctr_opts *o, const char *image, int always, int64_t team, const char *authfile,
             ctr_pull_note note, void *ctx, char *err, size_t errlen) {
    /* one pull of an image at a time on this node */
    char lock[PATH_MAX + 100], teams[PATH_MAX + 100], last[PATH_MAX + 100], hex[65], stamp[64];
    snprintf(stamp, sizeof stamp, "%lld %d\n", (long long)o->job, o->attempt);
    sha256_hex(image, strlen(image), hex);
    int fd = -1;
    teams[0] = '\0';
    if (o->lock_dir[0] && mkdir_p(o->lock_dir, 0700) == 0 &&
        sfmt(lock, sizeof lock, "%s/pull-%.16s.lock", o->lock_dir, hex) == 0 &&
        sfmt(teams, sizeof teams, "%s/pull-%.16s.teams", o->lock_dir, hex) == 0 &&
        sfmt(last, sizeof last, "%s/pull-%.16s.last", o->lock_dir, hex) == 0)
        fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0)
        while (flock(fd, LOCK_EX) < 0 && errno == EINTR) {
        }
    char out[CTR_OUT_KEEP];
    int rc = 0;
    /* localhost/NAME is podman's name for an image made on this node (podman
     * build, podman import): the node's own, never pulled from anywhere */
    if (strncmp(image, "localhost/", 10) == 0) {
        char *argv[] = {(char *)o->podman, "image", "exists", (char *)image, NULL};
        int st = run_capture(argv, NULL, 60, out, sizeof out);
        if (st < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            snprintf(err, errlen,
                     "image %s is not on this node (a localhost/ image is the node's own, built or imported there)",
                     image);
            rc = -1;
        }
        goto done;
    }
    if (always && fd >= 0 && o->job > 0) {
        /* this attempt pulled it here already (another task of the gang) */
        size_t len = 0;
        char *was = file_read_all(last, 256, &len);
        int same = was && strcmp(was, stamp) == 0;
        free(was);
        if (same) goto done;
    }
    if (!always && fd >= 0 && team_pulled(teams, team)) {
        char *argv[] = {(char *)o->podman, "image", "exists", (char *)image, NULL};
        int st = run_capture(argv, NULL, 60, out, sizeof out);
        if (st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0) goto done; /* cached */
    }
    if (note) note(ctx, 1, image, 0);
    int64_t t0 = mono_ms();
    char *argv[8];
    int n = 0;
    argv[n++] = (char *)o->podman;
    argv[n++] = "pull";
    argv[n++] = "--quiet";
    if (authfile && *authfile) {
        argv[n++] = "--authfile";
        argv[n++] = (char *)authfile;
    }
    argv[n++] = (char *)image;
    argv[n] = NULL;
    int st = run_capture(argv, NULL, 1800, out, sizeof out);
    if (st < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        char said[600];
        tail_lines(out, said, sizeof said);
        if (st >= 0 && WIFSIGNALED(st))
            snprintf(err, errlen, "pulling image %s did not finish within 30 minutes", image);
        else
            snprintf(err, errlen, "cannot pull image %s: %s", image, said[0] ? said : "podman pull failed");
        rc = -1;
        goto done;
    }
    if (note) note(ctx, 0, image, (double)(mono_ms() - t0) / 1000.0);
    if (fd >= 0 && o->job > 0 && file_write_atomic(last, stamp, strlen(stamp), 0600) < 0)
        log_warn("cannot write %s: %s", last, strerror(errno));
    if (fd >= 0 && !team_pulled(teams, team)) {
        FILE *f = fopen(teams, "a");
        if (f) {
            fprintf(f, "%lld\n", (long long)team);
            fclose(f);
        }
    }
done:
    if (fd >= 0) close(fd); /* the lock goes with it */
    return rc;
}

int ctr_env_passes(const char *entry, char *const *spec_env) {
    const char *eq = strchr(entry, '=');
    if (!eq) return 0;
    size_t n = (size_t)(eq - entry);
    for (int i = 0; spec_env && spec_env[i]; i++)
        if (strncmp(spec_env[i], entry, n + 1) == 0) return 1; /* the team asked for it */
    static const char *const host_only[] = {"PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "TMPDIR",
                                            "TRAINYARD_CONTAINER", "TRAINYARD_CA_PEM", "ASAN_OPTIONS",
                                            "UBSAN_OPTIONS", "LSAN_OPTIONS", NULL};
    for (int i = 0; host_only[i]; i++)
        if (strlen(host_only[i]) == n && strncmp(entry, host_only[i], n) == 0) return 0;
    /* a name podman would read as an option's value is never passed */
    return n > 0 && entry[0] != '-';
}

char **ctr_argv(const ctr_opts *o, const char *image, const char *wd, char *const *prog_argv, char *const *envp) {
    int ne = 0, na = 0;
    while (envp && envp[ne]) ne++;
    while (prog_argv && prog_argv[na]) na++;
    size_t cap = (size_t)(64 + 2 * ne + na + 8);
    char **v = xcalloc(cap, sizeof *v);
    size_t k = 0;
    v[k++] = xstrdup(o->podman);
    if (o->runtime[0]) {
        v[k++] = xstrdup("--runtime");
        v[k++] = xstrdup(o->runtime);
    }
    v[k++] = xstrdup("run");
    v[k++] = xstrdup("--rm");
    v[k++] = xstrdup("--name");
    v[k++] = xstrdup(o->name);
    if (o->agent > 0) v[k++] = xasprintf("--label=trainyard.agent=%ld", o->agent);
    if (o->job > 0) v[k++] = xasprintf("--label=trainyard.job=%lld", (long long)o->job);
    if (o->task[0]) v[k++] = xasprintf("--label=trainyard.task=%s", o->task);
    v[k++] = xstrdup("--pull=never");      /* pulled already, under the node's lock */
    v[k++] = xstrdup("--network=host");    /* rings and torch's store as on the host */
    v[k++] = xstrdup("--log-driver=none"); /* the output comes here, and goes to the job's logs */
    v[k++] = xasprintf("--user=%u:%u", o->uid, o->uid);
    v[k++] = xstrdup("--security-opt=no-new-privileges");
    v[k++] = xstrdup("--cap-drop=all");
    if (o->memory_mb > 0) {
        v[k++] = xasprintf("--memory=%lldm", (long long)o->memory_mb);
        v[k++] = xasprintf("--memory-swap=%lldm", (long long)o->memory_mb);
        /* /dev/shm: collectives move tensors through it */
        int64_t shm = o->memory_mb / 2 > 64 ? o->memory_mb / 2 : 64;
        v[k++] = xasprintf("--shm-size=%lldm", (long long)shm);
    }
    /* under the agent's cgroup that tells an OOM kill apart (isolate.h) */
    if (o->cgroup_parent[0]) v[k++] = xasprintf("--cgroup-parent=%s", o->cgroup_parent);
    if (o->pids > 0) v[k++] = xasprintf("--pids-limit=%d", o->pids);
    if (o->cpu_shares > 0) v[k++] = xasprintf("--cpu-shares=%d", o->cpu_shares);
    /* root here may lack CAP_SYS_RESOURCE: podman's own rlimits (above the
     * hard limits) would be refused, so the node's are given */
    if (o->nofile > 0) v[k++] = xasprintf("--ulimit=nofile=%ld:%ld", o->nofile, o->nofile);
    if (o->nproc > 0) v[k++] = xasprintf("--ulimit=nproc=%ld:%ld", o->nproc, o->nproc);
    v[k++] = xasprintf("--volume=%s:%s:rw", o->dir, o->dir);
    if (o->data_root[0]) v[k++] = xasprintf("--volume=%s:%s:ro", o->data_root, o->data_root);
    /* GPUs through CDI (nvidia-ctk cdi generate): only the task's own */
    for (const char *p = o->gpus; *p;) {
        char *end;
        long ix = strtol(p, &end, 10);
        if (end == p) break;
        v[k++] = xasprintf("--device=nvidia.com/gpu=%ld", ix);
        p = *end == ',' ? end + 1 : end;
        if (k + 16 + (size_t)ne + (size_t)na >= cap) break;
    }
    if (wd && wd[0]) v[k++] = xasprintf("--workdir=%s", wd);
    for (int i = 0; i < ne; i++) {
        const char *eq = strchr(envp[i], '=');
        if (!eq) continue;
        v[k++] = xstrdup("--env");
        v[k++] = xstrndup(envp[i], (size_t)(eq - envp[i]));
    }
    v[k++] = xstrdup("--");
    v[k++] = xstrdup(image);
    for (int i = 0; i < na; i++) v[k++] = xstrdup(prog_argv[i]);
    v[k] = NULL;
    return v;
}

void ctr_remove(const char *podman, const char *name, int timeout_s) {
    char *argv[] = {(char *)podman, "rm", "--force", "--ignore", "--time", "0", (char *)name, NULL};
    char out[512];
    int st = run_capture(argv, NULL, timeout_s, out, sizeof out);
    if (st < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        log_warn("cannot remove container %s: %.300s", name, out[0] ? out : "podman rm failed");
}

void ctr_gpu_renumber(char **envp, const char *gpus) {
    int n = 0;
    for (const char *p = gpus; *p; p++)
        if (*p >= '0' && *p <= '9' && (p == gpus || p[-1] == ',')) n++;
    for (size_t i = 0; envp[i]; i++) {
        if (strncmp(envp[i], "CUDA_VISIBLE_DEVICES=", 21) != 0) continue;
        buf b;
        buf_init(&b, 4096);
        int bad = buf_appends(&b, "CUDA_VISIBLE_DEVICES=") < 0;
        for (int k = 0; k < n; k++) bad |= buf_printf(&b, "%s%d", k ? "," : "", k) < 0;
        if (bad) {
            buf_release(&b);
            return;
        }
        free(envp[i]);
        envp[i] = xstrdup(b.data);
        buf_release(&b);
    }
}

static unsigned g_chown_uid;
static int chown_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    if (lchown(path, g_chown_uid, g_chown_uid) < 0) log_warn("chown %s: %s", path, strerror(errno));
    return 0;
}

void chown_tree(const char *dir, unsigned uid) {
    g_chown_uid = uid; /* the worker is single-threaded where it calls this */
    nftw(dir, chown_one, 16, FTW_PHYS | FTW_MOUNT);
}

int ctr_authfile(const char *dir, const char *registry, const char *user, const char *password, char *path,
                 size_t pathlen) {
    size_t n = strlen(user) + 1 + strlen(password);
    char *plain = xmalloc(n + 1);
    snprintf(plain, n + 1, "%s:%s", user, password);
    unsigned char *b64 = xmalloc(4 * ((n + 2) / 3) + 1);
    EVP_EncodeBlock(b64, (const unsigned char *)plain, (int)n);
    explicit_bzero(plain, n);
    free(plain);
    cJSON *o = cJSON_CreateObject(), *auths = cJSON_AddObjectToObject(o, "auths");
    cJSON *r = cJSON_AddObjectToObject(auths, registry);
    cJSON_AddStringToObject(r, "auth", (const char *)b64);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    explicit_bzero(b64, strlen((char *)b64));
    free(b64);
    if (!text) return -1;
    int rc = -1;
    if (sfmt(path, pathlen, "%s/auth-XXXXXX", dir) == 0) {
        int fd = mkstemp(path);
        if (fd >= 0) {
            size_t len = strlen(text);
            rc = write(fd, text, len) == (ssize_t)len ? 0 : -1;
            close(fd);
            if (rc < 0) unlink(path);
        }
    }
    explicit_bzero(text, strlen(text));
    cJSON_free(text);
    if (rc < 0) path[0] = '\0';
    return rc;
}

int ctr_probe(const char *podman, char *path, size_t pathlen, char *version, size_t verlen) {
    path[0] = '\0';
    if (strchr(podman, '/')) {
        if (access(podman, X_OK) == 0) snprintf(path, pathlen, "%s", podman);
    } else {
        const char *p = getenv("PATH");
        if (!p || !*p) p = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin";
        while (*p && !path[0]) {
            const char *c = strchr(p, ':');
            size_t n = c ? (size_t)(c - p) : strlen(p);
            char cand[PATH_MAX];
            if (n && sfmt(cand, sizeof cand, "%.*s/%s", (int)n, p, podman) == 0 && access(cand, X_OK) == 0)
                snprintf(path, pathlen, "%s", cand);
            p += n + (c ? 1 : 0);
        }
    }
    if (!path[0]) return -1;
    char *argv[] = {path, "--version", NULL};
    char out[256];
    int st = run_capture(argv, NULL, 20, out, sizeof out);
    if (st < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        path[0] = '\0';
        return -1;
    }
    size_t n = strcspn(out, "\n");
    snprintf(version, verlen, "%.*s", (int)n, out);
    return 0;
}

int ctr_sweep(const char *podman, long self) {
    char *argv[] = {(char *)podman, "ps", "--all", "--filter", "label=trainyard.agent", "--format",
                    "{{.Names}} {{index .Labels \"trainyard.agent\"}}", NULL};
    char *out = xmalloc(1 << 16);
    int st = run_capture(argv, NULL, 60, out, 1 << 16);
    int n = 0;
    if (st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        for (char *line = out; line && *line;) {
            char *nl = strchr(line, '\n');
            if (nl) *nl = '\0';
            char name[256];
            long pid = 0;
            if (sscanf(line, "%255s %ld", name, &pid) == 2 && pid > 0 && pid != self &&
                kill((pid_t)pid, 0) < 0 && errno == ESRCH && strncmp(name, "trainyard-", 10) == 0) {
                log_warn("container %s of agent %ld, which is gone: removing it", name, pid);
                ctr_remove(podman, name, 30);
                n++;
            }
            line = nl ? nl + 1 : NULL;
        }
    }
    free(out);
    return n;
}
