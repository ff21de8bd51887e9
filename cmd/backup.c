/* backup.c - `trainyard backup DEST` (through the running server, or of a
 * data directory no server runs on with --data) and `trainyard restore SRC
 * --data DIR` (storage/backup.h does the work). */
#include "backup.h"
#include "../client/client.h"
#include "../common/util.h"
#include "../storage/backup.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

static void backup_usage(FILE *f) {
    fprintf(f,
            "usage: trainyard backup DEST [--url URL] [--token TOKEN] [--ca-cert FILE] [--json]\n"
            "       trainyard backup DEST --data DIR [--blob-credentials FILE] [--json]\n"
            "  DEST          a folder on the server's machine (made if missing; not inside the data\n"
            "                directory): the backup goes to DEST/trainyard-backup-<UTC time>/, its\n"
            "                manifest.json written last; or s3://BUCKET[/PREFIX]?endpoint=URL&region=R:\n"
            "                the same files under backups/trainyard-backup-<UTC time>/ (the server's\n"
            "                --backup-credentials; --blob-credentials with --data)\n"
            "  --url, --token  the running server and an admin token (default TRAINYARD_URL,\n"
            "                TRAINYARD_TOKEN or TRAINYARD_TOKEN_FILE: give DATA/admin.token); the server\n"
            "                takes the backup while it serves (POST /api/v1/backups); URL1,URL2,...:\n"
            "                several servers on one database, the one that leads takes it\n"
            "  --data DIR    back up the data directory DIR, whose server is stopped, without one\n"
            "  --blob-credentials FILE  an s3 DEST's credentials (AWS shared-credentials, 0600), with --data\n"
            "  --json        print the summary as JSON\n");
}

static void restore_usage(FILE *f) {
    fprintf(f,
            "usage: trainyard restore SRC --data DIR [--force] [--blob-credentials FILE] [--allow-missing]\n"
            "  SRC           a backup (DEST/trainyard-backup-<UTC time>), or a folder of backups: the\n"
            "                newest complete one; or s3://BUCKET[/PREFIX]?endpoint=URL: the newest complete\n"
            "                one under backups/ (with --blob-credentials)\n"
            "  --data DIR    the data directory to fill (then: trainyard server --data DIR)\n"
            "  --force       replace the database DIR holds (refused without)\n"
            "  --blob-credentials FILE  the s3 store's credentials (as the server's), to check that\n"
            "                every object the backup names is there\n"
            "  --allow-missing  restore even when some are not (their checkpoints marked deleted)\n");
}

static void print_summary(const cJSON *o) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "path"), *st = cJSON_GetObjectItemCaseSensitive(o, "store");
    if (cJSON_IsString(st)) printf("in %s: ", st->valuestring);
    double v[8];
    const char *k[8] = {"db_bytes", "snapshot_ms", "files", "blobs", "blobs_linked", "blob_bytes_copied", "blobs_missing",
                        "took_ms"};
    for (int i = 0; i < 8; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k[i]);
        v[i] = cJSON_IsNumber(x) ? x->valuedouble : 0;
    }
    printf("backup %s: database %.1f MiB (snapshot %.0f ms, writers not blocked), %.0f files, %.0f checkpoint and "
           "context files (%.0f hard links, %.1f MiB copied)%s, took %.0f ms\n",
           cJSON_IsString(p) ? p->valuestring : "?", v[0] / 1048576.0, v[1], v[2], v[3], v[4], v[5] / 1048576.0,
           v[6] > 0 ? ", SOME MISSING (see the manifest)" : "", v[7]);
    if (v[6] > 0) printf("  %.0f files the database names were missing or damaged in the data directory\n", v[6]);
}

/* DEST made absolute (the server resolves nothing against its own folder). */
static int absolute(const char *dest, char *out, size_t cap) {
    if (dest[0] == '/') return sfmt(out, cap, "%s", dest);
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) return -1;
    return sfmt(out, cap, "%s/%s", cwd, dest);
}

