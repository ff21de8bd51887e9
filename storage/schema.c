/* schema.c - the SQL of every migration, in order. Times are milliseconds
 * since the epoch (INTEGER). Tokens are stored as sha256 hex only. */
#include "schema.h"

/* 1: teams, tokens, jobs and their event timeline (the audit log). */
static const char m1[] =
    "CREATE TABLE teams("
    "  id INTEGER PRIMARY KEY,"
    "  name TEXT NOT NULL UNIQUE,"
    "  created_at INTEGER NOT NULL);"
    "CREATE TABLE jobs("
    "  id INTEGER PRIMARY KEY,"
    "  team_id INTEGER NOT NULL REFERENCES teams(id),"
    "  name TEXT NOT NULL,"
    "  spec TEXT NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('queued','starting','running',"
    "        'succeeded','failed','cancelled')),"
    "  priority INTEGER NOT NULL,"
    "  attempt INTEGER NOT NULL DEFAULT 0,"
    "  max_restarts INTEGER NOT NULL,"
    "  workers INTEGER NOT NULL,"
    "  devices_per_worker INTEGER NOT NULL,"
    "  device TEXT NOT NULL CHECK (device IN ('cpu','gpu')),"
    "  ps INTEGER NOT NULL DEFAULT 0,"
    "  max_runtime_s INTEGER NOT NULL,"
    "  preemptible INTEGER NOT NULL DEFAULT 0,"
    "  reason TEXT,"
    "  created_at INTEGER NOT NULL,"
    "  updated_at INTEGER NOT NULL,"
    "  started_at INTEGER,"
    "  finished_at INTEGER);"
    "CREATE INDEX jobs_state ON jobs(state, id);"
    "CREATE INDEX jobs_team ON jobs(team_id, id);"
    "CREATE TABLE tokens("
    "  id INTEGER PRIMARY KEY,"
    "  hash TEXT NOT NULL UNIQUE,"
    "  kind TEXT NOT NULL CHECK (kind IN ('admin','team','node','task')),"
    "  team_id INTEGER REFERENCES teams(id),"
    "  job_id INTEGER REFERENCES jobs(id),"
    "  created_at INTEGER NOT NULL,"
    "  revoked_at INTEGER);"
    "CREATE TABLE job_events("
    "  id INTEGER PRIMARY KEY,"
    "  job_id INTEGER NOT NULL REFERENCES jobs(id),"
    "  ts INTEGER NOT NULL,"
    "  kind TEXT NOT NULL,"
    "  from_state TEXT,"
    "  to_state TEXT,"
    "  actor TEXT NOT NULL,"
    "  reason TEXT);"
    "CREATE INDEX job_events_job ON job_events(job_id, id);";

/* 2: the cluster: nodes and their devices (GPUs, and CPU slots as devices of
 * kind 'cpu'), tasks, allocations (one row per held device: the primary key
 * makes a device held twice impossible), team shares, failure memory. */
static const char m2[] =
    "ALTER TABLE teams ADD COLUMN weight REAL NOT NULL DEFAULT 1.0;"
    "ALTER TABLE teams ADD COLUMN guarantee INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE teams ADD COLUMN quota INTEGER;"
    "ALTER TABLE teams ADD COLUMN usage REAL NOT NULL DEFAULT 0;"
    "ALTER TABLE teams ADD COLUMN usage_at INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE jobs ADD COLUMN queue_if_infeasible INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE jobs ADD COLUMN queued_at INTEGER;"
    "ALTER TABLE jobs ADD COLUMN last_checkpoint_at INTEGER;"
    "UPDATE jobs SET queued_at = created_at;"
    "CREATE TABLE nodes("
    "  id INTEGER PRIMARY KEY,"
    "  hostname TEXT NOT NULL UNIQUE,"
    "  address TEXT NOT NULL,"
    "  cpu_slots INTEGER NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('ready','lost','drained')),"
    "  registered_at INTEGER NOT NULL,"
    "  last_heartbeat_at INTEGER NOT NULL);"
    "CREATE TABLE devices("
    "  id INTEGER PRIMARY KEY,"
    "  node_id INTEGER NOT NULL REFERENCES nodes(id),"
    "  kind TEXT NOT NULL CHECK (kind IN ('cpu','gpu')),"
    "  idx INTEGER NOT NULL,"
    "  model TEXT,"
    "  memory_mb INTEGER,"
    "  UNIQUE(node_id, kind, idx));"
    "CREATE TABLE tasks("
    "  id INTEGER PRIMARY KEY,"
    "  job_id INTEGER NOT NULL REFERENCES jobs(id),"
    "  attempt INTEGER NOT NULL,"
    "  type TEXT NOT NULL CHECK (type IN ('worker','ps')),"
    "  idx INTEGER NOT NULL,"
    "  node_id INTEGER NOT NULL REFERENCES nodes(id),"
    "  port INTEGER NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('assigned','running','stopping','exited')),"
    "  exit_code INTEGER,"
    "  reason TEXT,"
    "  created_at INTEGER NOT NULL,"
    "  started_at INTEGER,"
    "  finished_at INTEGER,"
    "  UNIQUE(job_id, attempt, type, idx));"
    "CREATE INDEX tasks_node_state ON tasks(node_id, state);"
    "CREATE INDEX tasks_job ON tasks(job_id, attempt);"
    "CREATE TABLE allocations("
    "  device_id INTEGER PRIMARY KEY REFERENCES devices(id),"
    "  task_id INTEGER NOT NULL REFERENCES tasks(id),"
    "  job_id INTEGER NOT NULL REFERENCES jobs(id));"
    "CREATE INDEX allocations_job ON allocations(job_id);"
    "CREATE INDEX allocations_task ON allocations(task_id);"
    "CREATE TABLE node_failures("
    "  job_id INTEGER NOT NULL REFERENCES jobs(id),"
    "  node_id INTEGER NOT NULL REFERENCES nodes(id),"
    "  count INTEGER NOT NULL,"
    "  PRIMARY KEY(job_id, node_id)) WITHOUT ROWID;";

