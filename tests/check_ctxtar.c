/* check_ctxtar.c - a job's context (common/ctxtar.c): .trainyardignore's
 * patterns as git reads them; a folder packed into exactly the expected
 * listing (owner 0, no names, modes and times kept, the ignored left out),
 * the same bytes each time; links leading out and FIFOs refused, named;
 * ctx_check accepting what ctx_pack makes and refusing, with the entry
 * named, every hostile archive built here with libarchive's writer; and
 * ctx_unpack writing the tree (modes, links, owner when root) and refusing
 * the hostile ones without writing outside its directory. The CLI runs as
 * the real binary: its `--context` refusals before any upload, and against a
 * real server `submit --context` (uploaded, then already there, the job
 * naming the id), `context push`, `context list` and the server's 413. */
#include "testlib.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/sysmacros.h>
#include <sys/time.h>

#include "../common/ctxtar.h"

static char tmp[256];

static void setup(void) { ty_mkdtemp(tmp, sizeof tmp, "ctxtar"); }
static void teardown(void) { ty_rmrf(tmp); }

static void put(const char *dir, const char *rel, const char *text, mode_t mode) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    char *slash = strrchr(path, '/');
    *slash = '\0';
    ck_assert_int_eq(mkdir_p(path, 0755), 0);
    *slash = '/';
    ck_assert_int_eq(file_write_atomic(path, text, strlen(text), (int)mode), 0);
    ck_assert_int_eq(chmod(path, mode), 0);
    struct timeval tv[2] = {{1700000000, 0}, {1700000000, 0}};
    ck_assert_int_eq(utimes(path, tv), 0);
}

static void dir_at(const char *dir, const char *rel, mode_t mode) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    ck_assert_int_eq(mkdir_p(path, 0755), 0);
    ck_assert_int_eq(chmod(path, mode), 0);
}

static void link_at(const char *dir, const char *rel, const char *target) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    ck_assert_int_eq(symlink(target, path), 0);
}

/* The listing of a gzip'd tar: "type mode uid:gid uname/gname mtime name[ -> target]" a line. */
static char *listing(const char *path) {
    struct archive *a = archive_read_new();
    archive_read_support_filter_gzip(a);
    archive_read_support_format_tar(a);
    ck_assert_int_eq(archive_read_open_filename(a, path, 10240), ARCHIVE_OK);
    buf b;
    buf_init(&b, 1 << 20);
    struct archive_entry *e;
    while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
        mode_t t = archive_entry_filetype(e);
        const char *un = archive_entry_uname(e), *gn = archive_entry_gname(e);
        buf_printf(&b, "%c %04o %lld:%lld %s/%s %lld %s", t == AE_IFDIR ? 'd' : t == AE_IFLNK ? 'l' : '-',
                   (unsigned)archive_entry_perm(e), (long long)archive_entry_uid(e), (long long)archive_entry_gid(e),
                   un && *un ? un : "-", gn && *gn ? gn : "-",
                   t == AE_IFLNK ? 0LL : (long long)archive_entry_mtime(e), archive_entry_pathname(e));
        if (t == AE_IFLNK) buf_printf(&b, " -> %s", archive_entry_symlink(e));
        buf_appends(&b, "\n");
    }
    ck_assert_int_eq(archive_filter_code(a, 0), ARCHIVE_FILTER_GZIP);
    archive_read_free(a);
    return buf_detach(&b, NULL);
}

/* ---------------------------------------------------------------- ignore */

START_TEST(ignore_patterns_as_git) {
    static const struct {
        const char *pats, *path;
        int dir, want;
    } c[] = {
        {"*.log", "a.log", 0, 1},
        {"*.log", "x/y/a.log", 0, 1},
        {"*.log\n!keep.log", "x/keep.log", 0, 0},
        {"*.log\n!keep.log\n*.log", "keep.log", 0, 1},       /* the last match wins */
        {"/build", "build", 1, 1},
        {"/build", "src/build", 1, 0},                       /* a leading slash anchors */
        {"doc/tmp", "doc/tmp", 0, 1},
        {"doc/tmp", "x/doc/tmp", 0, 0},                      /* so does a middle one */
        {"tmp/", "tmp", 1, 1},
        {"tmp/", "tmp", 0, 0},                               /* a trailing slash: folders only */
        {"tmp/", "a/b/tmp", 1, 1},
        {"a/*.c", "a/x.c", 0, 1},
        {"a/*.c", "a/b/x.c", 0, 0},                          /* `*` stays within a name */
        {"a/?.c", "a/x.c", 0, 1},
        {"a/?.c", "a/xy.c", 0, 0},
        {"[abc].txt", "b.txt", 0, 1},
        {"[!abc].txt", "b.txt", 0, 0},
        {"[a-c]x", "cx", 0, 1},
        {"[a-c]x", "dx", 0, 0},
        {"**/cache", "cache", 1, 1},
        {"**/cache", "x/y/cache", 1, 1},
        {"logs/**", "logs/a/b", 0, 1},
        {"logs/**", "logs", 1, 0},                           /* what is inside, not the folder */
        {"a/**/b", "a/b", 0, 1},
        {"a/**/b", "a/x/y/b", 0, 1},
        {"a/**/b", "a/x/y/c", 0, 0},
        {"a**b", "axyb", 0, 1},
        {"a**b", "ax/yb", 0, 0},                             /* a star run inside a name is a star */
        {"# comment\n\n  \nx", "# comment", 0, 0},
        {"\\#hash", "#hash", 0, 1},
        {"\\!bang", "!bang", 0, 1},
        {"trail   ", "trail", 0, 1},                          /* trailing spaces go */
        {"sp\\ ", "sp ", 0, 1},                               /* unless escaped */
        {"*.o\r", "x.o", 0, 1},
        {"", "x", 0, 0},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        ctx_ignore *ig = ctx_ignore_parse(c[i].pats);
        ck_assert_ptr_nonnull(ig);
        ck_assert_msg(ctx_ignore_match(ig, c[i].path, c[i].dir) == c[i].want, "patterns '%s' on '%s' (dir %d): want %d",
                      c[i].pats, c[i].path, c[i].dir, c[i].want);
        ctx_ignore_free(ig);
    }
}
END_TEST

