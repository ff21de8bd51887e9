/* answer_cache.c - see answer_cache.h. A direct-mapped table per thread,
 * slot by a hash of the key, the whole key compared on a hit. */
#include "answer_cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define ANSWER_SLOTS 64

typedef struct answer_slot {
    uint64_t gen;                  /* 0: empty */
    char key[ANSWER_KEY_MAX];
    char *body;
    size_t len;
} answer_slot;

static pthread_key_t g_key;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_ok;

static void table_free(void *p) {
    answer_slot *t = p;
    for (int i = 0; i < ANSWER_SLOTS; i++) free(t[i].body);
    free(t);
}

static void init_key(void) { g_ok = pthread_key_create(&g_key, table_free) == 0; }

static answer_slot *table(void) {
    if (pthread_once(&g_once, init_key) != 0 || !g_ok) return NULL;
    answer_slot *t = pthread_getspecific(g_key);
    if (t) return t;
    t = calloc(ANSWER_SLOTS, sizeof *t);
    if (!t) return NULL;
    if (pthread_setspecific(g_key, t) != 0) {
        free(t);
        return NULL;
    }
    return t;
}

static uint64_t hash_key(const char *s) { /* FNV-1a */
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

int answer_cache_get(db *d, const char *key, http_res *res, answer_ref *ref) {
    memset(ref, 0, sizeof *ref);
    size_t n = strlen(key);
    if (n >= sizeof ref->key) return 0;
    ref->gen = db_generation(d); /* before any read of the caller's */
    if (!ref->gen) return 0;
    answer_slot *t = table();
    if (!t) {
        ref->gen = 0;
        return 0;
    }
    answer_slot *s = &t[hash_key(key) % ANSWER_SLOTS];
    memcpy(ref->key, key, n + 1);
    ref->slot = s;
    if (s->gen != ref->gen || strcmp(s->key, key) != 0) return 0;
    http_text(res, 200, "application/json", s->body, s->len);
    return 1;
}

void answer_cache_put(const answer_ref *ref, const http_res *res) {
    if (!ref->gen || !ref->slot || res->status != 200 || !res->body || res->len > ANSWER_BODY_MAX) return;
    if (!res->content_type || strcmp(res->content_type, "application/json") != 0) return;
    answer_slot *s = ref->slot;
    char *copy = malloc(res->len ? res->len : 1);
    if (!copy) return;
    memcpy(copy, res->body, res->len);
    free(s->body);
    s->body = copy;
    s->len = res->len;
    s->gen = ref->gen;
    memcpy(s->key, ref->key, sizeof s->key);
}