static int backup_offline(const char *dir, const char *dest, const char *creds, int json) {
    char lock[PATH_MAX + 16];
    if (sfmt(lock, sizeof lock, "%s/server.lock", dir) < 0) {
        fprintf(stderr, "trainyard: --data: path too long\n");
        return 2;
    }
    /* held while it runs: no server starts on the directory meanwhile */
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "trainyard: cannot open %s: %s\n", lock, strerror(errno));
        return 1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        fprintf(stderr, "trainyard: a trainyard server runs on %s: ask it (trainyard backup DEST without --data, with "
                "the admin token)\n", dir);
        close(fd);
        return 1;
    }
    backup_summary s;
    char err[1024];
    int rc = strncmp(dest, "s3://", 5) == 0 ? backup_run_s3(dir, dest, creds, &s, err, sizeof err)
                                             : backup_run(dir, dest, &s, err, sizeof err);
    close(fd);
    if (rc < 0) {
        fprintf(stderr, "trainyard: backup failed: %s\n", err);
        return 1;
    }
    cJSON *o = backup_summary_json(&s);
    if (json) {
        char *t = cJSON_Print(o);
        if (t) printf("%s\n", t);
        free(t);
    } else {
        print_summary(o);
    }
    cJSON_Delete(o);
    return s.blobs_missing ? 3 : 0;
}

static int backup_online(const char *url, const char *token, const char *dest, int json) {
    client c;
    if (client_init(&c, url, token) < 0) {
        fprintf(stderr, "trainyard: cannot start the HTTP client\n");
        return 1;
    }
    c.timeout_ms = 24L * 3600 * 1000; /* answered when the backup is done */
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "dest", dest);
    char *body = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    client_reply r;
    int rc = client_request(&c, "POST", "/api/v1/backups", body, body ? strlen(body) : 0, NULL, &r);
    free(body);
    client_release(&c);
    if (rc < 0) {
        fprintf(stderr, "trainyard: cannot reach %s: %s\n", url, r.error);
        client_reply_release(&r);
        return 1;
    }
    cJSON *o = cJSON_ParseWithLength(r.body.data ? r.body.data : "", r.body.len);
    int out = 0;
    if (r.status != 201) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
        fprintf(stderr, "trainyard: backup failed: %ld %s\n", r.status,
                cJSON_IsString(m) ? m->valuestring : (r.body.data ? r.body.data : ""));
        out = 1;
    } else if (!o) {
        fprintf(stderr, "trainyard: the server's answer is not JSON\n");
        out = 1;
    } else if (json) {
        printf("%.*s\n", (int)r.body.len, r.body.data);
    } else {
        print_summary(o);
    }
    const cJSON *miss = cJSON_GetObjectItemCaseSensitive(o, "blobs_missing");
    if (out == 0 && cJSON_IsNumber(miss) && miss->valuedouble > 0) out = 3;
    cJSON_Delete(o);
    client_reply_release(&r);
    return out;
}