/* ---------------------------------------------------------------- pack */

/* The folder of the packing tests: nested folders, a link inside, modes,
 * and an ignore file with negation, anchoring, folders only and `**`. */
static void make_tree(const char *d) {
    put(d, ".trainyardignore",
        "# build output\n*.log\n!keep.log\n/build/\ntmp/\ndocs/**/*.pdf\n**/cache\n\\#hash\ntrailing   \n", 0644);
    put(d, "a.log", "x", 0644);
    put(d, "keep.log", "kept", 0644);
    put(d, "sub/x.log", "x", 0644);
    put(d, "build/out.o", "x", 0644);
    put(d, "src/build/y.c", "int y;\n", 0644);
    put(d, "tmp/t", "x", 0644);
    put(d, "src/tmp/t", "x", 0644);
    put(d, "other/tmp", "a file named tmp", 0600);
    put(d, "docs/a.pdf", "x", 0644);
    put(d, "docs/x/y/b.pdf", "x", 0644);
    put(d, "docs/readme.md", "# docs\n", 0644);
    put(d, "deep/er/cache/c", "x", 0644);
    put(d, "#hash", "x", 0644);
    put(d, "trailing", "x", 0644);
    put(d, "src/main.py", "print('hi')\n", 0755);
    put(d, "src/setuid.sh", "#!/bin/sh\n", 0755);
    ck_assert_int_eq(chmod(d, 0755), 0);
    char p[2048];
    snprintf(p, sizeof p, "%s/src/setuid.sh", d);
    chmod(p, 04755); /* kept as 0755: no set-id in a context */
    link_at(d, "src/link", "main.py");
    link_at(d, "src/up", "../docs/readme.md");
    put(d, "README", "readme\n", 0644);
    const char *dirs[] = {"sub", "src", "src/build", "other", "docs", "docs/x", "docs/x/y", "deep", "deep/er"};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        snprintf(p, sizeof p, "%s/%s", d, dirs[i]);
        struct timeval tv[2] = {{1700000100, 0}, {1700000100, 0}};
        ck_assert_int_eq(utimes(p, tv), 0);
    }
    dir_at(d, "other", 0750);
}