/* 3: what running jobs report: metrics (sequence numbers make a retried
 * batch idempotent), log chunks (bytes live in files under DIR/logs),
 * checkpoints (bytes under DIR/checkpoints, recorded with their sha256), job
 * progress, and the rendezvous key/value store of a job's attempt. */
static const char m3[] =
    "CREATE TABLE metrics("
    "  job_id INTEGER NOT NULL REFERENCES jobs(id),"
    "  seq INTEGER NOT NULL,"
    "  attempt INTEGER NOT NULL,"
    "  kind TEXT NOT NULL CHECK (kind IN ('step','epoch','test')),"
    "  step INTEGER,"
    "  epoch INTEGER,"
    "  ts INTEGER NOT NULL,"
    "  data TEXT NOT NULL,"
    "  PRIMARY KEY(job_id, seq)) WITHOUT ROWID;"
    "CREATE TABLE log_chunks("
    "  id INTEGER PRIMARY KEY,"
    "  job_id INTEGER NOT NULL REFERENCES jobs(id),"
    "  task TEXT NOT NULL,"
    "  attempt INTEGER NOT NULL,"
    "  seq INTEGER NOT NULL,"
    "  offset INTEGER NOT NULL,"
    "  length INTEGER NOT NULL,"
    "  ts INTEGER NOT NULL,"
    "  UNIQUE(job_id, task, attempt, seq));"
    "CREATE TABLE checkpoints("
    "  id INTEGER PRIMARY KEY,"
    "  job_id INTEGER NOT NULL REFERENCES jobs(id),"
    "  attempt INTEGER NOT NULL,"
    "  step INTEGER NOT NULL,"
    "  epoch INTEGER NOT NULL,"
    "  size INTEGER NOT NULL,"
    "  sha256 TEXT NOT NULL,"
    "  path TEXT NOT NULL,"
    "  created_at INTEGER NOT NULL,"
    "  deleted_at INTEGER);"
    "CREATE INDEX checkpoints_job ON checkpoints(job_id, id);"
    "CREATE TABLE rendezvous("
    "  job_id INTEGER NOT NULL REFERENCES jobs(id),"
    "  attempt INTEGER NOT NULL,"
    "  key TEXT NOT NULL,"
    "  value TEXT NOT NULL,"
    "  PRIMARY KEY(job_id, attempt, key)) WITHOUT ROWID;"
    "ALTER TABLE jobs ADD COLUMN progress TEXT;"
    "ALTER TABLE tasks ADD COLUMN token_hash TEXT;";

/* 4: one restart budget: failed attempts of a job, whatever failed (a task
 * exiting non-zero, a lost node); preemptions and stops are not counted. */
static const char m4[] =
    "ALTER TABLE jobs ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;";

/* 5: per-node tokens. A 'node' token with node_id NULL is the shared join
 * token (DIR/node.token: good for POST /nodes only); registration mints a
 * token bound to its node (node_id set), revoking that node's earlier ones. */
static const char m5[] =
    "ALTER TABLE tokens ADD COLUMN node_id INTEGER REFERENCES nodes(id);"
    "CREATE INDEX tokens_node ON tokens(node_id) WHERE node_id IS NOT NULL;";

/* 6: the strategy as a column: the job list reads it (and the progress) in
 * its one query instead of parsing every spec. */
static const char m6[] =
    "ALTER TABLE jobs ADD COLUMN strategy TEXT NOT NULL DEFAULT 'default';"
    "UPDATE jobs SET strategy = coalesce(json_extract(spec, '$.strategy.type'), 'default')"
    " WHERE json_valid(spec);";

/* 7: memory as a resource. nodes.memory_mb: what the node offers its tasks
 * (MiB; 0 = not reported: memory does not constrain placement there);
 * nodes.isolation: the agent's isolation report as JSON text (NULL = it did
 * not say); jobs.memory_mb: the spec's resources.memory per task (0 = each
 * task gets its node's default share); tasks.memory_mb: the memory a placed
 * task was given, its cgroup limit (0 = none). */
static const char m7[] =
    "ALTER TABLE nodes ADD COLUMN memory_mb INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE nodes ADD COLUMN isolation TEXT;"
    "ALTER TABLE jobs ADD COLUMN memory_mb INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE tasks ADD COLUMN memory_mb INTEGER NOT NULL DEFAULT 0;";

/* 8: the evaluator side-car. tasks.type may be 'evaluator' (a CHECK cannot
 * be altered in SQLite: the table is rebuilt, rows and ids kept; the
 * allocations that reference tasks are set aside while the old table is
 * dropped, so no foreign key is broken at any point); eval_metrics: what an
 * evaluator reports per checkpoint, in a sequence of its own beside the
 * chief's (seq numbered by the evaluator as the chief numbers its metrics). */
