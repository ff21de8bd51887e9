/* store.h - teams, tokens, jobs and the job timeline in SQLite.
 *
 * Everything here is storage: rows in, rows (as cJSON, the JSON forms the API
 * returns) out. Callers decide who may do what. Every state change of a job
 * goes through store_job_transition, which writes the event in the same
 * transaction, so the timeline is a complete audit log.
 *
 * Return codes: STORE_OK, STORE_NOT_FOUND, STORE_CONFLICT (e.g. cancel of a
 * finished job, duplicate team name), STORE_ERROR (database failure). */
#ifndef TRAINYARD_STORE_H
#define TRAINYARD_STORE_H

#include <stdint.h>
#include <cjson/cJSON.h>
#include "db.h"
#include "../common/util.h"

#include "store_base.h"

/* TOKEN_JOIN is the shared agents' token (DIR/node.token), good for
 * registration only; TOKEN_NODE a per-node token minted at registration.
 * Both are stored with kind 'node'; the join token has no node_id. */
/* TOKEN_USER is a person (storage/users.h): a personal token or a
 * dashboard session, before the server has chosen the team the request
 * acts in; once it has, the principal is TOKEN_TEAM with user_id set and
 * the person's role in that team. */
typedef enum { TOKEN_ADMIN = 0, TOKEN_TEAM, TOKEN_NODE, TOKEN_TASK, TOKEN_JOIN, TOKEN_USER } token_kind;

/* A role in a team, weakest first: a viewer reads, a member also submits
 * and acts on their own jobs and sweeps, an admin acts on all of the
 * team's and manages its members and registry logins. */
typedef enum { ROLE_NONE = 0, ROLE_VIEWER, ROLE_MEMBER, ROLE_ADMIN } team_role;
const char *role_name(team_role r);
int role_parse(const char *s, team_role *r); /* 0, or -1 for no role's name */

/* What a personal token may do beyond its user's roles. */
#define SCOPE_READ 1u                /* GET and HEAD */
#define SCOPE_WRITE 2u               /* every other method */

/* Who a token speaks for. */
typedef struct principal {
    token_kind kind;
    int64_t team_id;             /* team tokens; the job's team for task tokens; a person's chosen team */
    int64_t job_id;              /* task tokens */
    int64_t node_id;             /* per-node tokens */
    char team[64];
    int64_t expires_at;          /* ms since the epoch; 0: never */
    /* people (TOKEN_USER, and TOKEN_TEAM with user_id set) */
    int64_t user_id;             /* 0: not a person */
    char user[64];
    int64_t token_id;            /* user_tokens.id: the personal token or session used */
    int64_t token_team;          /* the team a personal token is bound to; 0: any of the user's */
    unsigned scopes;             /* SCOPE_* */
    int session;                 /* 1: a dashboard session (its cookie), 0: a bearer token */
    char via[16];                /* how the person signed in: "token", "oidc", "device" */
    team_role role;              /* in team_id: ROLE_ADMIN for a team's service token */
    int cluster_admin;           /* the admin token acting for a team it named */
} principal;

const char *token_kind_name(token_kind k);

/* JSON form of a text column (null for NULL); a time's is store_base.h's. */
void store_json_text(cJSON *o, const char *key, db_stmt *st, int col);
/* o[key] = a JSON object text this service stored (text NULL or not an
 * object: null), kept as raw text: json_write answers it as stored. */
void store_json_stored(cJSON *o, const char *key, const char *text);

/* ---------------------------------------------------------------- teams */
int store_team_create(db *d, const char *name, int64_t *id_out);
int store_team_find(db *d, const char *name, int64_t *id_out);
cJSON *store_teams_list(db *d);            /* NULL on error */
cJSON *store_team_get(db *d, int64_t team_id);

/* ---------------------------------------------------------------- tokens */
/* Stores sha256(token) with its kind and scope. */
int store_token_add(db *d, const char *token, token_kind kind, int64_t team_id, int64_t job_id);
/* STORE_OK and *who filled, STORE_NOT_FOUND for an unknown/revoked token.
 * Found by sha256(token); the stored hash is compared again in constant
 * time (CRYPTO_memcmp). */