int cmd_backup(int argc, char **argv) {
    static const struct option longopts[] = {
        {"url", required_argument, NULL, 'u'},     {"token", required_argument, NULL, 't'},
        {"ca-cert", required_argument, NULL, 'A'}, {"data", required_argument, NULL, 'd'},
        {"json", no_argument, NULL, 'j'},          {"help", no_argument, NULL, 'h'},
        {"blob-credentials", required_argument, NULL, 'c'},
        {NULL, 0, NULL, 0},
    };
    const char *url = NULL, *token = NULL, *data = NULL, *creds = NULL;
    int json = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'u': url = optarg; break;
        case 't': token = optarg; break;
        case 'd': data = optarg; break;
        case 'c': creds = optarg; break;
        case 'j': json = 1; break;
        case 'A': {
            char cerr[512];
            if (client_trust_ca_file(optarg, "--ca-cert", cerr, sizeof cerr) < 0) {
                fprintf(stderr, "trainyard: %s\n", cerr);
                return 2;
            }
            break;
        }
        case 'h': backup_usage(stdout); return 0;
        default: backup_usage(stderr); return 2;
        }
    }
    if (argc - optind != 1) {
        backup_usage(stderr);
        return 2;
    }
    const char *dest = argv[optind];
    int s3 = strncmp(dest, "s3://", 5) == 0;
    if (creds && (!data || !s3)) {
        fprintf(stderr, "trainyard: --blob-credentials goes with --data and an s3:// DEST (else the server's "
                "--backup-credentials serve)\n");
        return 2;
    }
    char abs[PATH_MAX];
    if (s3 ? sfmt(abs, sizeof abs, "%s", dest) < 0 : absolute(dest, abs, sizeof abs) < 0) {
        fprintf(stderr, "trainyard: DEST: path too long\n");
        return 2;
    }
    if (data) {
        if (url || token) {
            fprintf(stderr, "trainyard: --data backs up a stopped server's directory itself: no --url or --token\n");
            return 2;
        }
        return backup_offline(data, abs, creds, json);
    }
    char u[512], t[256], err[512];
    if (url) snprintf(u, sizeof u, "%s", url);
    else client_default_url(u, sizeof u);
    int n_urls = 0;
    if (client_url_list_check(u, url ? "--url" : "TRAINYARD_URL", &n_urls, err, sizeof err) < 0) {
        fprintf(stderr, "trainyard: %s\n", err);
        return 2;
    }
    if (token) snprintf(t, sizeof t, "%s", token);
    else if (client_default_token(t, sizeof t, err, sizeof err) < 0) {
        fprintf(stderr, "trainyard: %s\n", err);
        return 2;
    }
    return backup_online(u, t, abs, json);
}

int cmd_restore(int argc, char **argv) {
    static const struct option longopts[] = {
        {"data", required_argument, NULL, 'd'},
        {"force", no_argument, NULL, 'f'},
        {"blob-credentials", required_argument, NULL, 'c'},
        {"allow-missing", no_argument, NULL, 'm'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *data = NULL, *creds = NULL;
    int force = 0, allow_missing = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'd': data = optarg; break;
        case 'f': force = 1; break;
        case 'c': creds = optarg; break;
        case 'm': allow_missing = 1; break;
        case 'h': restore_usage(stdout); return 0;
        default: restore_usage(stderr); return 2;
        }
    }
    if (argc - optind != 1 || !data) {
        restore_usage(stderr);
        return 2;
    }
    const char *src = argv[optind];
    restore_summary s;
    char err[1024];
    restore_opts ro = {src, data, force, creds, allow_missing};
    int rc = strncmp(src, "s3://", 5) == 0 ? backup_restore_s3(&ro, &s, err, sizeof err)
                                           : backup_restore(&ro, &s, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "trainyard: restore refused: %s\n", err);
        return 1;
    }
    char remote[160] = "";
    if (s.checkpoints_remote)
        snprintf(remote, sizeof remote, ", %lld in another store%s", (long long)s.checkpoints_remote,
                 s.remote_missing ? "" : ", all present");
    if (s.remote_missing)
        snprintf(remote + strlen(remote), sizeof remote - strlen(remote), ", %lld of them missing and marked deleted",
                 (long long)s.remote_missing);
    printf("restored %s from %s into %s: %lld jobs, %lld checkpoints (%lld local%s), %d files, %d checkpoint and "
           "context files checked%s, schema %d\n",
           s.created_at, s.path, data, (long long)s.jobs, (long long)s.checkpoints, (long long)s.checkpoints_local,
           remote, s.files, s.blobs, s.blobs_missing ? " (some were missing when the backup was taken: marked deleted, see its manifest)" : "",
           s.schema_version);
    return 0;
}