static const char m8[] =
    "CREATE TEMP TABLE m8_alloc AS SELECT device_id, task_id, job_id FROM allocations;"
    "DELETE FROM allocations;"
    "CREATE TABLE tasks_m8("
    "  id INTEGER PRIMARY KEY,"
    "  job_id INTEGER NOT NULL REFERENCES jobs(id),"
    "  attempt INTEGER NOT NULL,"
    "  type TEXT NOT NULL CHECK (type IN ('worker','ps','evaluator')),"
    "  idx INTEGER NOT NULL,"
    "  node_id INTEGER NOT NULL REFERENCES nodes(id),"
    "  port INTEGER NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('assigned','running','stopping','exited')),"
    "  exit_code INTEGER,"
    "  reason TEXT,"
    "  created_at INTEGER NOT NULL,"
    "  started_at INTEGER,"
    "  finished_at INTEGER,"
    "  token_hash TEXT,"
    "  memory_mb INTEGER NOT NULL DEFAULT 0,"
    "  UNIQUE(job_id, attempt, type, idx));"
    "INSERT INTO tasks_m8(id, job_id, attempt, type, idx, node_id, port, state, exit_code, reason, created_at,"
    "  started_at, finished_at, token_hash, memory_mb)"
    " SELECT id, job_id, attempt, type, idx, node_id, port, state, exit_code, reason, created_at,"
    "  started_at, finished_at, token_hash, memory_mb FROM tasks;"
    "DROP TABLE tasks;"
    "ALTER TABLE tasks_m8 RENAME TO tasks;"
    "CREATE INDEX tasks_node_state ON tasks(node_id, state);"
    "CREATE INDEX tasks_job ON tasks(job_id, attempt);"
    "INSERT INTO allocations(device_id, task_id, job_id) SELECT device_id, task_id, job_id FROM m8_alloc;"
    "DROP TABLE m8_alloc;"
    "CREATE TABLE eval_metrics("
    "  job_id INTEGER NOT NULL REFERENCES jobs(id),"
    "  seq INTEGER NOT NULL,"
    "  attempt INTEGER NOT NULL,"
    "  kind TEXT NOT NULL CHECK (kind = 'eval'),"
    "  step INTEGER,"
    "  epoch INTEGER,"
    "  ts INTEGER NOT NULL,"
    "  data TEXT NOT NULL,"
    "  PRIMARY KEY(job_id, seq)) WITHOUT ROWID;";

/* 9: elastic gangs. jobs.workers_min: an elastic job's fewest workers (0 =
 * a fixed gang of jobs.workers, which is an elastic job's most);
 * jobs.workers_now: the workers of its current (or last) attempt, 0 before
 * the first placement; jobs.resize_to: the size a resize asked for, set when
 * the scheduler stops the job to resize it and cleared when it is placed. */
static const char m9[] =
    "ALTER TABLE jobs ADD COLUMN workers_min INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE jobs ADD COLUMN workers_now INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE jobs ADD COLUMN resize_to INTEGER NOT NULL DEFAULT 0;";

/* 10: tokens.expires_at: a team token made with an expiry, or an old one
 * given a grace period by a rotation (ms; NULL: never). */
static const char m10[] = "ALTER TABLE tokens ADD COLUMN expires_at INTEGER;";

/* 11: a team's code and environment. contexts: the gzip'd tars teams upload
 * (POST /contexts), per team and content-addressed (digest: hex sha256 of
 * the bytes; the file DATA/contexts/<digest> is shared by the teams that
 * uploaded the same bytes); used_at: the last upload or submission that
 * named it, from which the grace period of an unreferenced context counts.
 * jobs.context: the digest a command job's `command.context` names (NULL:
 * none), so the contexts a job holds are found without parsing specs.
 * nodes.runtimes: what the node's agent can run tasks in (JSON array:
 * "host", "podman"). registry_creds: a team's login for a registry host,
 * the password sealed (AES-256-GCM under DATA/secret.key) and never
 * answered to anyone but a task of that team's job that pulls from it. */
static const char m11[] =
    "CREATE TABLE contexts("
    "  team_id INTEGER NOT NULL REFERENCES teams(id),"
    "  digest TEXT NOT NULL,"
    "  bytes INTEGER NOT NULL,"
    "  files INTEGER NOT NULL,"
    "  unpacked INTEGER NOT NULL,"
    "  created_at INTEGER NOT NULL,"
    "  used_at INTEGER NOT NULL,"
    "  PRIMARY KEY(team_id, digest)) WITHOUT ROWID;"
    "CREATE INDEX contexts_digest ON contexts(digest);"
    "ALTER TABLE jobs ADD COLUMN context TEXT;"
    "CREATE INDEX jobs_context ON jobs(context) WHERE context IS NOT NULL;"
    "ALTER TABLE nodes ADD COLUMN runtimes TEXT;"
    "CREATE TABLE registry_creds("
    "  team_id INTEGER NOT NULL REFERENCES teams(id),"
    "  host TEXT NOT NULL,"
    "  username TEXT NOT NULL,"
    "  sealed BLOB NOT NULL,"
    "  created_at INTEGER NOT NULL,"
    "  PRIMARY KEY(team_id, host)) WITHOUT ROWID;";

/* 12: accounting and the server's disk. tasks.gpus, tasks.cpus: the devices
 * a task held from its placement (created_at) to its end (finished_at), so
 * usage survives the allocations, which go when a task ends (back-filled:
 * from the allocations of live tasks, from the job's shape for ended ones:
 * a worker its devices, a ps task one CPU slot, the evaluator none).
 * teams.storage_quota: bytes of logs, checkpoints and contexts the team may
 * hold (NULL: no quota). jobs.log_bytes: the job's log bytes kept (back-
 * filled from log_chunks). jobs.deleted_at: DELETE /jobs/{id} (its logs,
 * checkpoints and metrics gone, its row and tasks kept for usage; the API
 * answers 404). jobs.logs_purged_at: when retention removed a finished
 * job's logs. */
