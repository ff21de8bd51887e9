/* activity.h - what keeps a job with an idle timeout alive, and the pass
 * that stops it when nothing does (docs/scheduler.md, "Idle jobs").
 *
 * An in-memory table, per job: when it last had a request or bytes through
 * the proxy (activity_touch; the proxy's activity hook calls it at most once
 * a second per relay), and how many shells are attached to it
 * (activity_attach). The periodic pass (api_activity_tick, from the
 * server's tick) cancels a running job whose idle_timeout (spec) has passed
 * since the later of its start, its last activity and the server's start,
 * with no shell attached: reason "idle for 30m", an event in its timeline,
 * its tasks stopped and its devices freed as a cancel does. The table is
 * not stored: a server restart counts as activity for every job.
 *
 * defines: activity_touch, activity_attach, activity_proxy_begin,
 *          activity_proxy_end, api_activity_tick */
#ifndef TRAINYARD_ACTIVITY_H
#define TRAINYARD_ACTIVITY_H

#include <stdint.h>

struct server;
struct proxy_target;

/* The job had a request or bytes through the proxy now. Cheap: a lookup in
 * the table under a mutex; safe from any thread. */
void activity_touch(struct server *srv, int64_t job);

/* A shell attached to the job (delta +1) or detached (-1): while one is
 * attached the job is never idle; a detach counts as activity (the idle
 * time starts from it). The count never goes below 0. Any thread. */
void activity_attach(struct server *srv, int64_t job, int delta);

/* For a request to the job's port about to be forwarded: touches the job
 * and sets t's activity hook to it. activity_proxy_end() must follow
 * proxy_forward(t) (until then the hook's entry is kept whatever the
 * pass finds). */
void activity_proxy_begin(struct server *srv, int64_t job, struct proxy_target *t);
void activity_proxy_end(void);

/* The periodic pass (server_app.tick, about once a second): cancels the
 * idle jobs, and forgets the entries of jobs no longer running once no
 * relay of the proxy is left that could point at them. */
void api_activity_tick(struct server *srv);

#endif
