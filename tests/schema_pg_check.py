#!/usr/bin/env python3
"""schema_pg_check.py [BUILD] - the PostgreSQL baseline against SQLite and a
real PostgreSQL 15.

storage/schema_pg.c's schema_pg_baseline (docs/postgres.md, "The schema on
PostgreSQL") must create what SQLite has after migrations 1..18. This check:

  1. starts a PostgreSQL 15 with scripts/pg-dev.sh in a temporary directory
     (stopped at exit, whatever happens);
  2. makes a migrated SQLite file by starting BUILD/trainyard server on a
     scratch data directory (its migrations run at start) and stopping it;
  3. builds tests/print_schema_pg.c with storage/schema_pg.c (cc), so the
     text applied is the C string as the compiler reads it, and applies it
     as the server will: one query string (one PQexec, psql -c) holding
     BEGIN, the baseline, every later migration's PostgreSQL text, the
     INSERTs of schema_migrations and COMMIT;
  4. compares the two schemas table by table: columns (names, order, types
     mapped INTEGER->bigint, REAL->double precision, TEXT->text,
     BLOB->bytea, NOT NULL, defaults, identity for `id INTEGER PRIMARY
     KEY`), primary keys, UNIQUE constraints, foreign keys with ON DELETE,
     CHECK constraints (their columns and literals), and the indexes (name,
     unique, columns, partial WHERE); no column may be a word PostgreSQL
     reserves, except "offset" (quoted: docs/postgres.md);
  5. proves the fence with two sessions: (a) a write without ty.epoch fails
     TY001; (b) with the lease at epoch 1 and SET ty.epoch=1 a write passes;
     (c) a takeover (UPDATE ... epoch=epoch+1) waits for an open transaction
     that wrote (the time it blocked is measured), while a renewal
     (expires_at only) does not, and the old holder's next write fails
     TY001; (d) an expired lease fences its holder; ty_install_fences is
     idempotent and fences a table made after the baseline;
  6. proves change capture: the ty_note_* statement triggers fill
     ty_changes (the session's pid) for jobs, tasks, devices, allocations,
     teams, user_usage (and (100, 0) for tokens, teams, users, user_tokens),
     nothing for other tables or for a statement that matches no row, and
     nothing (no error) in a session without ty.capture; a capturing session
     holds no temporary table;
  7. runs the same JSON cases through SQLite's json_valid/json_type/
     json_extract and the ty_json_* helpers and compares them (the known
     differences are listed in CASES and docs/postgres.md);
  8. measures a 10,000-row INSERT into jobs with the triggers disabled,
     enabled with ty.capture on, and with it off (EXPLAIN ANALYZE,
     best of 3; the figure docs/postgres.md quotes).

Any difference fails with a line naming the table and column (or the case).
Without PostgreSQL 15 (/usr/lib/postgresql/15/bin, PG_DEV_BIN) it prints a
SKIP line and exits 0, unless PG_TEST_REQUIRED=1: then it fails.

    python3 tests/schema_pg_check.py build      # from the repository root
"""
import json
import os
import queue
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
BASELINE_VERSION = 18
PG_ONLY = {'ty_lease', 'ty_meta', 'ty_changes'}
UNFENCED = {'ty_lease', 'ty_meta', 'schema_migrations', 'ty_changes'}
# table -> (change-log number, the column noted); DB_CH_* in storage/db.h
NOTED = {'devices': (2, 'id'), 'allocations': (3, 'device_id'), 'tasks': (4, 'id'),
         'jobs': (5, 'id'), 'teams': (6, 'id'), 'user_usage': (6, 'team_id')}
AUTH = {'tokens', 'teams', 'users', 'user_tokens'}
# reserved words of PostgreSQL a column may have (quoted in every statement)
RESERVED_OK = {'offset'}
TYPES = {'INTEGER': 'bigint', 'REAL': 'double precision', 'TEXT': 'text', 'BLOB': 'bytea'}

failures = []


def fail(msg):
    failures.append(msg)
    print('FAIL: ' + msg, flush=True)