static const char m12[] =
    "ALTER TABLE tasks ADD COLUMN gpus INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE tasks ADD COLUMN cpus INTEGER NOT NULL DEFAULT 0;"
    "UPDATE tasks SET"
    "  gpus = (SELECT count(*) FROM allocations a JOIN devices d ON d.id = a.device_id"
    "          WHERE a.task_id = tasks.id AND d.kind = 'gpu'),"
    "  cpus = (SELECT count(*) FROM allocations a JOIN devices d ON d.id = a.device_id"
    "          WHERE a.task_id = tasks.id AND d.kind = 'cpu')"
    " WHERE state != 'exited';"
    "UPDATE tasks SET"
    "  gpus = CASE WHEN type = 'worker' AND (SELECT device FROM jobs WHERE id = tasks.job_id) = 'gpu'"
    "         THEN (SELECT devices_per_worker FROM jobs WHERE id = tasks.job_id) ELSE 0 END,"
    "  cpus = CASE WHEN type = 'worker' AND (SELECT device FROM jobs WHERE id = tasks.job_id) = 'cpu'"
    "         THEN (SELECT devices_per_worker FROM jobs WHERE id = tasks.job_id)"
    "         WHEN type = 'ps' THEN 1 ELSE 0 END"
    " WHERE state = 'exited';"
    "ALTER TABLE teams ADD COLUMN storage_quota INTEGER;"
    "ALTER TABLE jobs ADD COLUMN log_bytes INTEGER NOT NULL DEFAULT 0;"
    "UPDATE jobs SET log_bytes = coalesce((SELECT sum(length) FROM log_chunks WHERE job_id = jobs.id), 0);"
    "ALTER TABLE jobs ADD COLUMN deleted_at INTEGER;"
    "ALTER TABLE jobs ADD COLUMN logs_purged_at INTEGER;"
    "CREATE INDEX jobs_finished ON jobs(finished_at) WHERE finished_at IS NOT NULL;"
    "CREATE INDEX tasks_created ON tasks(created_at);";

/* 13: hyperparameter sweeps. sweeps: one search of a team (spec: the request
 * as normalized: the job spec and the search); sweep_trials: its trials, in
 * the search's order (params: {path: value}; job_id once submitted; rung and
 * epochs reached; metric: the best value of the search's metric so far);
 * sweep_rungs: what each trial scored at each rung it reached (ASHA's
 * promotions are decided from these rows alone, so a restarted server
 * decides as the one before it). jobs.sweep_id, jobs.trial: the sweep and
 * trial a job runs (NULL for a job of its own). */
static const char m13[] =
    "CREATE TABLE sweeps("
    "  id INTEGER PRIMARY KEY,"
    "  team_id INTEGER NOT NULL REFERENCES teams(id),"
    "  name TEXT NOT NULL,"
    "  spec TEXT NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('running','succeeded','failed','cancelled')),"
    "  reason TEXT,"
    "  created_at INTEGER NOT NULL,"
    "  updated_at INTEGER NOT NULL,"
    "  finished_at INTEGER);"
    "CREATE INDEX sweeps_team ON sweeps(team_id, id);"
    "CREATE INDEX sweeps_running ON sweeps(state) WHERE state = 'running';"
    "CREATE TABLE sweep_trials("
    "  sweep_id INTEGER NOT NULL REFERENCES sweeps(id),"
    "  trial INTEGER NOT NULL,"
    "  params TEXT NOT NULL,"
    "  job_id INTEGER REFERENCES jobs(id),"
    "  state TEXT NOT NULL CHECK (state IN ('pending','running','paused','succeeded','failed','stopped','cancelled')),"
    "  rung INTEGER NOT NULL DEFAULT 0,"
    "  epochs INTEGER NOT NULL DEFAULT 0,"
    "  metric REAL,"
    "  reason TEXT,"
    "  updated_at INTEGER NOT NULL,"
    "  PRIMARY KEY(sweep_id, trial)) WITHOUT ROWID;"
    "CREATE TABLE sweep_rungs("
    "  sweep_id INTEGER NOT NULL REFERENCES sweeps(id),"
    "  rung INTEGER NOT NULL,"
    "  trial INTEGER NOT NULL,"
    "  metric REAL NOT NULL,"
    "  promoted INTEGER NOT NULL DEFAULT 0,"
    "  PRIMARY KEY(sweep_id, rung, trial)) WITHOUT ROWID;"
    "ALTER TABLE jobs ADD COLUMN sweep_id INTEGER;"
    "ALTER TABLE jobs ADD COLUMN trial INTEGER;"
    "CREATE INDEX jobs_sweep ON jobs(sweep_id, trial) WHERE sweep_id IS NOT NULL;";

/* 14: people. users: a person, made by the cluster admin or on their first
 * single sign-on (source). members: a user's role in a team ('api': set by
 * PUT /teams/{team}/members; 'oidc': from the provider's groups claim, and
 * taken away when the claim no longer gives it). user_tokens: a person's
 * personal access tokens ('token') and dashboard sessions ('session'), by
 * sha256 only, each with its expiry, its team (NULL: any of the user's) and
 * scopes. token_use: when a token
 * was last used (its own table: a use is no change of who may do what, so
 * it must not invalidate the token caches that follow user_tokens). audit:
 * one row for every mutating request of a person, a team's service token
 * or the admin, and for every refused request; its ids grow with time, so
 * only a team's rows are indexed (each index is a write of every change:
 * reads by time and user walk the ids, newest or oldest first). jobs.user_id,
 * sweeps.user_id: who submitted them (NULL: a team's service token or the
 * admin). */