START_TEST(pack_is_the_expected_listing_and_reproducible) {
    char src[1024], out1[1024], out2[1024];
    snprintf(src, sizeof src, "%s/proj", tmp);
    make_tree(src);
    snprintf(out1, sizeof out1, "%s/one.tar.gz", tmp);
    snprintf(out2, sizeof out2, "%s/two.tar.gz", tmp);
    ctx_info i1, i2;
    char err[512] = "";
    ck_assert_msg(ctx_pack(src, out1, &i1, err, sizeof err) == 0, "%s", err);
    /* the directories' times move when something is made in them; packing
     * again later must still give the same bytes for the same files */
    sleep(1);
    ck_assert_msg(ctx_pack(src, out2, &i2, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(i1.sha256, i2.sha256);
    ck_assert_int_eq(strlen(i1.sha256), 64);
    struct stat st;
    ck_assert_int_eq(stat(out1, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0600);
    ck_assert_int_eq(i1.packed, st.st_size);
    size_t n = 0;
    char *bytes = file_read_all(out1, 1 << 20, &n);
    char hex[65];
    sha256_hex(bytes, n, hex);
    ck_assert_str_eq(hex, i1.sha256);
    ck_assert_int_eq(bytes[4] | bytes[5] | bytes[6] | bytes[7], 0); /* gzip MTIME: none */

    char *l = listing(out1);
    const char *want =
        "- 0644 0:0 -/- 1700000000 .trainyardignore\n"
        "- 0644 0:0 -/- 1700000000 README\n"
        "d 0755 0:0 -/- 1700000100 deep/\n"
        "d 0755 0:0 -/- 1700000100 deep/er/\n"
        "d 0755 0:0 -/- 1700000100 docs/\n"
        "- 0644 0:0 -/- 1700000000 docs/readme.md\n"
        "d 0755 0:0 -/- 1700000100 docs/x/\n"
        "d 0755 0:0 -/- 1700000100 docs/x/y/\n"
        "- 0644 0:0 -/- 1700000000 keep.log\n"
        "d 0750 0:0 -/- 1700000100 other/\n"
        "- 0600 0:0 -/- 1700000000 other/tmp\n"
        "d 0755 0:0 -/- 1700000100 src/\n"
        "d 0755 0:0 -/- 1700000100 src/build/\n"
        "- 0644 0:0 -/- 1700000000 src/build/y.c\n"
        "l 0777 0:0 -/- 0 src/link -> main.py\n"
        "- 0755 0:0 -/- 1700000000 src/main.py\n"
        "- 0755 0:0 -/- 1700000000 src/setuid.sh\n"
        "l 0777 0:0 -/- 0 src/up -> ../docs/readme.md\n"
        "d 0755 0:0 -/- 1700000100 sub/\n";
    ck_assert_msg(strcmp(l, want) == 0, "listing:\n%s\nwanted:\n%s", l, want);
    ck_assert_int_eq(i1.files, 8);
    ck_assert_int_eq(i1.entries, 19);
    ck_assert_int_eq(i1.unpacked, (int64_t)(strlen("# build output\n*.log\n!keep.log\n/build/\ntmp/\ndocs/**/*.pdf\n"
                                                    "**/cache\n\\#hash\ntrailing   \n") +
                                             7 + 7 + 4 + 16 + 7 + 12 + 10));

    /* ctx_check takes what ctx_pack made, with the same counts */
    ctx_limits lim;
    ctx_limits_default(&lim);
    ctx_info ci;
    ck_assert_msg(ctx_check(bytes, n, &lim, &ci, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(ci.files, i1.files);
    ck_assert_int_eq(ci.entries, i1.entries);
    ck_assert_int_eq(ci.unpacked, i1.unpacked);
    ck_assert_int_eq(ci.packed, (int64_t)n);
    free(bytes);
    free(l);
}
END_TEST

START_TEST(pack_refuses_links_out_and_fifos) {
    char d[1024], out[1024], err[512];
    ctx_info info;
    snprintf(out, sizeof out, "%s/o.tar.gz", tmp);
    static const struct {
        const char *name, *target;
    } bad[] = {{"up", "../x"}, {"deep/er", "../../.."}, {"abs", "/etc/passwd"}, {"t", "s/s/.."}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(d, sizeof d, "%s/bad%zu", tmp, i);
        put(d, "deep/f", "x", 0644);
        link_at(d, "s", ".");
        link_at(d, bad[i].name, bad[i].target);
        ck_assert_int_eq(ctx_pack(d, out, &info, err, sizeof err), -1);
        char want[2048];
        snprintf(want, sizeof want, "'%s' is a link that leads out of %s (to %s)", bad[i].name, d, bad[i].target);
        ck_assert_msg(strcmp(err, want) == 0, "got '%s', want '%s'", err, want);
        ck_assert_int_eq(access(out, F_OK), -1); /* nothing left behind */
    }
    snprintf(d, sizeof d, "%s/fifo", tmp);
    put(d, "a/f", "x", 0644);
    char p[2048];
    snprintf(p, sizeof p, "%s/a/pipe", d);
    ck_assert_int_eq(mkfifo(p, 0644), 0);
    ck_assert_int_eq(ctx_pack(d, out, &info, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "'a/pipe' is a FIFO") != NULL, "%s", err);
    /* ignored, it is not looked at */
    put(d, ".trainyardignore", "pipe\n", 0644);
    ck_assert_msg(ctx_pack(d, out, &info, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(info.files, 2);
    /* an archive written into the folder it packs is not packed into itself */
    snprintf(p, sizeof p, "%s/self.tar.gz", d);
    ck_assert_msg(ctx_pack(d, p, &info, err, sizeof err) == 0, "%s", err);
    char *l = listing(p);
    ck_assert_msg(strstr(l, "self.tar.gz") == NULL, "%s", l);
    free(l);
    /* an ignore file that cannot be read stops the packing (it would send
     * what it was meant to leave out) */
    snprintf(d, sizeof d, "%s/badignore", tmp);
    dir_at(d, ".trainyardignore", 0755);
    ck_assert_int_eq(ctx_pack(d, out, &info, err, sizeof err), -1);
    ck_assert_msg(strstr(err, ".trainyardignore") != NULL, "%s", err);
    ck_assert_int_eq(ctx_pack("/nonexistent/dir", out, &info, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "/nonexistent/dir") != NULL, "%s", err);
}
END_TEST

/* ---------------------------------------------------------------- hostile archives */

typedef struct hent {
    const char *name;
    char type;            /* f file, d dir, l symlink, h hard link, c char device, p FIFO (tar has no sockets) */
    const char *arg;      /* file: data; l/h: target */
    int64_t size;         /* file: > 0 writes this many 'x' bytes instead */
} hent;

/* A gzip'd (or, gzip 0, plain) tar of the entries, written with libarchive
 * as an attacker could. */
static char *make_tar(const hent *h, size_t n, int gzip, size_t *len) {
    struct archive *a = archive_write_new();
    ck_assert_int_eq(archive_write_set_format_pax_restricted(a), ARCHIVE_OK);
    if (gzip) ck_assert_int_eq(archive_write_add_filter_gzip(a), ARCHIVE_OK);
    size_t cap = 4 << 20;
    char *out = xmalloc(cap);
    size_t used = 0;
    ck_assert_int_eq(archive_write_open_memory(a, out, cap, &used), ARCHIVE_OK);
    char *junk = xmalloc(1 << 16);
    memset(junk, 'x', 1 << 16);
    for (size_t i = 0; i < n; i++) {
        struct archive_entry *e = archive_entry_new();
        archive_entry_set_pathname(e, h[i].name);
        archive_entry_set_perm(e, 0644);
        archive_entry_set_mtime(e, 1700000000, 0);
        int64_t size = h[i].type == 'f' ? (h[i].size ? h[i].size : (int64_t)strlen(h[i].arg ? h[i].arg : "")) : 0;
        switch (h[i].type) {
        case 'f': archive_entry_set_filetype(e, AE_IFREG); break;
        case 'd': archive_entry_set_filetype(e, AE_IFDIR); archive_entry_set_perm(e, 0755); break;
        case 'l': archive_entry_set_filetype(e, AE_IFLNK); archive_entry_set_symlink(e, h[i].arg); break;
        case 'h': archive_entry_set_filetype(e, AE_IFREG); archive_entry_set_hardlink(e, h[i].arg); break;
        case 'c': archive_entry_set_filetype(e, AE_IFCHR); archive_entry_set_rdev(e, makedev(1, 3)); break;
        case 'p': archive_entry_set_filetype(e, AE_IFIFO); break;
        }
        archive_entry_set_size(e, size);
        ck_assert_int_eq(archive_write_header(a, e), ARCHIVE_OK);
        if (h[i].type == 'f') {
            if (h[i].size) {
                for (int64_t left = size; left > 0;) {
                    size_t k = left > (1 << 16) ? 1 << 16 : (size_t)left;
                    ck_assert_int_eq(archive_write_data(a, junk, k), (la_ssize_t)k);
                    left -= (int64_t)k;
                }
            } else if (size) {
                ck_assert_int_eq(archive_write_data(a, h[i].arg, (size_t)size), size);
            }
        }
        archive_entry_free(e);
    }
    ck_assert_int_eq(archive_write_close(a), ARCHIVE_OK);
    archive_write_free(a);
    free(junk);
    *len = used;
    return out;
}

/* gzip of bytes that are not a tar */
static char *gzip_of(const char *data, size_t n, size_t *len) {
    struct archive *a = archive_write_new();
    ck_assert_int_eq(archive_write_set_format_raw(a), ARCHIVE_OK);
    ck_assert_int_eq(archive_write_add_filter_gzip(a), ARCHIVE_OK);
    size_t cap = 1 << 20;
    char *out = xmalloc(cap);
    size_t used = 0;
    ck_assert_int_eq(archive_write_open_memory(a, out, cap, &used), ARCHIVE_OK);
    struct archive_entry *e = archive_entry_new();
    archive_entry_set_pathname(e, "raw");
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_size(e, (la_int64_t)n);
    ck_assert_int_eq(archive_write_header(a, e), ARCHIVE_OK);
    ck_assert_int_eq(archive_write_data(a, data, n), (la_ssize_t)n);
    archive_entry_free(e);
    ck_assert_int_eq(archive_write_close(a), ARCHIVE_OK);
    archive_write_free(a);
    *len = used;
    return out;
}

typedef struct hostile {
    const char *what;
    hent e[8];
    size_t n;
    int64_t max_files, max_unpacked;  /* 0: the defaults */
    const char *want;                 /* in err */
} hostile;

static const hostile HOSTILE[] = {
    {"dotdot", {{"ok", 'f', "x", 0}, {"../x", 'f', "evil", 0}}, 2, 0, 0, "entry '../x': a '..' component is not allowed"},
    {"absolute", {{"/etc/x", 'f', "evil", 0}}, 1, 0, 0, "entry '/etc/x': an absolute path is not allowed"},
    {"inner dotdot", {{"a/../../x", 'f', "evil", 0}}, 1, 0, 0, "entry 'a/../../x': a '..' component is not allowed"},
    {"char device", {{"null", 'c', NULL, 0}}, 1, 0, 0, "entry 'null': a character device is not allowed"},
    {"fifo", {{"d", 'd', NULL, 0}, {"d/pipe", 'p', NULL, 0}}, 2, 0, 0, "entry 'd/pipe': a FIFO is not allowed"},
    {"link to /etc", {{"etc", 'l', "/etc", 0}}, 1, 0, 0, "entry 'etc': a symbolic link to the absolute path '/etc'"},
    {"link up then through", {{"a", 'l', "..", 0}, {"a/x", 'f', "evil", 0}}, 2, 0, 0,
     "entry 'a': a symbolic link to '..' leads out of the archive"},
    {"write through a link", {{"d", 'd', NULL, 0}, {"a", 'l', "d", 0}, {"a/x", 'f', "evil", 0}}, 3, 0, 0,
     "entry 'a/x': its path passes through 'a', which is a symbolic link"},
    {"link chain out", {{"s", 'l', ".", 0}, {"t", 'l', "s/s/..", 0}}, 2, 0, 0,
     "entry 't': a symbolic link to 's/s/..' leads out of the archive (through its links)"},
    {"link loop", {{"a", 'l', "b", 0}, {"b", 'l', "a", 0}}, 2, 0, 0, "its links loop"},
    {"deep link up", {{"d/e", 'l', "../../x", 0}}, 1, 0, 0, "entry 'd/e': a symbolic link to '../../x' leads out"},
    {"hardlink missing", {{"h", 'h', "nothere", 0}}, 1, 0, 0,
     "entry 'h': a hard link to 'nothere', which is not a file earlier in the archive"},
    {"hardlink later", {{"h", 'h', "f", 0}, {"f", 'f', "x", 0}}, 2, 0, 0, "entry 'h': a hard link to 'f'"},
    {"hardlink dotdot", {{"h", 'h', "../x", 0}}, 1, 0, 0, "entry 'h': hard link target '../x': a '..' component"},
    {"hardlink absolute", {{"h", 'h', "/etc/shadow", 0}}, 1, 0, 0, "entry 'h': hard link target '/etc/shadow'"},
    {"hardlink to a dir", {{"d", 'd', NULL, 0}, {"h", 'h', "d", 0}}, 2, 0, 0, "entry 'h': a hard link to 'd'"},
    {"twice", {{"f", 'f', "a", 0}, {"f", 'f', "b", 0}}, 2, 0, 0, "entry 'f': the name appears twice"},
    {"file then below", {{"f", 'f', "a", 0}, {"f/g", 'f', "b", 0}}, 2, 0, 0,
     "entry 'f/g': its path passes through 'f', which is a file"},
    {"dir turned link", {{"d/f", 'f', "a", 0}, {"d", 'l', "x", 0}}, 2, 0, 0,
     "entry 'd': the name is a directory of earlier entries"},
    {"too many entries", {{"a", 'f', "1", 0}, {"b", 'f', "2", 0}, {"c", 'f', "3", 0}, {"d", 'f', "4", 0}}, 4, 3, 0,
     "entry 'd': more than 3 entries"},
    {"implied dirs count", {{"a/b/c/d", 'f', "1", 0}}, 1, 3, 0, "more than 3 entries"},
    {"too many bytes", {{"a", 'f', NULL, 600}, {"b", 'f', NULL, 600}}, 2, 0, 1000,
     "entry 'b': more than 1000 bytes once unpacked"},
    {"bomb", {{"zeros", 'f', NULL, 3 << 20}}, 1, 0, 1 << 20, "entry 'zeros': more than 1048576 bytes once unpacked"},
};

static void limits_of(const hostile *h, ctx_limits *lim) {
    ctx_limits_default(lim);
    if (h->max_files) lim->max_files = h->max_files;
    if (h->max_unpacked) lim->max_unpacked = h->max_unpacked;
}

START_TEST(check_refuses_hostile_archives) {
    char err[512];
    ctx_limits lim;
    ctx_info info;
    for (size_t i = 0; i < sizeof HOSTILE / sizeof *HOSTILE; i++) {
        const hostile *h = &HOSTILE[i];
        size_t n;
        char *t = make_tar(h->e, h->n, 1, &n);
        limits_of(h, &lim);
        err[0] = '\0';
        ck_assert_msg(ctx_check(t, n, &lim, &info, err, sizeof err) == -1, "%s: accepted", h->what);
        ck_assert_msg(strstr(err, h->want) != NULL, "%s: got '%s', want '%s'", h->what, err, h->want);
        free(t);
    }
    /* not gzip: a plain tar, and bytes that are nothing */
    hent ok[] = {{"a", 'f', "x", 0}};
    size_t n;
    char *t = make_tar(ok, 1, 0, &n);
    ctx_limits_default(&lim);
    ck_assert_int_eq(ctx_check(t, n, &lim, &info, err, sizeof err), -1);
    ck_assert_str_eq(err, "not a gzip'd tar: the data is not gzip");
    free(t);
    ck_assert_int_eq(ctx_check("hello", 5, &lim, &info, err, sizeof err), -1);
    ck_assert_str_eq(err, "not a gzip'd tar: the data is not gzip");
    ck_assert_int_eq(ctx_check("", 0, &lim, &info, err, sizeof err), -1);
    /* gzip of garbage */
    char garbage[3000];
    for (size_t i = 0; i < sizeof garbage; i++) garbage[i] = (char)(i * 7 + 3);
    t = gzip_of(garbage, sizeof garbage, &n);
    ck_assert_int_eq(ctx_check(t, n, &lim, &info, err, sizeof err), -1);
    ck_assert_msg(strncmp(err, "not a gzip'd tar: ", 18) == 0, "%s", err);
    free(t);
    /* a cut archive */
    hent two[] = {{"a", 'f', NULL, 200000}, {"b", 'f', "x", 0}};
    t = make_tar(two, 2, 1, &n);
    ck_assert_int_eq(ctx_check(t, n / 2, &lim, &info, err, sizeof err), -1);
    free(t);
    /* what is allowed: "./" and "./x" names, a link inside, a hard link to an
     * earlier file, directories implied */
    hent fine[] = {{"./", 'd', NULL, 0}, {"./x", 'f', "abc", 0}, {"d/e/f", 'f', "de", 0}, {"d/l", 'l', "e/f", 0},
                   {"h", 'h', "x", 0},   {"up", 'l', "d/../x", 0}};
    t = make_tar(fine, 6, 1, &n);
    ck_assert_msg(ctx_check(t, n, &lim, &info, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(info.files, 2);
    ck_assert_int_eq(info.entries, 6);
    ck_assert_int_eq(info.unpacked, 5);
    free(t);
}
END_TEST

/* ---------------------------------------------------------------- unpack */

/* "type mode name" lines of a tree, in name order (links: "-> target"). */
static void tree_lines(const char *root, const char *rel, buf *b) {
    char path[1024];
    snprintf(path, sizeof path, "%s%s%s", root, rel[0] ? "/" : "", rel);
    struct dirent **ents;
    int n = scandir(path, &ents, NULL, alphasort);
    ck_assert_int_ge(n, 0);
    for (int i = 0; i < n; i++) {
        const char *nm = ents[i]->d_name;
        if (strcmp(nm, ".") && strcmp(nm, "..")) {
            char r[1024], p[2048];
            snprintf(r, sizeof r, "%s%s%s", rel, rel[0] ? "/" : "", nm);
            snprintf(p, sizeof p, "%s/%s", root, r);
            struct stat st;
            ck_assert_int_eq(lstat(p, &st), 0);
            if (S_ISLNK(st.st_mode)) {
                char t[512];
                ssize_t k = readlink(p, t, sizeof t - 1);
                ck_assert_int_ge(k, 0);
                t[k] = '\0';
                buf_printf(b, "l %s -> %s\n", r, t);
            } else {
                buf_printf(b, "%c %04o %s\n", S_ISDIR(st.st_mode) ? 'd' : '-', (unsigned)(st.st_mode & 07777), r);
            }
            if (S_ISDIR(st.st_mode)) tree_lines(root, r, b);
        }
        free(ents[i]);
    }
    free(ents);
}

START_TEST(unpack_writes_the_tree) {
    char src[1024], tar[1024], dst[1024], err[512];
    snprintf(src, sizeof src, "%s/proj", tmp);
    make_tree(src);
    snprintf(tar, sizeof tar, "%s/c.tar.gz", tmp);
    ctx_info info;
    ck_assert_msg(ctx_pack(src, tar, &info, err, sizeof err) == 0, "%s", err);
    snprintf(dst, sizeof dst, "%s/out", tmp);
    ck_assert_int_eq(mkdir(dst, 0700), 0);
    ctx_limits lim;
    ctx_limits_default(&lim);
    int root = geteuid() == 0;
    uid_t uid = root ? 4242 : (uid_t)-1;
    gid_t gid = root ? 4343 : (gid_t)-1;
    ck_assert_msg(ctx_unpack(tar, dst, uid, gid, &lim, err, sizeof err) == 0, "%s", err);
    buf b;
    buf_init(&b, 1 << 20);
    tree_lines(dst, "", &b);
    const char *expect =
        "- 0644 .trainyardignore\n"
        "- 0644 README\n"
        "d 0755 deep\n"
        "d 0755 deep/er\n"
        "d 0755 docs\n"
        "- 0644 docs/readme.md\n"
        "d 0755 docs/x\n"
        "d 0755 docs/x/y\n"
        "- 0644 keep.log\n"
        "d 0750 other\n"
        "- 0600 other/tmp\n"
        "d 0755 src\n"
        "d 0755 src/build\n"
        "- 0644 src/build/y.c\n"
        "l src/link -> main.py\n"
        "- 0755 src/main.py\n"
        "- 0755 src/setuid.sh\n"
        "l src/up -> ../docs/readme.md\n"
        "d 0755 sub\n";
    ck_assert_msg(strcmp(b.data, expect) == 0, "tree:\n%s\nwanted:\n%s", b.data, expect);
    buf_release(&b);
    char p[2048];
    snprintf(p, sizeof p, "%s/src/link", dst);
    size_t n = 0;
    char *s = file_read_all(p, 1024, &n);
    ck_assert_ptr_nonnull(s);
    ck_assert_str_eq(s, "print('hi')\n");
    free(s);
    struct stat st;
    snprintf(p, sizeof p, "%s/src/main.py", dst);
    ck_assert_int_eq(stat(p, &st), 0);
    ck_assert_int_eq(st.st_mtime, 1700000000);
    snprintf(p, sizeof p, "%s/other", dst);
    ck_assert_int_eq(stat(p, &st), 0);
    ck_assert_int_eq(st.st_mtime, 1700000100);
    if (root) {
        const char *owned[] = {"README", "docs", "docs/x/y", "src/link", "other/tmp"};
        for (size_t i = 0; i < sizeof owned / sizeof *owned; i++) {
            snprintf(p, sizeof p, "%s/%s", dst, owned[i]);
            ck_assert_int_eq(lstat(p, &st), 0);
            ck_assert_msg(st.st_uid == 4242 && st.st_gid == 4343, "%s is %d:%d", owned[i], (int)st.st_uid, (int)st.st_gid);
        }
    } else {
        fprintf(stderr, "unpack_writes_the_tree: ownership not checked (not root)\n");
    }
}
END_TEST

START_TEST(unpack_refuses_hostile_archives_inside_its_dir) {
    char err[512], tar[1024], dst[1024], probe[1024];
    ctx_limits lim;
    for (size_t i = 0; i < sizeof HOSTILE / sizeof *HOSTILE; i++) {
        const hostile *h = &HOSTILE[i];
        char box[512];
        snprintf(box, sizeof box, "%s/box%zu", tmp, i);
        ck_assert_int_eq(mkdir(box, 0700), 0);
        snprintf(dst, sizeof dst, "%s/out", box);
        ck_assert_int_eq(mkdir(dst, 0700), 0);
        size_t n;
        char *t = make_tar(h->e, h->n, 1, &n);
        snprintf(tar, sizeof tar, "%s/../box%zu.tar.gz", box, i);
        ck_assert_int_eq(file_write_atomic(tar, t, n, 0600), 0);
        free(t);
        limits_of(h, &lim);
        err[0] = '\0';
        ck_assert_msg(ctx_unpack(tar, dst, (uid_t)-1, (gid_t)-1, &lim, err, sizeof err) == -1, "%s: accepted", h->what);
        ck_assert_msg(strstr(err, h->want) != NULL, "%s: got '%s', want '%s'", h->what, err, h->want);
        /* the box holds only the target folder: nothing landed beside it */
        DIR *d = opendir(box);
        ck_assert_ptr_nonnull(d);
        struct dirent *de;
        while ((de = readdir(d)) != NULL)
            ck_assert_msg(!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || !strcmp(de->d_name, "out"),
                          "%s: %s written beside the target", h->what, de->d_name);
        closedir(d);
    }
    snprintf(probe, sizeof probe, "%s/x", tmp);
    ck_assert_int_eq(access(probe, F_OK), -1);
    ck_assert_int_eq(access("/etc/x", F_OK), -1);
    /* an archive whose path leads through a link that is already there (a
     * target that was not empty): never followed */
    char box[512];
    snprintf(box, sizeof box, "%s/pre", tmp);
    snprintf(dst, sizeof dst, "%s/out", box);
    ck_assert_int_eq(mkdir_p(dst, 0700), 0);
    char p[2048];
    snprintf(p, sizeof p, "%s/a", dst);
    ck_assert_int_eq(symlink(box, p), 0);
    hent through[] = {{"a/x", 'f', "evil", 0}};
    size_t n;
    char *t = make_tar(through, 1, 1, &n);
    snprintf(tar, sizeof tar, "%s/pre.tar.gz", tmp);
    ck_assert_int_eq(file_write_atomic(tar, t, n, 0600), 0);
    free(t);
    ctx_limits_default(&lim);
    ck_assert_int_eq(ctx_unpack(tar, dst, (uid_t)-1, (gid_t)-1, &lim, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "entry 'a/x'") != NULL, "%s", err);
    snprintf(p, sizeof p, "%s/x", box);
    ck_assert_int_eq(access(p, F_OK), -1);
    /* set-id bits are dropped */
    hent suid[] = {{"s", 'f', "#!/bin/sh\n", 0}};
    struct archive *a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    archive_write_add_filter_gzip(a);
    ck_assert_int_eq(archive_write_open_filename(a, tar), ARCHIVE_OK);
    struct archive_entry *e = archive_entry_new();
    archive_entry_set_pathname(e, suid[0].name);
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 06755);
    archive_entry_set_size(e, 10);
    ck_assert_int_eq(archive_write_header(a, e), ARCHIVE_OK);
    ck_assert_int_eq(archive_write_data(a, suid[0].arg, 10), 10);
    archive_entry_free(e);
    archive_write_close(a);
    archive_write_free(a);
    snprintf(dst, sizeof dst, "%s/suid", tmp);
    ck_assert_int_eq(mkdir(dst, 0700), 0);
    ck_assert_msg(ctx_unpack(tar, dst, (uid_t)-1, (gid_t)-1, &lim, err, sizeof err) == 0, "%s", err);
    snprintf(p, sizeof p, "%s/s", dst);
    struct stat st;
    ck_assert_int_eq(stat(p, &st), 0);
    ck_assert_int_eq(st.st_mode & 07777, 0755);
}
END_TEST

/* ---------------------------------------------------------------- the CLI, before any upload */

static int run_cli(const char *args, buf *errout) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1 >/dev/null", ty_bin(), args);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    buf_init(errout, 1 << 20);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, p)) > 0) ck_assert_int_eq(buf_append(errout, chunk, n), 0);
    int st = pclose(p);
    ck_assert(WIFEXITED(st));
    return WEXITSTATUS(st);
}

START_TEST(cli_context_refusals_before_upload) {
    /* a port nothing listens on: these must fail before reaching it */
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", ty_free_port());
    setenv("TRAINYARD_URL", url, 1);
    setenv("TRAINYARD_TOKEN", "ty_test", 1);
    char src[1024], job[1024], args[4096];
    snprintf(src, sizeof src, "%s/proj", tmp);
    put(src, "train.py", "print(1)\n", 0644);
    snprintf(job, sizeof job, "%s/engine.json", tmp);
    const char *engine = "{\"model\": {\"layers\": []}}";
    ck_assert_int_eq(file_write_atomic(job, engine, strlen(engine), 0600), 0);
    buf out;
    snprintf(args, sizeof args, "submit '%s' --context '%s'", job, src);
    ck_assert_int_eq(run_cli(args, &out), 2);
    ck_assert_msg(strstr(out.data, "--context") && strstr(out.data, "command"), "%s", out.data);
    buf_release(&out);
    /* a link leading out: refused, named, before the upload */
    link_at(src, "secrets", "../../etc");
    snprintf(job, sizeof job, "%s/cmd.json", tmp);
    const char *cmdjob = "{\"command\": {\"argv\": [\"python3\", \"train.py\"]}}";
    ck_assert_int_eq(file_write_atomic(job, cmdjob, strlen(cmdjob), 0600), 0);
    snprintf(args, sizeof args, "submit '%s' --context '%s'", job, src);
    ck_assert_int_eq(run_cli(args, &out), 2);
    ck_assert_msg(strstr(out.data, "'secrets' is a link that leads out of") != NULL, "%s", out.data);
    buf_release(&out);
    /* packed fine, the server away: 3 */
    snprintf(args, sizeof args, "%s/secrets", src);
    ck_assert_int_eq(unlink(args), 0);
    snprintf(args, sizeof args, "context push '%s'", src);
    ck_assert_int_eq(run_cli(args, &out), 3);
    ck_assert_msg(strstr(out.data, "cannot reach the server") != NULL, "%s", out.data);
    buf_release(&out);
}
END_TEST

/* ---------------------------------------------------------------- the CLI against a real server */

static ty_proc srv;
static char team_tok[128];

static void srv_start(void) {
    setup();
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "ctxsrv");
    const char *extra[] = {"--context-max-mb", "1", NULL};
    ty_server_start_args(&srv, "server", extra);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    setenv("TRAINYARD_URL", srv.url, 1);
    setenv("TRAINYARD_TOKEN", team_tok, 1);
}

static void srv_stop(void) {
    ty_kill(&srv, SIGTERM);
    ty_rmrf(srv.dir);
    teardown();
}

/* Runs `trainyard ARGS`, stdout and stderr together into out; its exit code. */
static int run_cli_all(const char *args, buf *out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", ty_bin(), args);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    buf_init(out, 1 << 20);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, p)) > 0) ck_assert_int_eq(buf_append(out, chunk, n), 0);
    int st = pclose(p);
    ck_assert(WIFEXITED(st));
    return WEXITSTATUS(st);
}

START_TEST(cli_submit_with_context) {
    char src[1024], job[1024], args[4096], want[2048], tar[1024], err[512];
    snprintf(src, sizeof src, "%s/proj", tmp);
    put(src, "train.py", "print('trained')\n", 0644);
    put(src, "lib/util.py", "X = 1\n", 0644);
    put(src, ".trainyardignore", "*.pyc\n", 0644);
    put(src, "lib/util.pyc", "junk", 0644);
    /* the id the server must answer: the sha256 of the same packing here */
    snprintf(tar, sizeof tar, "%s/local.tar.gz", tmp);
    ctx_info info;
    ck_assert_msg(ctx_pack(src, tar, &info, err, sizeof err) == 0, "%s", err);
    char id[80];
    snprintf(id, sizeof id, "sha256:%s", info.sha256);

    snprintf(job, sizeof job, "%s/cmd.json", tmp);
    const char *cmdjob = "{\"name\": \"ctx\", \"command\": {\"argv\": [\"python3\", \"train.py\"]}}";
    ck_assert_int_eq(file_write_atomic(job, cmdjob, strlen(cmdjob), 0600), 0);
    snprintf(args, sizeof args, "submit '%s' --context '%s'", job, src);
    buf out;
    ck_assert_int_eq(run_cli_all(args, &out), 0);
    snprintf(want, sizeof want, "context: %s packed (3 files, %lld KiB) as %s (uploaded)\n", src,
             (long long)((info.packed + 1023) / 1024), id);
    ck_assert_msg(strstr(out.data, want) != NULL, "got:\n%s\nwanted:\n%s", out.data, want);
    ck_assert_msg(strstr(out.data, "submitted job ") != NULL, "%s", out.data);
    long long jid = atoll(strstr(out.data, "submitted job ") + 14);
    buf_release(&out);
    /* the job names the context */
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld", jid);
    char *body = ty_http_text(srv.url, team_tok, path);
    ck_assert_msg(strstr(body, id) != NULL, "job %lld does not name %s: %s", jid, id, body);
    free(body);
    /* the same folder again: the same id, which the server has */
    ck_assert_int_eq(run_cli_all(args, &out), 0);
    snprintf(want, sizeof want, "as %s (already on the server)\n", id);
    ck_assert_msg(strstr(out.data, want) != NULL, "%s", out.data);
    buf_release(&out);
    /* context push prints the id; context list shows it */
    snprintf(args, sizeof args, "context push '%s'", src);
    ck_assert_int_eq(run_cli_all(args, &out), 0);
    snprintf(want, sizeof want, "(already on the server)\n%s\n", id); /* the line on stderr, the id on stdout */
    ck_assert_msg(strstr(out.data, want) != NULL, "%s", out.data);
    buf_release(&out);
    ck_assert_int_eq(run_cli_all("context list", &out), 0);
    ck_assert_msg(strstr(out.data, id) != NULL && strstr(out.data, "FILES") != NULL, "%s", out.data);
    buf_release(&out);
    /* over the server's limit (--context-max-mb 1): its refusal, exit 1 */
    char big[1024];
    snprintf(big, sizeof big, "%s/big", tmp);
    dir_at(big, "", 0755);
    size_t n = 3u << 19;
    char *noise = xmalloc(n + 1);
    uint32_t x = 2463534242u;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        noise[i] = (char)(x & 0xff);
    }
    char noisy[2048];
    snprintf(noisy, sizeof noisy, "%s/noise.bin", big);
    ck_assert_int_eq(file_write_atomic(noisy, noise, n, 0644), 0);
    free(noise);
    snprintf(args, sizeof args, "submit '%s' --context '%s'", job, big);
    ck_assert_int_eq(run_cli_all(args, &out), 1);
    ck_assert_msg(strstr(out.data, "error: ") != NULL && strstr(out.data, "HTTP 413") != NULL, "%s", out.data);
    ck_assert_msg(strstr(out.data, "submitted job") == NULL, "%s", out.data);
    buf_release(&out);
}
END_TEST

int main(void) {
    Suite *s = suite_create("ctxtar");
    TCase *tc = ty_tcase(s, "ctxtar", setup, teardown, 120);
    tcase_add_test(tc, ignore_patterns_as_git);
    tcase_add_test(tc, pack_is_the_expected_listing_and_reproducible);
    tcase_add_test(tc, pack_refuses_links_out_and_fifos);
    tcase_add_test(tc, check_refuses_hostile_archives);
    tcase_add_test(tc, unpack_writes_the_tree);
    tcase_add_test(tc, unpack_refuses_hostile_archives_inside_its_dir);
    tcase_add_test(tc, cli_context_refusals_before_upload);
    TCase *tcs = ty_tcase(s, "cli_server", srv_start, srv_stop, 120);
    tcase_add_test(tcs, cli_submit_with_context);
    return ty_run_suite(s);
}
