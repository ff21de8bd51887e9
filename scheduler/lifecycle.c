/* lifecycle.c - task reports applied to jobs. See lifecycle.h. */
#include "lifecycle.h"
#include "../common/util.h"
#include "../storage/exec_store.h"
#include "../storage/ports_store.h"
#include "../storage/store.h"

#include <stdio.h>
#include <string.h>

int lifecycle_stop_tasks(db *d, int64_t job_id, const char *why) {
    if (store_job_stop_tasks(d, job_id, why) != STORE_OK) return STORE_ERROR;
    return exec_store_attempt_drop_unstarted(d, job_id, why);
}

int lifecycle_attempt_failed(db *d, int64_t job_id, const char *what, const char *actor, int *requeued) {
    static const char *const from[] = {"starting", "running", NULL};
    int failures = 0, max_restarts = 0;
    int again = store_job_count_failure(d, job_id, &failures, &max_restarts);
    if (again < 0) return STORE_ERROR;
    char why[3000];
    if (again)
        snprintf(why, sizeof why, "%.2800s; requeued (restart %d of %d)", what, failures, max_restarts);
    else
        snprintf(why, sizeof why, "%.2800s; restart budget spent (max_restarts %d)", what, max_restarts);
    *requeued = again;
    return store_job_transition(d, job_id, from, again ? "queued" : "failed", actor, why);
}

int lifecycle_job_fail_now(db *d, int64_t job_id, int attempt, const char *what, const char *actor) {
    static const char *const from[] = {"starting", "running", NULL};
    if (db_begin(d) < 0) return STORE_ERROR;
    exec_job j;
    memset(&j, 0, sizeof j);
    int rc = exec_store_job_get(d, job_id, 0, &j);
    exec_store_job_release(&j);
    if (rc == STORE_OK && (j.attempt != attempt || (strcmp(j.state, "starting") != 0 && strcmp(j.state, "running") != 0)))
        rc = STORE_CONFLICT;
    char why[3000];
    snprintf(why, sizeof why, "%.2800s; not restarted (a restart would meet the same fault)", what);
    if (rc == STORE_OK) rc = lifecycle_stop_tasks(d, job_id, "gang failed");
    if (rc == STORE_OK) rc = store_job_transition(d, job_id, from, "failed", actor, why);
    if (rc == STORE_OK) {
        if (db_commit(d) < 0) {
            db_rollback(d);
            return STORE_ERROR;
        }
        return STORE_OK;
    }
    db_rollback(d);
    return rc;
}

int lifecycle_task_running(db *d, int64_t task_id, const lifecycle_ports *ports, const char *actor, int *flags) {
    *flags = LC_NONE;
    if (db_begin(d) < 0) return STORE_ERROR;
    exec_task t;
    int rc = exec_store_task_get(d, task_id, &t);
    if (rc != STORE_OK) goto out;
    if (strcmp(t.state, "exited") == 0) {
        rc = STORE_CONFLICT;
        goto out;
    }
    if (ports) {
        rc = ports_store_set(d, task_id, (const char(*)[33])ports->names, ports->ports, ports->n);
        if (rc != STORE_OK) goto out;
    }
    if (strcmp(t.state, "running") == 0) goto out; /* repeated report */
    rc = exec_store_task_set_running(d, task_id);
    if (rc != STORE_OK) goto out;
    exec_job j;
    rc = exec_store_job_get(d, t.job_id, 0, &j);
    if (rc != STORE_OK) goto out;
    if (j.attempt == t.attempt && strcmp(j.state, "starting") == 0) {
        int total = 0, running = 0, live = 0;
        rc = exec_store_attempt_counts(d, t.job_id, t.attempt, &total, &running, &live);
        if (rc != STORE_OK) goto out;
        if (total > 0 && running == total) {
            static const char *const from[] = {"starting", NULL};
            char why[96];
            snprintf(why, sizeof why, "all %d task%s running (attempt %d)", total, total == 1 ? "" : "s",
                     t.attempt);
            rc = store_job_transition(d, t.job_id, from, "running", actor, why);
            if (rc == STORE_OK) *flags |= LC_JOB_CHANGED;
        }
    }
out:
    if (rc == STORE_OK || rc == STORE_CONFLICT) {
        if (db_commit(d) < 0) {
            db_rollback(d);
            return STORE_ERROR;
        }
        return rc;
    }
    db_rollback(d);
    return rc;
}

/* "worker-1 exited with code 1 (signal 9): reason; last lines: ..." */
static void describe_exit(const exec_task *t, const lifecycle_exit *e, char *out, size_t cap) {
    buf b;
    buf_init(&b, cap > 0 ? cap - 1 : 0);
    if (e->signal) buf_printf(&b, "%s-%d was killed by signal %d", t->type, t->index, e->signal);
    else buf_printf(&b, "%s-%d exited with code %d", t->type, t->index, e->exit_code);
    if (e->reason && *e->reason) buf_printf(&b, ": %.300s", e->reason);
    snprintf(out, cap, "%s", b.data ? b.data : "");
    if (e->log_tail && *e->log_tail) {
        size_t used = strlen(out);
        size_t room = cap > used + 32 ? cap - used - 32 : 0;
        size_t n = strlen(e->log_tail);
        const char *tail = n > room ? e->log_tail + (n - room) : e->log_tail;
        snprintf(out + used, cap - used, "; last log lines:\n%s", tail);
    }
    buf_release(&b);
}