static const char m14[] =
    "CREATE TABLE users("
    "  id INTEGER PRIMARY KEY,"
    "  name TEXT NOT NULL UNIQUE,"
    "  email TEXT,"
    "  source TEXT NOT NULL CHECK (source IN ('admin','oidc')),"
    "  created_at INTEGER NOT NULL,"
    "  last_login_at INTEGER);"
    "CREATE TABLE members("
    "  team_id INTEGER NOT NULL REFERENCES teams(id),"
    "  user_id INTEGER NOT NULL REFERENCES users(id),"
    "  role TEXT NOT NULL CHECK (role IN ('viewer','member','admin')),"
    "  source TEXT NOT NULL CHECK (source IN ('api','oidc')),"
    "  created_at INTEGER NOT NULL,"
    "  PRIMARY KEY(team_id, user_id)) WITHOUT ROWID;"
    "CREATE INDEX members_user ON members(user_id);"
    "CREATE TABLE user_tokens("
    "  id INTEGER PRIMARY KEY,"
    "  hash TEXT NOT NULL UNIQUE,"
    "  kind TEXT NOT NULL CHECK (kind IN ('token','session')),"
    "  user_id INTEGER NOT NULL REFERENCES users(id),"
    "  name TEXT NOT NULL,"
    "  team_id INTEGER REFERENCES teams(id),"
    "  scopes TEXT NOT NULL,"
    "  via TEXT NOT NULL,"
    "  created_at INTEGER NOT NULL,"
    "  expires_at INTEGER NOT NULL,"
    "  revoked_at INTEGER);"
    "CREATE INDEX user_tokens_user ON user_tokens(user_id, id);"
    "CREATE TABLE token_use("
    "  token_id INTEGER PRIMARY KEY,"
    "  at INTEGER NOT NULL);"
    "CREATE TABLE audit("
    "  id INTEGER PRIMARY KEY,"
    "  at INTEGER NOT NULL,"
    "  actor TEXT NOT NULL,"
    "  user_id INTEGER,"
    "  token_id INTEGER,"
    "  team_id INTEGER,"
    "  method TEXT NOT NULL,"
    "  route TEXT NOT NULL,"
    "  target TEXT,"
    "  client TEXT,"
    "  status INTEGER NOT NULL);"
    "CREATE INDEX audit_team ON audit(team_id, id);"
    "ALTER TABLE jobs ADD COLUMN user_id INTEGER REFERENCES users(id);"
    "ALTER TABLE sweeps ADD COLUMN user_id INTEGER REFERENCES users(id);";

/* 15: fair share within a team. user_usage: each (team, user)'s decayed
 * device-seconds, the level of the fair-share tree below teams.usage
 * (user_id 0: the team's service token and the admin, jobs.user_id NULL).
 * Written by the scheduler with the team's usage, but only for users with
 * devices in use: a row's value at a later time is usage decayed from
 * usage_at (docs/scheduler.md, "Fair share within a team"). A rowid table,
 * so the change log's update hook sees it. */
static const char m15[] =
    "CREATE TABLE user_usage("
    "  id INTEGER PRIMARY KEY,"
    "  team_id INTEGER NOT NULL REFERENCES teams(id),"
    "  user_id INTEGER NOT NULL,"
    "  usage REAL NOT NULL DEFAULT 0,"
    "  usage_at INTEGER NOT NULL DEFAULT 0,"
    "  UNIQUE(team_id, user_id));";

/* 16: a job's web ports. task_ports: the port of the task's node that
 * serves each port the job declares (spec "ports"), as the agent reported it
 * with the task's start (storage/ports_store.c); what the server's proxy
 * reaches at /proxy/jobs/ID/NAME/. */
static const char m16[] =
    "CREATE TABLE task_ports("
    "  task_id INTEGER NOT NULL REFERENCES tasks(id),"
    "  name TEXT NOT NULL,"
    "  port INTEGER NOT NULL,"
    "  PRIMARY KEY(task_id, name)) WITHOUT ROWID;";

/* 17: interactive jobs. teams.max_interactive: the most interactive jobs
 * (notebooks, shells) of the team running at once, NULL = no limit (PATCH
 * /teams/{name}; the scheduler holds the others queued). */
static const char m17[] =
    "ALTER TABLE teams ADD COLUMN max_interactive INTEGER;";

/* 18: checkpoints and contexts in a blob store (docs/storage.md, "Blob
 * stores"). checkpoints.store, contexts.store: '' = the data directory
 * (every row before), else the normalized URL of the store holding the
 * bytes (the key under its checkpoints/ or contexts/ prefix is
 * checkpoints.path, contexts.digest). blob_uploads: a checkpoint a task
 * uploads straight to the store over presigned URLs: inserted (and
 * committed) before the store's upload is made; marked done in the
 * transaction that inserts the checkpoint row, or aborted (its parts or
 * object removed) by the housekeeping tick once past expires_at. md5s:
 * the JSON array of the base64 MD5 of each part, as signed. */
