/* checkpoint.c - safetensors encode/decode of a model's state (see
 * checkpoint.h). Decoding validates the whole file before touching the
 * model, so a bad file leaves a running model as it was. */
#include "checkpoint.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/util.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoint.c writes the host's floats as little-endian: add byte swapping for this host"
#endif

#define CKPT_FORMAT "trainyard-1"

typedef struct entry {
    char name[MODEL_NAME_MAX + 64];
    float *data;          /* into the model's params or slots */
    size_t size;          /* floats */
    int rank;
    int shape[4];
} entry;

/* Every tensor of the file in order: weights, then each slot. Returns the
 * count; *out is heap (caller frees). */
static int entries_of(const model *mc, entry **out)
{
    model *m = (model *)mc; /* accessors hand out mutable pointers */
    int nt = model_tensor_count(m), ns = model_slot_count(m), nst = model_state_tensor_count(m);
    entry *e = xcalloc((size_t)nt * (size_t)(1 + ns) + (size_t)nst + 1, sizeof *e);
    int k = 0;
    for (int s = -1; s < ns; s++) {
        for (int i = 0; i < nt; i++) {
            const model_tensor *t = model_tensor_at(m, i);
            entry *x = &e[k++];
            if (s < 0) {
                snprintf(x->name, sizeof x->name, "%s", t->name);
                x->data = model_params(m) + t->offset;
            } else {
                snprintf(x->name, sizeof x->name, "optimizer.%s.%s", t->name, model_slot_name(m, s));
                x->data = model_slots(m) + (size_t)s * model_param_count(m) + t->offset;
            }
            x->size = t->size;
            x->rank = t->rank;
            memcpy(x->shape, t->shape, sizeof x->shape);
        }
    }
    /* the non-trainable state: batch normalization's moving statistics */
    for (int i = 0; i < nst; i++) {
        const model_tensor *t = model_state_tensor_at(m, i);
        entry *x = &e[k++];
        snprintf(x->name, sizeof x->name, "%s", t->name);
        x->data = model_state(m) + t->offset;
        x->size = t->size;
        x->rank = t->rank;
        memcpy(x->shape, t->shape, sizeof x->shape);
    }
    *out = e;
    return k;
}

static int add_str(cJSON *o, const char *k, const char *v)
{
    return cJSON_AddStringToObject(o, k, v) ? 0 : -1;
}

static int add_long(cJSON *o, const char *k, long v)
{
    char b[32];
    snprintf(b, sizeof b, "%ld", v);
    return add_str(o, k, b);
}

static int add_u64(cJSON *o, const char *k, uint64_t v)
{
    char b[32];
    snprintf(b, sizeof b, "%016" PRIx64, v);
    return add_str(o, k, b);
}

int checkpoint_encode(const model *m, const ckpt_meta *meta, unsigned char **out, size_t *len,
                      char err[ERR_MAX])
{
    int ret = -1;
    entry *e = NULL;
    char *hdr = NULL;
    cJSON *root = cJSON_CreateObject();
    *out = NULL;
    *len = 0;
    if (!root) {
        snprintf(err, ERR_MAX, "out of memory");
        return -1;
    }
    int n = entries_of(m, &e);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        cJSON *t = cJSON_AddObjectToObject(root, e[i].name);
        cJSON *shape = t ? cJSON_AddArrayToObject(t, "shape") : NULL;
        cJSON *offs = t ? cJSON_AddArrayToObject(t, "data_offsets") : NULL;
        if (!t || !shape || !offs || add_str(t, "dtype", "F32"))
            goto oom;
        for (int r = 0; r < e[i].rank; r++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber(e[i].shape[r]));
        size_t b = off, end = off + e[i].size * sizeof(float);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)b));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)end));
        off = end;
    }
    {
        cJSON *md = cJSON_AddObjectToObject(root, "__metadata__");
        uint64_t rs[4];
        model_rng_get(m, rs);
        char rng[80];
        snprintf(rng, sizeof rng, "%016" PRIx64 ",%016" PRIx64 ",%016" PRIx64 ",%016" PRIx64,
                 rs[0], rs[1], rs[2], rs[3]);
        char dbl[40];
        snprintf(dbl, sizeof dbl, "%a", meta->epoch_loss_sum);
        if (!md || add_str(md, "format", CKPT_FORMAT) || add_str(md, "model", model_signature(m)) ||
            add_str(md, "optimizer", model_optimizer_name(m)) ||
            add_long(md, "iterations", model_iterations(m)) || add_str(md, "rng", rng) ||
            add_long(md, "epoch", meta->epoch) || add_long(md, "step", meta->step) ||
            add_long(md, "batch_pos", meta->batch_pos) || add_u64(md, "data_rng", meta->data_rng) ||
            add_str(md, "epoch_loss_sum", dbl) || add_long(md, "epoch_correct", meta->epoch_correct) ||
            add_long(md, "epoch_seen", meta->epoch_seen) || add_str(md, "spec_hash", meta->spec_hash))
            goto oom;
    }
    hdr = cJSON_PrintUnformatted(root);
    if (!hdr)
        goto oom;
    size_t hlen = strlen(hdr);
    size_t padded = (hlen + 7) / 8 * 8; /* spaces keep the data 8-byte aligned */
    size_t total = 8 + padded + off;
    unsigned char *fb = xmalloc(total);
    uint64_t hl = padded;
    for (int i = 0; i < 8; i++)
        fb[i] = (unsigned char)(hl >> (8 * i));
    memcpy(fb + 8, hdr, hlen);
    memset(fb + 8 + hlen, ' ', padded - hlen);
    unsigned char *p = fb + 8 + padded;
    for (int i = 0; i < n; i++) {
        memcpy(p, e[i].data, e[i].size * sizeof(float));
        p += e[i].size * sizeof(float);
    }
    *out = fb;
    *len = total;
    ret = 0;
    goto done;