def note(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------- psql


class Session:
    """One psql process on a pipe: run() sends one statement and answers its
    SQLSTATE ('00000': it succeeded) and the rows (fields split on '|')."""

    def __init__(self, url, env):
        self.p = subprocess.Popen(['psql', '-X', '-q', '-At', '-v', 'ON_ERROR_STOP=0', url],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env)
        self.lines = queue.Queue()
        self.errors = []
        self.n = 0
        threading.Thread(target=self._pump, args=(self.p.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.p.stderr, self.errors.append), daemon=True).start()

    @staticmethod
    def _pump(f, put):
        for line in f:
            put(line.rstrip('\n'))

    def send(self, sql):
        self.n += 1
        tag = '__ty_done_%d__' % self.n
        self.p.stdin.write(sql.strip().rstrip(';') + ';\n\\echo ' + tag + ' :SQLSTATE\n')
        self.p.stdin.flush()
        return tag

    def wait(self, tag, timeout=10.0):
        rows, end = [], time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise TimeoutError('psql gave no answer in %.0f s (%s)' % (timeout, tag))
            if line.startswith(tag + ' '):
                return line[len(tag) + 1:], rows
            rows.append(line.split('|'))

    def answered(self, tag, timeout):
        """(sqlstate, rows) if the statement of tag answers within timeout, else None."""
        try:
            return self.wait(tag, timeout)
        except TimeoutError:
            return None

    def run(self, sql, timeout=10.0):
        return self.wait(self.send(sql), timeout)

    def ok(self, sql, what):
        st, rows = self.run(sql)
        if st != '00000':
            fail('%s: SQLSTATE %s (%s): %s' % (what, st, sql, self.errors[-1:] or '?'))
        return rows

    def close(self):
        try:
            self.p.stdin.close()
            self.p.wait(timeout=5)
        except Exception:
            self.p.kill()
            self.p.wait()


def psql_json(url, env, sql):
    r = subprocess.run(['psql', '-X', '-q', '-At', '-v', 'ON_ERROR_STOP=1', url, '-c', sql],
                       env=env, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError('psql: ' + r.stderr.strip())
    return json.loads(r.stdout)


# ---------------------------------------------------------------- SQLite side


def make_sqlite(binary, scratch):
    """A data directory migrated by the server itself; its trainyard.db path."""
    data = os.path.join(scratch, 'sqlite-data')
    os.mkdir(data)
    db = os.path.join(data, 'trainyard.db')
    log = open(os.path.join(scratch, 'server.log'), 'w')
    p = subprocess.Popen([binary, 'server', '--data', data, '--listen', '127.0.0.1:0', '--quiet',
                          '--insecure-http', '--db-resident-mb', '0', '--access-log', 'none'],
                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 20
        while time.monotonic() < end:
            if p.poll() is not None:
                break
            try:
                c = sqlite3.connect('file:%s?mode=ro' % db, uri=True, timeout=1)
                v = c.execute('SELECT coalesce(max(version), 0) FROM schema_migrations').fetchone()[0]
                c.close()
                if v >= BASELINE_VERSION:
                    break
            except sqlite3.Error:
                pass
            time.sleep(0.05)
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        log.close()
    if not os.path.exists(db):
        with open(os.path.join(scratch, 'server.log')) as f:
            raise RuntimeError('the server made no database; its output:\n' + f.read())
    return db


def split_check(sql):
    """The CHECK (...) texts of a CREATE TABLE, outside string literals."""
    out, i, n = [], 0, len(sql)
    while i < n:
        if sql[i] == "'":
            j = sql.index("'", i + 1)
            while j + 1 < n and sql[j + 1] == "'":
                j = sql.index("'", j + 2)
            i = j + 1
            continue
        m = re.match(r'CHECK\s*\(', sql[i:], re.I)
        if m and (i == 0 or not (sql[i - 1].isalnum() or sql[i - 1] == '_')):
            j, depth, k = i + m.end(), 1, i + m.end()
            while depth:
                ch = sql[k]
                if ch == "'":
                    k = sql.index("'", k + 1)
                elif ch == '(':
                    depth += 1
                elif ch == ')':
                    depth -= 1
                k += 1
            out.append(sql[j:k - 1])
            i = k
            continue
        i += 1
    return out


def check_key(text, columns):
    """A CHECK's columns and literals, the same for SQLite's `state IN ('a')`
    and PostgreSQL's `(state = ANY (ARRAY['a'::text]))`."""
    lits = re.findall(r"'((?:[^']|'')*)'", text)
    rest = re.sub(r"'(?:[^']|'')*'", ' ', text)
    words = re.findall(r'"?([A-Za-z_][A-Za-z0-9_]*)"?', rest)
    cols = sorted({w for w in words if w in columns})
    nums = sorted(re.findall(r'(?<![A-Za-z_0-9])\d+(?![A-Za-z_0-9])', rest))
    return (tuple(cols), tuple(sorted(lits)), tuple(nums))


def norm_where(w):
    if w is None:
        return None
    w = re.sub(r'::[a-z ]+', '', w.lower())
    w = re.sub(r'[\s()"]', '', w)
    # PostgreSQL's deparsed forms of IN (...) and LIKE
    w = re.sub(r"=anyarray\[([^\]]*)\]", r"in\1", w)
    return w.replace('~~', 'like')


def norm_default(d):
    if d is None:
        return None
    d = re.sub(r"::[a-z ]+$", '', d.strip())
    while d.startswith('(') and d.endswith(')'):
        d = d[1:-1]
    try:
        return ('num', float(d))
    except ValueError:
        return ('text', d)


def sqlite_schema(path):
    c = sqlite3.connect('file:%s?mode=ro' % path, uri=True)
    tables = {}
    for (name, sql) in c.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"
                                 " AND name NOT LIKE 'sqlite_%'"):
        cols = c.execute('PRAGMA table_info("%s")' % name).fetchall()
        pk = [r[1] for r in sorted((r for r in cols if r[5]), key=lambda r: r[5])]
        # a rowid alias: the one INTEGER PRIMARY KEY of a rowid table
        rowid_alias = len(pk) == 1 and not re.search(r'WITHOUT\s+ROWID\s*$', sql, re.I) and \
            [r for r in cols if r[1] == pk[0]][0][2].upper() == 'INTEGER'
        t = {'columns': [], 'pk': pk, 'unique': [], 'fk': [], 'check': [], 'index': {}}
        colnames = {r[1] for r in cols}
        for (cid, cname, ctype, notnull, dflt, pkn) in cols:
            t['columns'].append({
                'name': cname, 'type': TYPES.get(ctype.upper(), '?' + ctype),
                'notnull': bool(notnull or pkn), 'default': norm_default(dflt),
                'identity': bool(rowid_alias and pkn and cname == 'id')})
        for (seq, iname, unique, origin, partial) in c.execute('PRAGMA index_list("%s")' % name):
            icols = [r[2] for r in c.execute('PRAGMA index_info("%s")' % iname)]
            if origin == 'u':
                t['unique'].append(tuple(icols))
            elif origin == 'c':
                isql = c.execute("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?",
                                 (iname,)).fetchone()[0]
                m = re.search(r'\)\s+WHERE\s+(.*)$', isql, re.I | re.S)
                t['index'][iname] = {'unique': bool(unique), 'columns': icols,
                                     'where': norm_where(m.group(1)) if m else None}
        fks = {}
        for (fid, seq, ref, frm, to, on_upd, on_del, match) in c.execute(
                'PRAGMA foreign_key_list("%s")' % name):
            f = fks.setdefault(fid, {'from': [], 'table': ref, 'to': [], 'on_delete': on_del,
                                     'on_update': on_upd})
            f['from'].append(frm)
            f['to'].append(to)
        for f in fks.values():
            t['fk'].append((tuple(f['from']), f['table'], tuple(f['to']), f['on_delete'].upper(),
                            f['on_update'].upper()))
        t['check'] = sorted(check_key(x, colnames) for x in split_check(sql))
        tables[name] = t
    versions = c.execute('SELECT version, name FROM schema_migrations ORDER BY version').fetchall()
    c.close()
    return tables, versions


# ---------------------------------------------------------------- PostgreSQL side

CATALOG = r"""
SELECT json_build_object(
 'tables', (SELECT json_agg(relname) FROM pg_class
            WHERE relnamespace = current_schema()::regnamespace AND relkind = 'r'),
 'columns', (SELECT json_agg(json_build_array(c.table_name, c.column_name, c.data_type, c.is_nullable,
                                              c.column_default, c.is_identity)
                             ORDER BY c.table_name, c.ordinal_position)
             FROM information_schema.columns c WHERE c.table_schema = current_schema()),
 'cons', (SELECT json_agg(json_build_array(r.relname, k.contype,
            (SELECT json_agg(a.attname ORDER BY x.o) FROM unnest(k.conkey) WITH ORDINALITY x(n, o)
               JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = x.n),
            f.relname,
            (SELECT json_agg(a.attname ORDER BY x.o) FROM unnest(k.confkey) WITH ORDINALITY x(n, o)
               JOIN pg_attribute a ON a.attrelid = k.confrelid AND a.attnum = x.n),
            k.confdeltype, k.confupdtype, pg_get_constraintdef(k.oid)))
          FROM pg_constraint k JOIN pg_class r ON r.oid = k.conrelid
          LEFT JOIN pg_class f ON f.oid = k.confrelid
          WHERE r.relnamespace = current_schema()::regnamespace),
 'indexes', (SELECT json_agg(json_build_array(t.relname, i.relname, x.indisunique,
               (SELECT json_agg(pg_get_indexdef(x.indexrelid, k, true) ORDER BY k)
                  FROM generate_series(1, x.indnkeyatts) k),
               pg_get_expr(x.indpred, x.indrelid),
               EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = x.indexrelid
                         AND k.conrelid = x.indrelid)))
             FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
             WHERE t.relnamespace = current_schema()::regnamespace),
 'triggers', (SELECT json_agg(json_build_array(c.relname, t.tgname, t.tgtype, p.proname,
                                               encode(t.tgargs, 'escape')))
              FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_proc p ON p.oid = t.tgfoid
              WHERE NOT t.tgisinternal AND c.relnamespace = current_schema()::regnamespace),
 'reserved', (SELECT json_agg(word) FROM pg_get_keywords() WHERE catcode = 'R'))
"""
FK_ACTION = {'a': 'NO ACTION', 'r': 'RESTRICT', 'c': 'CASCADE', 'n': 'SET NULL', 'd': 'SET DEFAULT'}


def pg_schema(cat):
    tables = {n: {'columns': [], 'pk': [], 'unique': [], 'fk': [], 'check': [], 'index': {}}
              for n in cat['tables']}
    for (tn, cn, dt, nullable, dflt, ident) in cat['columns']:
        if tn in tables:
            tables[tn]['columns'].append({'name': cn, 'type': dt, 'notnull': nullable == 'NO',
                                          'default': norm_default(dflt), 'identity': ident == 'YES'})
    for (tn, ctype, cols, ref, refcols, ondel, onupd, text) in cat['cons'] or []:
        t = tables[tn]
        if ctype == 'p':
            t['pk'] = cols
        elif ctype == 'u':
            t['unique'].append(tuple(cols))
        elif ctype == 'f':
            t['fk'].append((tuple(cols), ref, tuple(refcols), FK_ACTION[ondel], FK_ACTION[onupd]))
        elif ctype == 'c':
            t['check'].append(check_key(text, {c['name'] for c in t['columns']}))
    for t in tables.values():
        t['check'].sort()
    for (tn, iname, unique, cols, where, backs_constraint) in cat['indexes'] or []:
        if not backs_constraint:
            tables[tn]['index'][iname] = {'unique': unique, 'columns': [c.strip('"') for c in cols],
                                          'where': norm_where(where)}
    return tables


def compare(sq, pg, reserved):
    for name in sorted(set(sq) | set(pg)):
        if name in PG_ONLY:
            continue
        if name not in pg:
            fail('table %s: in SQLite, not in the PostgreSQL baseline' % name)
            continue
        if name not in sq:
            fail('table %s: in the PostgreSQL baseline, not in SQLite' % name)
            continue
        a, b = sq[name], pg[name]
        an = [c['name'] for c in a['columns']]
        bn = [c['name'] for c in b['columns']]
        if an != bn:
            fail('table %s: columns differ: SQLite %s, PostgreSQL %s' % (name, an, bn))
        bcols = {c['name']: c for c in b['columns']}
        for ca in a['columns']:
            cb = bcols.get(ca['name'])
            if cb is None:
                continue
            for k in ('type', 'notnull', 'default', 'identity'):
                if ca[k] != cb[k]:
                    fail('table %s column %s: %s is %r in SQLite (mapped), %r in PostgreSQL'
                         % (name, ca['name'], k, ca[k], cb[k]))
            if ca['name'].lower() in reserved and ca['name'].lower() not in RESERVED_OK:
                fail('table %s column %s: a reserved word in PostgreSQL' % (name, ca['name']))
        if a['pk'] != b['pk']:
            fail('table %s: primary key %s in SQLite, %s in PostgreSQL' % (name, a['pk'], b['pk']))
        for k, what in (('unique', 'UNIQUE'), ('fk', 'foreign keys'), ('check', 'CHECKs')):
            if sorted(a[k]) != sorted(b[k]):
                fail('table %s: %s differ: SQLite %s, PostgreSQL %s' % (name, what, sorted(a[k]), sorted(b[k])))
        for iname in sorted(set(a['index']) | set(b['index'])):
            ia, ib = a['index'].get(iname), b['index'].get(iname)
            if ia != ib:
                fail('table %s index %s: SQLite %s, PostgreSQL %s' % (name, iname, ia, ib))


def check_triggers(cat, tables):
    trig = {}
    for (tn, tg, tgtype, proname, args) in cat['triggers'] or []:
        trig.setdefault(tn, {})[tg] = (tgtype, proname, args)
    # tgtype bits: 1 row, 2 before, 4 insert, 8 delete, 16 update, 32 truncate
    for t in sorted(tables):
        fence = trig.get(t, {}).get('ty_fence')
        if t in UNFENCED:
            if fence:
                fail('table %s: has a fence trigger; it must not' % t)
        elif not fence or fence[1] != 'ty_fence' or fence[0] != 2 | 4 | 8 | 16 | 32:
            fail('table %s: no BEFORE INSERT/UPDATE/DELETE/TRUNCATE statement trigger ty_fence (%s)'
                 % (t, fence))
        # the capture: three AFTER statement triggers, one an event (transition
        # tables allow no more), each ty_note_set(the table's number)
        for (name, event) in (('ty_note_ins', 4), ('ty_note_upd', 16), ('ty_note_del', 8)):
            tn = trig.get(t, {}).get(name)
            if t in NOTED:
                if (not tn or tn[0] != event or tn[1] != 'ty_note_set'
                        or tn[2].split('\\000')[0] != str(NOTED[t][0])):
                    fail('table %s: no AFTER statement trigger %s, ty_note_set(%d) (%r)'
                         % (t, name, NOTED[t][0], tn))
            elif tn:
                fail('table %s: a %s trigger it should not have' % (t, name))
        if trig.get(t, {}).get('ty_note'):
            fail('table %s: the row trigger ty_note is still there' % t)
        ta = trig.get(t, {}).get('ty_note_auth')
        if (t in AUTH) != bool(ta):
            fail('table %s: ty_note_auth trigger %s' % (t, 'missing' if t in AUTH else 'unexpected'))


# ---------------------------------------------------------------- fence, notes

TEAM = "INSERT INTO teams(name, created_at) VALUES('%s', 1)"


def check_fence(url, env):
    a, b = Session(url, env), Session(url, env)
    try:
        # (a) no ty.epoch, or an empty one
        for s in (a, ):
            st, _ = s.run(TEAM % 'fa')
            if st != 'TY001':
                fail('fence (a): a write without ty.epoch answered %s, not TY001' % st)
        a.ok("SET ty.epoch = ''", 'SET')
        st, _ = a.run("TRUNCATE audit")
        if st != 'TY001':
            fail('fence (a): TRUNCATE with an empty ty.epoch answered %s, not TY001' % st)
        # the unfenced tables take writes without an epoch
        a.ok("INSERT INTO ty_meta VALUES('probe', 'x')", 'ty_meta is not fenced')
        a.ok("DELETE FROM ty_meta WHERE key = 'probe'", 'ty_meta is not fenced')
        # (b) the lease at epoch 1 for 6 s
        b.ok("UPDATE ty_lease SET holder = 'A', epoch = 1, expires_at = clock_timestamp() + interval '6 s'"
             " WHERE id = 1", 'lease')
        a.ok('SET ty.epoch = 1', 'SET')
        st, _ = a.run(TEAM % 'fb')
        if st != '00000':
            fail('fence (b): a write at the lease epoch answered %s: %s' % (st, a.errors[-1:]))
        # once per transaction: the second write of a transaction does no lookup
        a.ok('BEGIN', 'BEGIN')
        a.ok(TEAM % 'fb2', 'write in a transaction')
        rows = a.ok("SELECT current_setting('ty.fenced_xact', true) = txid_current()::text", 'fenced_xact')
        if rows != [['t']]:
            fail('fence: ty.fenced_xact does not hold the transaction id after a write (%s)' % rows)
        # (c) A's transaction is open and has written: a renewal passes, a takeover waits
        t0 = time.monotonic()
        b.ok("UPDATE ty_lease SET expires_at = clock_timestamp() + interval '6 s' WHERE id = 1 AND epoch = 1",
             'renewal')
        renew = time.monotonic() - t0
        if renew > 0.5:
            fail('fence (c): a renewal waited %.2f s for the holder\'s open transaction' % renew)
        tag = b.send("UPDATE ty_lease SET holder = 'B', epoch = epoch + 1,"
                     " expires_at = clock_timestamp() + interval '6 s' WHERE id = 1")
        t0 = time.monotonic()
        early = b.answered(tag, 1.0)
        if early is not None:
            fail('fence (c): the takeover did not wait for the open transaction that wrote (%s)' % (early,))
        a.ok(TEAM % 'fc', 'a write while the takeover waits')
        a.ok('COMMIT', 'COMMIT')
        got = b.answered(tag, 10.0)
        blocked = time.monotonic() - t0
        if got is None or got[0] != '00000':
            fail('fence (c): the takeover failed after the commit: %s %s' % (got, b.errors[-1:]))
        elif early is None:
            note('fence (c): the takeover waited %.2f s for the open transaction (its commit came at 1.00 s);'
                 ' a renewal took %.3f s' % (blocked, renew))
        rows = a.ok("SELECT count(*) FROM teams WHERE name IN ('fb2', 'fc')", 'count')
        if rows != [['2']]:
            fail('fence (c): the transaction before the takeover lost rows (%s)' % rows)
        st, _ = a.run(TEAM % 'fc2')
        if st != 'TY001':
            fail('fence (c): the old holder\'s write after the takeover answered %s, not TY001' % st)
        b.ok('SET ty.epoch = 2', 'SET')
        b.ok(TEAM % 'fc3', 'the new holder writes')
        # (d) an expired lease fences its own holder
        b.ok("UPDATE ty_lease SET expires_at = clock_timestamp() - interval '1 ms' WHERE id = 1", 'expire')
        st, _ = b.run(TEAM % 'fd')
        if st != 'TY001':
            fail('fence (d): a write under an expired lease answered %s, not TY001' % st)
        b.ok("UPDATE ty_lease SET expires_at = clock_timestamp() + interval '60 s' WHERE id = 1", 'renew')
        # ty_install_fences: idempotent, and it fences a table made later
        n1 = a.ok('SELECT ty_install_fences()', 'ty_install_fences')
        n2 = a.ok('SELECT ty_install_fences()', 'ty_install_fences again')
        cnt = a.ok("SELECT count(*) FROM pg_trigger WHERE tgname = 'ty_fence'", 'count')
        if n1 != n2 or cnt != n1:
            fail('ty_install_fences is not idempotent: %s then %s, %s triggers' % (n1, n2, cnt))
        a.ok('BEGIN', 'BEGIN')
        a.ok('CREATE TABLE ty_probe(id bigint)', 'CREATE TABLE')
        a.ok('SELECT ty_install_fences()', 'ty_install_fences')
        st, _ = a.run('INSERT INTO ty_probe VALUES (1)')
        if st != 'TY001':
            fail('ty_install_fences: a table made later is not fenced (%s)' % st)
        a.ok('ROLLBACK', 'ROLLBACK')
    finally:
        a.close()
        b.close()


def check_notes(url, env):
    s, plain = Session(url, env), Session(url, env)
    try:
        s.ok("SELECT set_config('ty.epoch', epoch::text, false) FROM ty_lease", 'epoch')
        plain.ok("SELECT set_config('ty.epoch', epoch::text, false) FROM ty_lease", 'epoch')
        # a session without ty.capture: writes pass, nothing noted anywhere
        plain.ok(TEAM % 'plain', 'a write in a session without ty.capture')
        s.ok("SET ty.capture = 'on'", 'ty.capture')
        mine = "FROM ty_changes WHERE pid = pg_backend_pid()"
        ids = {}

        def one(sql, what):
            rows = s.ok(sql, what)
            return int(rows[0][0]) if rows and rows[0][0] else None

        steps = [
            ('teams', "INSERT INTO teams(name, created_at) VALUES('nt', 1) RETURNING id", [(6, 'T'), (100, 0)]),
            ('users', "INSERT INTO users(name, source, created_at) VALUES('nu', 'admin', 1) RETURNING id",
             [(100, 0)]),
            ('nodes', "INSERT INTO nodes(hostname, address, cpu_slots, state, registered_at, last_heartbeat_at)"
             " VALUES('nn', 'a', 1, 'ready', 1, 1) RETURNING id", []),
            ('jobs', "INSERT INTO jobs(team_id, name, spec, state, priority, max_restarts, workers,"
             " devices_per_worker, device, max_runtime_s, created_at, updated_at)"
             " VALUES({T}, 'j', '{{}}', 'queued', 0, 0, 1, 1, 'cpu', 0, 1, 1) RETURNING id", [(5, 'J')]),
            ('devices', "INSERT INTO devices(node_id, kind, idx) VALUES({N}, 'cpu', 0) RETURNING id", [(2, 'D')]),
            ('tasks', "INSERT INTO tasks(job_id, attempt, type, idx, node_id, port, state, created_at)"
             " VALUES({J}, 0, 'worker', 0, {N}, 1, 'assigned', 1) RETURNING id", [(4, 'K')]),
            ('allocations', "INSERT INTO allocations(device_id, task_id, job_id) VALUES({D}, {K}, {J})"
             " RETURNING device_id", [(3, 'D')]),
            ('user_usage', "INSERT INTO user_usage(team_id, user_id) VALUES({T}, {U}) RETURNING id",
             [(6, 'T')]),
            ('tokens', "INSERT INTO tokens(hash, kind, team_id, created_at) VALUES('h', 'team', {T}, 1)"
             " RETURNING id", [(100, 0)]),
            ('user_tokens', "INSERT INTO user_tokens(hash, kind, user_id, name, scopes, via, created_at,"
             " expires_at) VALUES('h', 'token', {U}, 'n', '', 'api', 1, 2) RETURNING id", [(100, 0)]),
            ('job_events', "INSERT INTO job_events(job_id, ts, kind, actor) VALUES({J}, 1, 'k', 'a')"
             " RETURNING id", []),
            ('jobs', "UPDATE jobs SET priority = 1 WHERE id = {J} RETURNING id", [(5, 'J')]),
            ('jobs', "UPDATE jobs SET priority = 2 WHERE id = -{J} RETURNING id", []),
            ('user_usage', "UPDATE user_usage SET usage = 1 WHERE team_id = {T} RETURNING id", [(6, 'T')]),
            ('allocations', "DELETE FROM allocations WHERE device_id = {D} RETURNING device_id", [(3, 'D')]),
            ('tasks', "DELETE FROM tasks WHERE id = {K} RETURNING id", [(4, 'K')]),
            ('devices', "UPDATE devices SET model = 'm' WHERE id = {D} RETURNING id", [(2, 'D')]),
            ('tokens', "UPDATE tokens SET revoked_at = 2 WHERE hash = 'h' RETURNING id", [(100, 0)]),
        ]
        key = {'teams': 'T', 'users': 'U', 'nodes': 'N', 'jobs': 'J', 'devices': 'D', 'tasks': 'K'}
        for (table, sql, want) in steps:
            s.ok('DELETE ' + mine, 'drain')
            v = one(sql.format(**ids), 'write %s' % table)
            if table in key and key[table] not in ids:
                ids[key[table]] = v
            got = sorted((int(r[0]), int(r[1])) for r in s.ok('SELECT t, id ' + mine, 'read ty_changes'))
            exp = sorted((t, ids[i] if isinstance(i, str) else i) for (t, i) in want)
            if got != exp:
                fail('ty_note: %s (%s) noted %s, want %s' % (table, sql.split(' ')[0], got, exp))
        rows = plain.ok('SELECT count(*) ' + mine, 'nothing noted for plain')
        if rows != [['0']]:
            fail('ty_note: the session without ty.capture noted %s rows' % rows)
        # at its end a session leaves nothing to commit (no temporary table:
        # a demoted primary with a synchronous standby waited for ever there)
        rows = s.ok("SELECT count(*) FROM pg_class WHERE relpersistence = 't'", 'temporary tables')
        if rows != [['0']]:
            fail('ty_note: a capturing session made %s temporary tables' % rows[0][0])
    finally:
        s.close()
        plain.close()


def trigger_cost(url, env):
    """ms of a 10,000-row INSERT into jobs: triggers disabled, enabled with
    ty.capture on, enabled with it off (best of 3 each, EXPLAIN ANALYZE)."""
    s = Session(url, env)
    ins = ("EXPLAIN (ANALYZE, FORMAT JSON) INSERT INTO jobs(team_id, name, spec, state, priority, max_restarts,"
           " workers, devices_per_worker, device, max_runtime_s, created_at, updated_at)"
           " SELECT (SELECT min(id) FROM teams), 'j', '{}', 'queued', 0, 0, 1, 1, 'cpu', 0, 1, 1"
           " FROM generate_series(1, 10000)")
    try:
        s.ok("SELECT set_config('ty.epoch', epoch::text, false) FROM ty_lease", 'epoch')
        best = {}
        for _ in range(3):
            for mode in ('off', 'chg', 'nochg'):
                s.ok('BEGIN', 'BEGIN')
                if mode == 'off':
                    s.ok('ALTER TABLE jobs DISABLE TRIGGER USER', 'disable')
                s.ok("SET LOCAL ty.capture = '%s'" % ('off' if mode == 'nochg' else 'on'), 'ty.capture')
                rows = s.ok(ins, 'insert')
                s.ok('ROLLBACK', 'ROLLBACK')
                plan = json.loads('\n'.join('|'.join(r) for r in rows))[0]
                ms = plan['Execution Time']
                best[mode] = min(best.get(mode, ms), ms)
        return best
    finally:
        s.close()


# ---------------------------------------------------------------- JSON

# (json text, SQLite path, what differs from SQLite: None = nothing)
CASES = [
    ('{"a":1}', '$.a', None),
    ('{"a":-2.5}', '$.a', None),
    ('{"a":1.0}', '$.a', None),
    ('{"a":1e3}', '$.a', 'type: SQLite says real (the literal has an exponent), jsonb keeps 1000: integer'),
    ('{"a":1e400}', '$.a', 'type: as 1e3 (and ty_json_text writes the 401 digits); the value is Infinity in both'),
    ('{"a":-1e400}', '$.a', 'type: as 1e3'),
    ('{"a":1e-400}', '$.a', None),
    ('{"a":1.7976931348623157e308}', '$.a', 'type: as 1e3'),
    ('{"a":9007199254740993}', '$.a', None),  # compared as doubles: ty_json_num has 53 bits
    ('{"a":"x"}', '$.a', None),
    ('{"a":"x\\"y\\\\z\\u00e9"}', '$.a', None),
    ('{"a":true}', '$.a', 'text: SQLite answers the integer 1, ty_json_text the text true'),
    ('{"a":false}', '$.a', 'text: SQLite answers the integer 0, ty_json_text the text false'),
    ('{"a":null}', '$.a', None),
    ('{"a":{"b":{"c":7}}}', '$.a.b.c', None),
    ('{"a":{"b":{"c":7}}}', '$.a.b', None),
    ('{"a":[1,2,{"x":"y"}]}', '$.a', None),
    ('{"a":[1,2,{"x":"y"}]}', '$.a[2].x', None),
    ('{"a":[1,2,3]}', '$.a[1]', None),
    ('{"a":[1,2,3]}', '$.a[9]', None),
    ('{"a":5}', '$.a[0]', None),
    ('{"a":[{"b":1}]}', '$.a.b', None),
    ('[10,20]', '$[1]', None),
    ('[10,20]', '$.a', None),
    ('{"a":1}', '$.b', None),
    ('{"a":1}', '$.a.b', None),
    ('{"a-b":{"c":3}}', '$."a-b".c', None),
    ('{"a.b":3}', '$."a.b"', None),
    ('{"a b":3}', '$.a b', None),
    ('{"1a":{"b c":{"d":4}}}', '$.1a."b c".d', None),
    ('{"last":1,"type":2,"size":3}', '$.type', None),
    ('{"last":1,"type":2,"size":3}', '$.last', None),
    ('{"a\\"b":1}', '$.a"b', 'escaped key: SQLite matches the path against the key as escaped in the'
     ' text (a\\"b), the helpers against the decoded key (a"b): refuse such names'),
    ('{"a\\\\b":1}', '$."a\\b"', 'escaped key: as above'),
    ('{"loss/val":0.5}', '$."loss/val"', None),
    ('{"samples_per_sec":123.5,"seconds":10}', '$.samples_per_sec', None),
    ('{"resources":{"evaluator":true}}', '$.resources.evaluator', 'text: as true above'),
    ('{"environment":{"image":"python:3"}}', '$.environment.image', None),
    ('{"interactive":{"type":"notebook"}}', '$.interactive.type', None),
    ('{"logs":{"max_size":1048576}}', '$.logs.max_size', None),
    ('{"step":12,"fraction":0.25}', '$.fraction', None),
    ('{"a":1}', '$', None),
    ('"str"', '$', None),
    ('3', '$', None),
    ('null', '$', None),
    (' {"a" : [ 1 , 2 ] } ', '$.a', None),
    ('{"a":1,"a":2}', '$.a', 'duplicate key: SQLite answers the first value (1), jsonb keeps the last (2)'),
    ('{', '$.a', 'bad JSON: SQLite raises "malformed JSON", the helpers answer NULL'),
    ('', '$.a', 'bad JSON: as above'),
    ('{"a":1,}', '$.a', 'bad JSON: as above'),
    ("{'a':1}", '$.a', 'bad JSON: as above'),
    ('nul', '$', 'bad JSON: as above'),
    ('{"a":"\\u0000"}', '$.a', 'SQLite takes \\u0000 in a string; jsonb refuses it: NULL, not valid'),
]
BAD_PATHS = ['a', '$.', '$[x]', '$a', '$.a[-1]']


def sql_lit(s):
    return "'" + s.replace("'", "''") + "'"


def check_json(url, env):
    c = sqlite3.connect(':memory:')
    values = ', '.join('(%d, %s, %s)' % (i, sql_lit(t), sql_lit(p)) for i, (t, p, _) in enumerate(CASES))
    # force_parallel_mode: a helper marked PARALLEL SAFE would fail in a worker
    # (ty_jsonb's exception block is a subtransaction, refused there)
    rows = psql_json(url, env, 'SET force_parallel_mode = on; SELECT json_agg(json_build_array(i, ty_json_valid(t), ty_json_type(t, p),'
                     ' ty_json_text(t, p), ty_json_num(t, p)) ORDER BY i) FROM (VALUES %s) AS v(i, t, p)' % values)
    diffs = 0
    for (i, valid, jtype, text, num) in rows:
        t, p, known = CASES[i]
        q_valid = c.execute('SELECT json_valid(?)', (t,)).fetchone()[0]
        try:
            q_type = c.execute('SELECT json_type(?, ?)', (t, p)).fetchone()[0]
            q_val = c.execute('SELECT json_extract(?, ?)', (t, p)).fetchone()[0]
            raised = None
        except sqlite3.Error as e:
            q_type = q_val = None
            raised = str(e)
        d = []
        if bool(q_valid) != valid:
            d.append('valid: SQLite %r, ty_json_valid %r' % (q_valid, valid))
        if raised:
            if valid or jtype is not None or text is not None or num is not None:
                d.append('SQLite raises (%s), the helpers answer %r' % (raised, (jtype, text, num)))
            d.append('SQLite raises "%s"' % raised)
        else:
            if q_type != jtype:
                d.append('type: SQLite %r, ty_json_type %r' % (q_type, jtype))
            if q_type in ('integer', 'real'):
                if num is None or float(num) != float(q_val) or text is None or float(text) != float(q_val):
                    d.append('value: SQLite %r, ty_json_num %r, ty_json_text %r' % (q_val, num, text))
            elif q_type in ('true', 'false'):
                if num != q_val:
                    d.append('value: SQLite %r, ty_json_num %r' % (q_val, num))
                if text != str(q_val):
                    d.append('text: SQLite %r, ty_json_text %r' % (q_val, text))
            elif q_type in ('object', 'array'):
                if text is None or json.loads(text) != json.loads(q_val) or num is not None:
                    d.append('value: SQLite %r, ty_json_text %r, ty_json_num %r' % (q_val, text, num))
            elif q_type == 'text':
                if text != q_val or num is not None:
                    d.append('value: SQLite %r, ty_json_text %r, ty_json_num %r' % (q_val, text, num))
            else:  # null or missing
                if text is not None or num is not None or q_val is not None:
                    d.append('value: SQLite %r, ty_json_text %r, ty_json_num %r' % (q_val, text, num))
        if d and not known:
            fail('json %r %s: %s' % (t, p, '; '.join(d)))
        elif not d and known:
            fail('json %r %s: listed as differing (%s) but answers the same' % (t, p, known))
        diffs += bool(d)
    # a path SQLite refuses raises in both
    for p in BAD_PATHS:
        try:
            c.execute("SELECT json_extract('{\"a\":1}', ?)", (p,)).fetchone()
            q = 'answers'
        except sqlite3.Error:
            q = 'raises'
        r = subprocess.run(['psql', '-X', '-q', '-At', url, '-c',
                            "SELECT ty_json_num('{\"a\":1}', %s)" % sql_lit(p)],
                           env=env, capture_output=True, text=True, timeout=30)
        pg = 'raises' if r.returncode != 0 else 'answers'
        if q != pg:
            fail('json path %r: SQLite %s, ty_json_num %s' % (p, q, pg))
    c.close()
    note('json: %d cases, %d with the known differences listed in CASES, %d bad paths'
         % (len(CASES), diffs, len(BAD_PATHS)))


# ---------------------------------------------------------------- main


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else 'build'
    binary = os.environ.get('TRAINYARD_BIN') or os.path.join(build, 'trainyard')
    pgbin = os.environ.get('PG_DEV_BIN', '/usr/lib/postgresql/15/bin')
    if not os.path.isdir(pgbin) or not shutil.which('psql'):
        if os.environ.get('PG_TEST_REQUIRED') == '1':
            print('FAIL: PostgreSQL 15 is not here (%s, psql) and PG_TEST_REQUIRED=1' % pgbin)
            return 1
        print('SKIP: tests/schema_pg_check.py: no PostgreSQL 15 (%s; package postgresql-15)' % pgbin)
        return 0
    if not os.access(binary, os.X_OK):
        print('FAIL: %s is not an executable (build it: make %s)' % (binary, binary))
        return 1
    started = time.monotonic()
    # a directory the postgres user reaches when we are root (pg-dev.sh's header)
    scratch = tempfile.mkdtemp(prefix='ty_schema_pg.', dir='/tmp')
    pgdir = os.path.join(scratch, 'pg')
    os.mkdir(pgdir)
    if os.getuid() == 0:
        os.chmod(scratch, 0o711)
    env = dict(os.environ, PG_DEV_FAST='1')

    def stop(*_):
        subprocess.run([os.path.join(ROOT, 'scripts/pg-dev.sh'), 'stop', pgdir],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        shutil.rmtree(scratch, ignore_errors=True)

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        r = subprocess.run([os.path.join(ROOT, 'scripts/pg-dev.sh'), 'start', pgdir],
                           env=env, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            print('FAIL: scripts/pg-dev.sh start: ' + r.stderr.strip())
            return 1
        kv = dict(line.split('=', 1) for line in r.stdout.splitlines() if '=' in line)
        url = kv['DATABASE_URL']
        env['PGPASSFILE'] = kv['PGPASSFILE']
        env['PGCONNECT_TIMEOUT'] = '10'

        db = make_sqlite(binary, scratch)
        sq, versions = sqlite_schema(db)
        top = versions[-1][0] if versions else 0

        exe = os.path.join(scratch, 'print_schema_pg')
        cc = os.environ.get('CC', 'cc')
        r = subprocess.run([cc, '-std=gnu11', '-Wall', '-Wextra', '-Werror', '-o', exe,
                            os.path.join(ROOT, 'tests/print_schema_pg.c'), os.path.join(ROOT, 'storage/schema_pg.c'),
                            os.path.join(ROOT, 'storage/schema.c')],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            print('FAIL: cc tests/print_schema_pg.c storage/schema_pg.c storage/schema.c: ' + r.stderr.strip())
            return 1
        baseline = subprocess.run([exe], capture_output=True, text=True, check=True, timeout=30).stdout
        # one query string, as the server's PQexec: the baseline and the history rows in one transaction
        inserts = ''.join("INSERT INTO schema_migrations(version, name, applied_at) VALUES(%d, %s, 0);\n"
                          % (v, sql_lit(n)) for (v, n) in versions)
        text = 'BEGIN;\n' + baseline + inserts + 'COMMIT;\n'
        r = subprocess.run(['psql', '-X', '-q', '-At', '-v', 'ON_ERROR_STOP=1', url, '-c', text],
                           env=env, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            print('FAIL: the baseline does not apply: ' + r.stderr.strip())
            return 1
        cat = psql_json(url, env, CATALOG)
        pg = pg_schema(cat)
        compare(sq, pg, set(cat['reserved']))
        check_triggers(cat, pg)
        have = psql_json(url, env, "SELECT json_agg(json_build_array(version, name) ORDER BY version)"
                         " FROM schema_migrations")
        if [tuple(x) for x in have] != list(versions):
            fail('schema_migrations: %s in PostgreSQL, %s in SQLite' % (have, versions))
        lease = psql_json(url, env, "SELECT json_agg(json_build_array(id, holder, url, epoch,"
                          " expires_at = '-infinity')) FROM ty_lease")
        if lease != [[1, '', '', 0, True]]:
            fail('ty_lease: the baseline left %s, want one row (1, \'\', \'\', 0, -infinity)' % lease)
        note('schema: %d tables of SQLite at version %d compared with the PostgreSQL baseline (%d bytes)'
             % (len(sq), top, len(baseline)))

        check_fence(url, env)
        check_notes(url, env)
        check_json(url, env)
        cost = trigger_cost(url, env)
        note('triggers: a 10,000-row INSERT INTO jobs took %.1f ms with its triggers disabled, %.1f ms with'
             ' ty_fence and ty_note_ins noting into ty_changes, %.1f ms with ty.capture off'
             ' (EXPLAIN ANALYZE, best of 3)' % (cost['off'], cost['chg'], cost['nochg']))
    except (RuntimeError, TimeoutError, OSError, subprocess.SubprocessError, sqlite3.Error) as e:
        fail('%s: %s' % (type(e).__name__, e))
    finally:
        stop()
    took = time.monotonic() - started
    if failures:
        print('schema_pg_check: %d failures (%.1f s)' % (len(failures), took))
        return 1
    print('schema_pg_check: ok (%.1f s)' % took)
    return 0


if __name__ == '__main__':
    sys.exit(main())