static const char m18[] =
    "ALTER TABLE checkpoints ADD COLUMN store TEXT NOT NULL DEFAULT '';"
    "ALTER TABLE contexts ADD COLUMN store TEXT NOT NULL DEFAULT '';"
    "CREATE TABLE blob_uploads("
    "  id INTEGER PRIMARY KEY,"
    "  token TEXT NOT NULL UNIQUE,"
    "  job_id INTEGER NOT NULL REFERENCES jobs(id),"
    "  attempt INTEGER NOT NULL,"
    "  step INTEGER NOT NULL,"
    "  epoch INTEGER NOT NULL,"
    "  store TEXT NOT NULL,"
    "  key TEXT NOT NULL,"
    "  remote_id TEXT NOT NULL DEFAULT '',"
    "  size INTEGER NOT NULL,"
    "  part_bytes INTEGER NOT NULL,"
    "  parts INTEGER NOT NULL,"
    "  sha256 TEXT NOT NULL,"
    "  md5s TEXT NOT NULL,"
    "  state TEXT NOT NULL DEFAULT 'open' CHECK (state IN ('open','done','aborted')),"
    "  checkpoint_id INTEGER REFERENCES checkpoints(id),"
    "  created_at INTEGER NOT NULL,"
    "  expires_at INTEGER NOT NULL);"
    "CREATE INDEX blob_uploads_open ON blob_uploads(state, expires_at);"
    "CREATE INDEX blob_uploads_job ON blob_uploads(job_id, state);";

/* 19: submissions made once: a client's Idempotency-Key, kept a day, names
 * the job its first submission made (POST /api/v1/jobs; sweeps: 20). */
static const char m19[] =
    "CREATE TABLE submit_keys("
    "  team_id INTEGER NOT NULL REFERENCES teams(id),"
    "  idem_key TEXT NOT NULL,"
    "  job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    "  created_at INTEGER NOT NULL,"
    "  PRIMARY KEY(team_id, idem_key)) WITHOUT ROWID;"
    "CREATE INDEX submit_keys_age ON submit_keys(team_id, created_at);";
static const char m19_pg[] =
    "CREATE TABLE submit_keys(\n"
    "  team_id BIGINT NOT NULL REFERENCES teams(id),\n"
    "  idem_key TEXT NOT NULL,\n"
    "  job_id BIGINT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,\n"
    "  created_at BIGINT NOT NULL,\n"
    "  PRIMARY KEY(team_id, idem_key));\n"
    "CREATE INDEX submit_keys_age ON submit_keys(team_id, created_at);\n"
    "SELECT ty_install_fences();\n";

/* 20: sweeps made once: POST /api/v1/sweeps's Idempotency-Key, kept a day
 * with the sweep its first request made, in the transaction that inserts
 * the sweep (storage/sweep_store.c). request_sha256: the request body's, so
 * the same key with another request is told apart (a sweep's stored spec
 * is normalized, not the body as sent). */
static const char m20[] =
    "CREATE TABLE sweep_keys("
    "  team_id INTEGER NOT NULL REFERENCES teams(id),"
    "  idem_key TEXT NOT NULL,"
    "  sweep_id INTEGER NOT NULL REFERENCES sweeps(id) ON DELETE CASCADE,"
    "  request_sha256 TEXT NOT NULL,"
    "  created_at INTEGER NOT NULL,"
    "  PRIMARY KEY(team_id, idem_key)) WITHOUT ROWID;"
    "CREATE INDEX sweep_keys_age ON sweep_keys(team_id, created_at);";
static const char m20_pg[] =
    "CREATE TABLE sweep_keys(\n"
    "  team_id BIGINT NOT NULL REFERENCES teams(id),\n"
    "  idem_key TEXT NOT NULL,\n"
    "  sweep_id BIGINT NOT NULL REFERENCES sweeps(id) ON DELETE CASCADE,\n"
    "  request_sha256 TEXT NOT NULL,\n"
    "  created_at BIGINT NOT NULL,\n"
    "  PRIMARY KEY(team_id, idem_key));\n"
    "CREATE INDEX sweep_keys_age ON sweep_keys(team_id, created_at);\n"
    "SELECT ty_install_fences();\n";

/* 21: PostgreSQL's change capture a statement at a time: the row triggers
 * ty_note (a PL/pgSQL call and an INSERT into pg_temp.ty_chg for every row
 * written) become three statement triggers a table, ty_note_ins/_upd/_del,
 * that note the statement's rows from its transition tables in one INSERT
 * (docs/postgres.md, "Change capture"). SQLite notes through its update
 * hook: nothing changes there. */