oom:
    snprintf(err, ERR_MAX, "out of memory building the checkpoint header");
done:
    free(hdr);
    free(e);
    cJSON_Delete(root);
    return ret;
}

static const char *md_str(const cJSON *md, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(md, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int md_long(const cJSON *md, const char *k, long *out, char err[ERR_MAX])
{
    const char *s = md_str(md, k);
    if (!s || parse_long(s, 0, (long)(~0UL >> 1), out)) {
        snprintf(err, ERR_MAX, "checkpoint metadata: %s missing or not a count", k);
        return -1;
    }
    return 0;
}

static int parse_hex64(const char *s, uint64_t *v)
{
    if (!s || strlen(s) != 16)
        return -1;
    uint64_t x = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
        if (d < 0)
            return -1;
        x = (x << 4) | (uint64_t)d;
    }
    *v = x;
    return 0;
}

/* An exact non-negative integer from a JSON number. */
static int json_size(const cJSON *v, size_t *out)
{
    if (!cJSON_IsNumber(v))
        return -1;
    double d = v->valuedouble;
    if (!(d >= 0.0 && d <= 9007199254740992.0) || d != (double)(size_t)d)
        return -1;
    *out = (size_t)d;
    return 0;
}

int checkpoint_decode(const void *data, size_t len, model *m, ckpt_meta *meta,
                      char err[ERR_MAX])
{
    const unsigned char *d = data;
    int ret = -1;
    entry *e = NULL;
    cJSON *root = NULL;
    char *hdr = NULL;
    if (len < 8) {
        snprintf(err, ERR_MAX, "checkpoint truncated: %zu bytes, no header length", len);
        return -1;
    }
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++)
        hl |= (uint64_t)d[i] << (8 * i);
    if (hl > (uint64_t)CKPT_MAX_HEADER || hl > len - 8 || hl < 2) {
        snprintf(err, ERR_MAX, "checkpoint header length %" PRIu64 " invalid for a %zu-byte file",
                 hl, len);
        return -1;
    }
    hdr = xstrndup((const char *)d + 8, (size_t)hl);
    root = cJSON_Parse(hdr);
    if (!cJSON_IsObject(root)) {
        snprintf(err, ERR_MAX, "checkpoint header is not a JSON object");
        goto out;
    }
    const unsigned char *body = d + 8 + hl;
    size_t body_len = len - 8 - (size_t)hl;

    const cJSON *md = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    if (!cJSON_IsObject(md)) {
        snprintf(err, ERR_MAX, "checkpoint has no __metadata__");
        goto out;
    }
    const char *fmt = md_str(md, "format");
    if (!fmt || strcmp(fmt, CKPT_FORMAT)) {
        snprintf(err, ERR_MAX, "checkpoint format %s is not %s", fmt ? fmt : "(none)", CKPT_FORMAT);
        goto out;
    }
    const char *sig = md_str(md, "model");
    if (!sig || strcmp(sig, model_signature(m))) {
        snprintf(err, ERR_MAX, "checkpoint is for another model or optimizer: %.90s", sig ? sig : "(none)");
        goto out;
    }
    ckpt_meta cm;
    memset(&cm, 0, sizeof cm);
    long iterations;
    uint64_t rs[4];
    const char *rng = md_str(md, "rng");
    if (md_long(md, "iterations", &iterations, err) || md_long(md, "epoch", &cm.epoch, err) ||
        md_long(md, "step", &cm.step, err) || md_long(md, "batch_pos", &cm.batch_pos, err) ||
        md_long(md, "epoch_correct", &cm.epoch_correct, err) ||
        md_long(md, "epoch_seen", &cm.epoch_seen, err))
        goto out;
    {
        char w[4][17];
        if (!rng || strlen(rng) != 67 || rng[16] != ',' || rng[33] != ',' || rng[50] != ',') {
            snprintf(err, ERR_MAX, "checkpoint metadata: rng malformed");
            goto out;
        }
        for (int i = 0; i < 4; i++) {
            memcpy(w[i], rng + 17 * i, 16);
            w[i][16] = 0;
            if (parse_hex64(w[i], &rs[i])) {
                snprintf(err, ERR_MAX, "checkpoint metadata: rng malformed");
                goto out;
            }
        }
    }
    if (parse_hex64(md_str(md, "data_rng"), &cm.data_rng)) {
        snprintf(err, ERR_MAX, "checkpoint metadata: data_rng malformed");
        goto out;
    }
    {
        const char *ls = md_str(md, "epoch_loss_sum");
        char *endp = NULL;
        errno = 0;
        cm.epoch_loss_sum = ls ? strtod(ls, &endp) : 0.0;
        if (!ls || endp == ls || *endp || errno) {
            snprintf(err, ERR_MAX, "checkpoint metadata: epoch_loss_sum malformed");
            goto out;
        }
        const char *sh = md_str(md, "spec_hash");
        snprintf(cm.spec_hash, sizeof cm.spec_hash, "%s", sh ? sh : "");
    }

    int n = entries_of(m, &e);
    int found = 0;
    for (const cJSON *it = root->child; it; it = it->next) {
        if (!strcmp(it->string, "__metadata__"))
            continue;
        found++;
    }
    if (found != n) {
        snprintf(err, ERR_MAX, "checkpoint holds %d tensors, the model has %d", found, n);
        goto out;
    }
    /* validate all, then copy */
    size_t *begin = xcalloc((size_t)n + 1, sizeof *begin);
    for (int i = 0; i < n; i++) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, e[i].name);
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape");
        const cJSON *of = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
        if (!cJSON_IsObject(t)) {
            snprintf(err, ERR_MAX, "checkpoint lacks tensor %s", e[i].name);
            free(begin);
            goto out;
        }
        if (!cJSON_IsString(dt) || strcmp(dt->valuestring, "F32")) {
            snprintf(err, ERR_MAX, "%s: dtype is not F32", e[i].name);
            free(begin);
            goto out;
        }
        int ok = cJSON_IsArray(sh) && cJSON_GetArraySize(sh) == e[i].rank;
        for (int r = 0; ok && r < e[i].rank; r++) {
            size_t v;
            ok = !json_size(cJSON_GetArrayItem(sh, r), &v) && v == (size_t)e[i].shape[r];
        }
        if (!ok) {
            char want[64] = "";
            size_t used = 0;
            for (int r = 0; r < e[i].rank && used < sizeof want; r++) {
                int w = snprintf(want + used, sizeof want - used, "%s%d", r ? ", " : "", e[i].shape[r]);
                if (w < 0)
                    break;
                used += (size_t)w;
            }
            snprintf(err, ERR_MAX, "%s: shape differs from the model's [%s]", e[i].name, want);
            free(begin);
            goto out;
        }
        size_t b, en;
        if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2 ||
            json_size(cJSON_GetArrayItem(of, 0), &b) || json_size(cJSON_GetArrayItem(of, 1), &en) ||
            en < b || en - b != e[i].size * sizeof(float)) {
            snprintf(err, ERR_MAX, "%s: data_offsets invalid", e[i].name);
            free(begin);
            goto out;
        }
        if (en > body_len) {
            snprintf(err, ERR_MAX, "checkpoint truncated: %s ends at byte %zu of %zu", e[i].name,
                     en, body_len);
            free(begin);
            goto out;
        }
        begin[i] = b;
    }
    for (int i = 0; i < n; i++)
        memcpy(e[i].data, body + begin[i], e[i].size * sizeof(float));
    free(begin);
    model_set_iterations(m, iterations);
    model_rng_set(m, rs);
    if (meta)
        *meta = cm;
    ret = 0;
out:
    free(e);
    free(hdr);
    cJSON_Delete(root);
    return ret;
}

int checkpoint_save(const char *path, const model *m, const ckpt_meta *meta, char err[ERR_MAX])
{
    unsigned char *data;
    size_t len;
    if (checkpoint_encode(m, meta, &data, &len, err))
        return -1;
    int rc = file_write_atomic(path, data, len, 0644);
    if (rc)
        snprintf(err, ERR_MAX, "writing checkpoint %.180s: %s", path, strerror(errno));
    free(data);
    return rc ? -1 : 0;
}

int checkpoint_load(const char *path, model *m, ckpt_meta *meta, char err[ERR_MAX])
{
    size_t len;
    char *data = file_read_all(path, (size_t)CKPT_MAX_BYTES, &len);
    if (!data) {
        snprintf(err, ERR_MAX, "reading checkpoint %.180s: %s", path, strerror(errno));
        return -1;
    }
    int rc = checkpoint_decode(data, len, m, meta, err);
    free(data);
    return rc;
}