#define LC_CHIEF_DONE "the chief finished"

/* Succeeded once the chief exited 0 and no task of the attempt is left. */
static int finish_if_done(db *d, const exec_task *t, const char *actor, int *flags) {
    int total = 0, running = 0, live = 0;
    int rc = exec_store_attempt_counts(d, t->job_id, t->attempt, &total, &running, &live);
    if (rc != STORE_OK || live > 0) return rc;
    int chief_exited = 0, chief_code = 0;
    rc = exec_store_attempt_chief(d, t->job_id, t->attempt, &chief_exited, &chief_code);
    if (rc != STORE_OK) return rc == STORE_NOT_FOUND ? STORE_OK : rc;
    if (!chief_exited || chief_code != 0) return STORE_OK;
    rc = store_job_transition(d, t->job_id, NULL, "succeeded", actor, "the chief (worker-0) finished");
    if (rc == STORE_OK) *flags |= LC_JOB_CHANGED;
    return rc;
}

int lifecycle_task_exited(db *d, int64_t task_id, const lifecycle_exit *e, const char *actor, int *flags) {
    *flags = LC_NONE;
    if (db_begin(d) < 0) return STORE_ERROR;
    exec_task t;
    exec_job j;
    memset(&j, 0, sizeof j);
    int rc = exec_store_task_get(d, task_id, &t);
    if (rc != STORE_OK) goto out;
    if (strcmp(t.state, "exited") == 0) goto out; /* repeated report: nothing more to do */
    int was_stopping = strcmp(t.state, "stopping") == 0;
    /* A stopped task keeps why it was stopped first ("preempted ...", "node 3
     * lost ..."): the scheduler reads that prefix to requeue the job. */
    char task_reason[600];
    int used = was_stopping && t.reason[0] ? snprintf(task_reason, sizeof task_reason, "%s; ", t.reason) : 0;
    if (used < 0 || (size_t)used >= sizeof task_reason) used = 0;
    if (e->signal)
        snprintf(task_reason + used, sizeof task_reason - (size_t)used, "killed by signal %d%s%.300s", e->signal,
                 e->reason && *e->reason ? ": " : "", e->reason ? e->reason : "");
    else
        snprintf(task_reason + used, sizeof task_reason - (size_t)used, "exit code %d%s%.300s", e->exit_code,
                 e->reason && *e->reason ? ": " : "", e->reason ? e->reason : "");
    if ((rc = exec_store_task_set_exited(d, task_id, e->exit_code, task_reason)) != STORE_OK) goto out;
    if ((rc = exec_store_task_free(d, task_id)) != STORE_OK) goto out;
    if ((rc = exec_store_task_revoke_token(d, task_id)) != STORE_OK) goto out;
    *flags |= LC_DEVICES_FREED;

    if ((rc = exec_store_job_get(d, t.job_id, 0, &j)) != STORE_OK) goto out;
    int live_job = strcmp(j.state, "starting") == 0 || strcmp(j.state, "running") == 0;
    if (!live_job || j.attempt != t.attempt) goto out; /* cancelled, requeued, or an old attempt */

    int is_chief = strcmp(t.type, "worker") == 0 && t.index == 0;
    int bad = e->exit_code != 0 || e->signal != 0;
    if (strcmp(t.type, "evaluator") == 0 && !was_stopping) {
        /* The evaluator is beside the gang, not in it: its failure is
         * recorded and costs the job nothing (no stop, no restart). */
        if (bad) {
            char what[2600], ev[2700];
            describe_exit(&t, e, what, sizeof what);
            snprintf(ev, sizeof ev, "evaluator failed: %s", what);
            rc = store_event_add(d, t.job_id, "evaluator", actor, ev);
            if (rc == STORE_OK) *flags |= LC_JOB_CHANGED;
        }
        goto out;
    }
    if (was_stopping) {
        /* We asked it to stop: not a failure. When it was stopped because the
         * chief finished, the last one out ends the job. */
        if (strcmp(t.reason, LC_CHIEF_DONE) == 0) rc = finish_if_done(d, &t, actor, flags);
        goto out;
    }
    if (bad) {
        char what[2600];
        describe_exit(&t, e, what, sizeof what);
        if ((rc = lifecycle_stop_tasks(d, t.job_id, "gang failed")) != STORE_OK) goto out;
        int requeued = 0;
        rc = lifecycle_attempt_failed(d, t.job_id, what, actor, &requeued);
        if (rc == STORE_OK) *flags |= LC_JOB_CHANGED;
        goto out;
    }
    if (is_chief) {
        if ((rc = lifecycle_stop_tasks(d, t.job_id, LC_CHIEF_DONE)) != STORE_OK) goto out;
        if ((rc = exec_store_job_set_reason(d, t.job_id, "the chief finished; stopping the other tasks")) != STORE_OK)
            goto out;
        rc = finish_if_done(d, &t, actor, flags);
    }
    /* another worker done before the chief: nothing to decide yet */
out:
    if (rc == STORE_OK) {
        if (db_commit(d) < 0) {
            db_rollback(d);
            return STORE_ERROR;
        }
        return STORE_OK;
    }
    db_rollback(d);
    *flags = LC_NONE;
    return rc;
}