static const char m21[] = "SELECT 1;";
static const char m21_pg[] =
    "DROP TRIGGER ty_note ON devices;\n"
    "DROP TRIGGER ty_note ON allocations;\n"
    "DROP TRIGGER ty_note ON tasks;\n"
    "DROP TRIGGER ty_note ON jobs;\n"
    "DROP TRIGGER ty_note ON teams;\n"
    "DROP TRIGGER ty_note ON user_usage;\n"
    "DROP FUNCTION ty_note();\n"
    "-- TG_ARGV[0]: the table's number (db.h DB_CH_*); allocations note their\n"
    "-- device_id, user_usage its team_id, every other table its id. An UPDATE\n"
    "-- notes the keys before and after (the same key once).\n"
    "CREATE FUNCTION ty_note_set() RETURNS trigger\n"
    "LANGUAGE plpgsql AS $f$\n"
    "DECLARE\n"
    "  t smallint := TG_ARGV[0]::smallint;\n"
    "BEGIN\n"
    "  IF to_regclass('pg_temp.ty_chg') IS NULL THEN RETURN NULL; END IF;\n"
    "  IF TG_TABLE_NAME = 'allocations' THEN\n"
    "    IF TG_OP = 'INSERT' THEN INSERT INTO pg_temp.ty_chg SELECT t, device_id FROM ty_new;\n"
    "    ELSIF TG_OP = 'DELETE' THEN INSERT INTO pg_temp.ty_chg SELECT t, device_id FROM ty_old;\n"
    "    ELSE INSERT INTO pg_temp.ty_chg SELECT t, device_id FROM ty_new UNION SELECT t, device_id FROM ty_old;\n"
    "    END IF;\n"
    "  ELSIF TG_TABLE_NAME = 'user_usage' THEN\n"
    "    IF TG_OP = 'INSERT' THEN INSERT INTO pg_temp.ty_chg SELECT t, team_id FROM ty_new;\n"
    "    ELSIF TG_OP = 'DELETE' THEN INSERT INTO pg_temp.ty_chg SELECT t, team_id FROM ty_old;\n"
    "    ELSE INSERT INTO pg_temp.ty_chg SELECT t, team_id FROM ty_new UNION SELECT t, team_id FROM ty_old;\n"
    "    END IF;\n"
    "  ELSIF TG_OP = 'INSERT' THEN INSERT INTO pg_temp.ty_chg SELECT t, id FROM ty_new;\n"
    "  ELSIF TG_OP = 'DELETE' THEN INSERT INTO pg_temp.ty_chg SELECT t, id FROM ty_old;\n"
    "  ELSE INSERT INTO pg_temp.ty_chg SELECT t, id FROM ty_new UNION SELECT t, id FROM ty_old;\n"
    "  END IF;\n"
    "  RETURN NULL;\n"
    "END\n"
    "$f$;\n"
    "DO $d$\n"
    "DECLARE\n"
    "  r record;\n"
    "BEGIN\n"
    "  FOR r IN SELECT * FROM (VALUES ('devices', 2), ('allocations', 3), ('tasks', 4), ('jobs', 5),\n"
    "                                 ('teams', 6), ('user_usage', 6)) AS v(tab, n)\n"
    "  LOOP\n"
    "    EXECUTE format('CREATE TRIGGER ty_note_ins AFTER INSERT ON %I REFERENCING NEW TABLE AS ty_new'\n"
    "                   ' FOR EACH STATEMENT EXECUTE FUNCTION ty_note_set(%L)', r.tab, r.n);\n"
    "    EXECUTE format('CREATE TRIGGER ty_note_upd AFTER UPDATE ON %I REFERENCING OLD TABLE AS ty_old'\n"
    "                   ' NEW TABLE AS ty_new FOR EACH STATEMENT EXECUTE FUNCTION ty_note_set(%L)', r.tab, r.n);\n"
    "    EXECUTE format('CREATE TRIGGER ty_note_del AFTER DELETE ON %I REFERENCING OLD TABLE AS ty_old'\n"
    "                   ' FOR EACH STATEMENT EXECUTE FUNCTION ty_note_set(%L)', r.tab, r.n);\n"
    "  END LOOP;\n"
    "END\n"
    "$d$;\n";

/* 22: the jobs that may want an evaluator, for the scheduler's evaluator
 * step (storage/cluster.c SQL_EVAL_WANTED), which ran every pass over
 * every active job's spec: the active jobs whose spec names "evaluator" (a
 * superset: the step reads the spec's resources.evaluator). The query
 * repeats the predicate, which both engines need to use a partial index. */
#define M22 "CREATE INDEX jobs_evaluator ON jobs(id) WHERE state IN ('starting','running')" \
            " AND spec LIKE '%\"evaluator\"%';"
static const char m22[] = M22;
static const char m22_pg[] = M22 "\n";

/* 23: PostgreSQL's change capture into one UNLOGGED table, ty_changes,
 * each row marked with its session's backend pid, instead of a temporary
 * table per session. A session's temporary table is dropped when the
 * session ends, in a transaction of its own whose commit waits for a
 * synchronous standby: a primary being demoted (pg_auto_failover stops it
 * with its standby already promoting) kept every terminated session of
 * ours waiting there, and its shutdown, and so the failover, hung until
 * pg_ctl gave up. An unlogged table leaves a session nothing to commit at
 * its end and writes no WAL. A session captures when it has set
 * ty.capture = 'on' (a server's sessions do; psql and scripts do not) and
 * drains its own rows (pid = pg_backend_pid()) at each commit. ty_changes
 * is not fenced: a standby server's sessions drain it too (their rows are
 * none). docs/postgres.md, "Change capture". */