/* The token's principal: STORE_OK; STORE_EXPIRED (who filled, its
 * expires_at passed); STORE_NOT_FOUND (unknown or revoked); STORE_ERROR. */
int store_token_lookup(db *d, const char *token, principal *who);
/* A team token that stops working at expires_at (ms; 0: never). */
int store_token_add_expiring(db *d, const char *token, int64_t team_id, int64_t expires_at);
/* Every other live token of the team (not keep_token) that would outlive
 * `at` now expires at `at`: a rotation's grace. *n gets how many. */
int store_team_tokens_expire(db *d, int64_t team_id, const char *keep_token, int64_t at, int *n);
int store_token_count(db *d, token_kind kind, int64_t *n);

/* ---------------------------------------------------------------- jobs */
/* What the jobs table keeps in columns of a new job (the API fills it from
 * the parsed spec; storage knows nothing of the spec's format). */
typedef struct {
    const char *name;
    int priority, max_restarts;
    int workers, devices_per_worker, ps;
    int workers_min;                   /* elastic: fewest workers (workers is the most); 0 fixed */
    const char *device;                /* "cpu" | "gpu" */
    const char *strategy;              /* strategy.type, "default" when absent */
    int64_t max_runtime_s;
    int preemptible, queue_if_infeasible;
    int64_t memory_mb;                 /* resources.memory per task (MiB), 0 = not given */
    const char *context;               /* command.context's hex digest (no "sha256:"); NULL = none */
    int64_t sweep_id;                  /* the sweep whose trial it runs (jobs.sweep_id); 0 = none */
    int trial;                         /* and the trial's number (jobs.trial) */
    int64_t user_id;                   /* who submits it (jobs.user_id); 0 = a service token or the admin */
    const char *idem_key;              /* the request's Idempotency-Key (store_job_submit); NULL = none */
} store_new_job;

/* Inserts a queued job (spec text as submitted, columns from *job) and its
 * "submitted" event, in one transaction. A job with a context marks the
 * team's context used (context_store.h) in it; STORE_NOT_FOUND, and nothing
 * written, when the team does not hold that context. */
int store_job_insert(db *d, int64_t team_id, const char *spec_json, size_t spec_len,
                     const store_new_job *job, const char *actor, int64_t *id_out);

/* The same rows inside the caller's transaction (it begins none): a job
 * that must be written together with other rows (a sweep's trial and the
 * job that runs it). Codes as store_job_insert; on failure the caller rolls
 * back. */
int store_job_insert_rows(db *d, int64_t team_id, const char *spec_json, size_t spec_len, const store_new_job *job,
                          const char *actor, int64_t *id_out);

/* The same insert through the db's group commit (db.h, db_group_add), for
 * a caller that must not block: the job, its event and its JSON form
 * (store_job_get's, read in the same transaction) are written together
 * with whatever else is queued, in one transaction of savepoints; the
 * strings are copied. done(arg, rc, id, job) runs once on the committer
 * thread after the batch's COMMIT has returned: STORE_OK with the new id
 * and its JSON (ownership passes) when the job is committed, STORE_NOT_FOUND
 * (the team does not hold job->context) or STORE_ERROR with 0 and NULL when
 * it is not (nothing of it was written).
 * Returns STORE_OK when queued (done will be called), STORE_ERROR when the
 * db is closing (done is never called). The audit row, when given, is
 * written in the job's savepoint with status 201. */
/* With job->idem_key: a key the team used within a day for the same spec
 * makes no job; done gets STORE_EXPIRED (a replay) with the first
 * submission's id and JSON. The same key with another spec: STORE_CONFLICT
 * with its id (and no JSON). */
typedef void (*store_submit_done)(void *arg, int rc, int64_t id, cJSON *job);
struct audit_row;
/* audit: the request's audit row (storage/audit.h; copied), written in
 * the same savepoint with status 201; NULL for none. */
int store_job_submit(db *d, int64_t team_id, const char *spec_json, size_t spec_len, const store_new_job *job,
                     const char *actor, const struct audit_row *audit, store_submit_done done, void *arg);

/* Counts one failed attempt of the job (inside the caller's transaction) and
 * tells whether the restart budget allows another: 1 requeue, 0 budget
 * spent, -1 store error. *failures and *max_restarts get the counts. */