static const char m23[] = "SELECT 1;";
static const char m23_pg[] =
    "CREATE UNLOGGED TABLE ty_changes(\n"
    "  pid INTEGER NOT NULL,\n"
    "  t SMALLINT NOT NULL,\n"
    "  id BIGINT NOT NULL);\n"
    "CREATE INDEX ty_changes_pid ON ty_changes(pid);\n"
    "CREATE OR REPLACE FUNCTION ty_note_set() RETURNS trigger\n"
    "LANGUAGE plpgsql AS $f$\n"
    "DECLARE\n"
    "  t smallint := TG_ARGV[0]::smallint;\n"
    "  p integer := pg_backend_pid();\n"
    "BEGIN\n"
    "  IF current_setting('ty.capture', true) IS DISTINCT FROM 'on' THEN RETURN NULL; END IF;\n"
    "  IF TG_TABLE_NAME = 'allocations' THEN\n"
    "    IF TG_OP = 'INSERT' THEN INSERT INTO ty_changes SELECT p, t, device_id FROM ty_new;\n"
    "    ELSIF TG_OP = 'DELETE' THEN INSERT INTO ty_changes SELECT p, t, device_id FROM ty_old;\n"
    "    ELSE INSERT INTO ty_changes SELECT p, t, device_id FROM ty_new UNION SELECT p, t, device_id FROM ty_old;\n"
    "    END IF;\n"
    "  ELSIF TG_TABLE_NAME = 'user_usage' THEN\n"
    "    IF TG_OP = 'INSERT' THEN INSERT INTO ty_changes SELECT p, t, team_id FROM ty_new;\n"
    "    ELSIF TG_OP = 'DELETE' THEN INSERT INTO ty_changes SELECT p, t, team_id FROM ty_old;\n"
    "    ELSE INSERT INTO ty_changes SELECT p, t, team_id FROM ty_new UNION SELECT p, t, team_id FROM ty_old;\n"
    "    END IF;\n"
    "  ELSIF TG_OP = 'INSERT' THEN INSERT INTO ty_changes SELECT p, t, id FROM ty_new;\n"
    "  ELSIF TG_OP = 'DELETE' THEN INSERT INTO ty_changes SELECT p, t, id FROM ty_old;\n"
    "  ELSE INSERT INTO ty_changes SELECT p, t, id FROM ty_new UNION SELECT p, t, id FROM ty_old;\n"
    "  END IF;\n"
    "  RETURN NULL;\n"
    "END\n"
    "$f$;\n"
    "CREATE OR REPLACE FUNCTION ty_note_auth() RETURNS trigger\n"
    "LANGUAGE plpgsql AS $f$\n"
    "BEGIN\n"
    "  IF current_setting('ty.capture', true) = 'on' THEN\n"
    "    INSERT INTO ty_changes VALUES (pg_backend_pid(), 100, 0);\n"
    "  END IF;\n"
    "  RETURN NULL;\n"
    "END\n"
    "$f$;\n"
    "-- the fence on every table of ty_lease's schema but ty_lease, ty_meta,\n"
    "-- schema_migrations and ty_changes (a standby's sessions drain it)\n"
    "CREATE OR REPLACE FUNCTION ty_install_fences() RETURNS integer\n"
    "LANGUAGE plpgsql AS $f$\n"
    "DECLARE\n"
    "  t name;\n"
    "  n integer := 0;\n"
    "BEGIN\n"
    "  FOR t IN SELECT c.relname FROM pg_class c\n"
    "           WHERE c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = 'ty_lease'::regclass)\n"
    "             AND c.relkind IN ('r', 'p')\n"
    "             AND c.relname NOT IN ('ty_lease', 'ty_meta', 'schema_migrations', 'ty_changes')\n"
    "           ORDER BY c.relname\n"
    "  LOOP\n"
    "    EXECUTE format('CREATE OR REPLACE TRIGGER ty_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE'\n"
    "                   ' ON %I FOR EACH STATEMENT EXECUTE FUNCTION ty_fence()', t);\n"
    "    n := n + 1;\n"
    "  END LOOP;\n"
    "  RETURN n;\n"
    "END\n"
    "$f$;\n";

/* 24: a job's log output kept in the database (PostgreSQL: every server of
 * the cluster serves it, the leader that received it or not), and the
 * chunks found by offset. SQLite's servers keep writing files under DATA
 * (data NULL), as do the chunks of a cluster migrated from one. */
static const char m24[] =
    "ALTER TABLE log_chunks ADD COLUMN data BLOB;"
    "CREATE INDEX log_chunks_at ON log_chunks(job_id, task, \"offset\");";
static const char m24_pg[] =
    "ALTER TABLE log_chunks ADD COLUMN data BYTEA;\n"
    "CREATE INDEX log_chunks_at ON log_chunks(job_id, task, \"offset\");\n";

const migration schema_migrations[] = {
    {1, "teams, tokens, jobs, events", m1, 0},
    {2, "nodes, devices, tasks, allocations, shares", m2, 0},
    {3, "metrics, logs, checkpoints, rendezvous, progress", m3, 0},
    {4, "jobs.failures: the restart budget", m4, 0},
    {5, "tokens.node_id: per-node tokens", m5, 0},
    {6, "jobs.strategy", m6, 0},
    {7, "memory: nodes.memory_mb, nodes.isolation, jobs.memory_mb, tasks.memory_mb", m7, 0},
    {8, "the evaluator: tasks.type 'evaluator', eval_metrics", m8, 0},
    {9, "elastic gangs: jobs.workers_min, jobs.workers_now, jobs.resize_to", m9, 0},
    {10, "tokens.expires_at: expiring and rotated team tokens", m10, 0},
    {11, "contexts, jobs.context, nodes.runtimes, registry_creds", m11, 0},
    {12, "accounting: tasks.gpus/cpus, teams.storage_quota, jobs.log_bytes/deleted_at/logs_purged_at", m12, 0},
    {13, "sweeps, sweep_trials, sweep_rungs, jobs.sweep_id/trial", m13, 0},
    {14, "people: users, members, user_tokens, token_use, audit, jobs/sweeps.user_id", m14, 0},
    {15, "fair share within a team: user_usage", m15, 0},
    {16, "a job's web ports: task_ports", m16, 0},
    {17, "interactive jobs: teams.max_interactive", m17, 0},
    {18, "blob stores: checkpoints.store, contexts.store, blob_uploads", m18, 0},
    {19, "submissions made once: submit_keys (Idempotency-Key)", m19, m19_pg},
    {20, "sweeps made once: sweep_keys (Idempotency-Key)", m20, m20_pg},
    {21, "change capture a statement at a time (PostgreSQL)", m21, m21_pg},
    {22, "jobs_evaluator: the active jobs that may want an evaluator", m22, m22_pg},
    {23, "change capture into the unlogged ty_changes (PostgreSQL)", m23, m23_pg},
    {24, "log_chunks.data: job logs in the database (PostgreSQL)", m24, m24_pg},
};
const int schema_migrations_n = (int)(sizeof schema_migrations / sizeof schema_migrations[0]);