int store_job_count_failure(db *d, int64_t job_id, int *failures, int *max_restarts);

/* The job's JSON form; team_id > 0 restricts to that team (else NOT_FOUND).
 * with_spec adds the submitted spec. A deleted job (jobs.deleted_at) is
 * NOT_FOUND here, in store_jobs_list and in store_job_state. */
int store_job_get(db *d, int64_t id, int64_t team_id, int with_spec, cJSON **out);

/* Jobs of a team (team_id 0 = all), newest first, optionally one state
 * and one submitter (user: a user's name; NULL = anyone's),
 * ids below `before` (0 = from the newest), at most limit: their JSON array
 * appended to out as text (the objects of store_job_get without the spec,
 * with "strategy" and "progress"), written from the rows without a cJSON
 * tree (docs/server.md, "Answers"). *next is the cursor for the next page
 * (0 when none). STORE_ERROR also when out is full. */
int store_jobs_list(db *d, int64_t team_id, const char *state, const char *user, int64_t before, int limit,
                    buf *out, int64_t *next);

/* Who submitted a job (sweep = 0) or a sweep (sweep = 1): its team, and
 * its user (*user_id 0 and user "" for a service token or the admin).
 * STORE_NOT_FOUND for none (a deleted job included). */
int store_owner(db *d, int sweep, int64_t id, int64_t *team_id, int64_t *user_id, char user[64]);

/* Reads a job's state and team (NOT_FOUND once it is deleted). */
int store_job_state(db *d, int64_t id, char state[16], int64_t *team_id);

/* Moves a job from one of the states in `from` (a NULL-terminated list; NULL
 * = any non-terminal) to `to`, with an event naming actor and reason. Sets
 * the timestamps the state implies. Must run inside a transaction when the
 * caller needs it atomic with other writes (it does not begin one).
 * STORE_CONFLICT when the job is not in an allowed state. */
int store_job_transition(db *d, int64_t id, const char *const *from, const char *to,
                         const char *actor, const char *reason);

/* A running job that may be stopped when idle (spec idle_timeout > 0: an
 * interactive job's, or a job's with ports): its timeout and when its
 * current attempt started running (the latest start of its tasks, else the
 * job's first start; unix ms). */
typedef struct store_idle_job {
    int64_t id;
    int64_t idle_timeout_s;
    int64_t started_ms;
} store_idle_job;

/* Every running job with an idle timeout, by id: *out (the caller frees;
 * NULL when none) and *n. STORE_OK or STORE_ERROR. */
int store_jobs_idle_watched(db *d, store_idle_job **out, int *n);

/* Appends an event that is not a state change (scheduler decisions, ...). */
int store_event_add(db *d, int64_t job_id, const char *kind, const char *actor, const char *reason);

/* Events of a job with id > after, oldest first, at most limit. */
int store_job_events(db *d, int64_t job_id, int64_t after, int limit, cJSON **out);

int store_is_terminal(const char *state);

/* What the ready nodes could ever hold, by device kind ("gpu"/"cpu"):
 * number of ready nodes, the most devices of that kind on one node, the
 * devices of that kind in all, CPU slots in all (for ps tasks), and how many
 * workers of per_worker devices fit when each sits on one node. */
typedef struct store_capacity {
    int nodes;
    int largest;
    int total;
    int cpu_total;
    int workers_fit;   /* sum over nodes of floor(devices / per_worker) */
    /* memory, when memory_mb (per task, MiB) > 0 is asked: */
    int mem_nodes;     /* ready nodes that report memory */
    int64_t mem_largest; /* the most memory a ready node with a worker's devices offers (MiB) */
    int mem_hold;      /* ready nodes that could hold one such worker: devices
                        * and memory (a node that reports none holds any) */
    int mem_workers_fit; /* sum over nodes of min(devices / per_worker,
                          * memory / memory_mb) (memory ignored where not reported) */
} store_capacity;
int store_cluster_capacity(db *d, const char *kind, int per_worker, int64_t memory_mb, store_capacity *out);

/* Marks a job's assigned/running tasks 'stopping' (their agents then send
 * SIGTERM); their devices stay held until the tasks exit. */
int store_job_stop_tasks(db *d, int64_t job_id, const char *why);

#endif
