#!/usr/bin/env python3
"""bench_operator.py - the Python half of bench/bench_operator.sh (standard library only).

  bench_operator.py watch --server URL --token T --ca CA --namespace NS --jobs-file F --out OUT.json
                          [--timeout S] [--submit parallel|kubectl] [--cpu NAME=PID ...] [--metrics URL]
      Lists and watches the CephaloJobs and the pods labelled cephalo.dev/job of NS, then creates
      the jobs of F (t = 0 just before), POSTed from 8 connections at once (--submit kubectl: one
      `kubectl apply -f F`, which creates them one after another), and records, from the watch
      events as they arrive, when every job of F has all its worker pods created (live pods of the job as many as
      its spec.gpus.maxGPUs: the plan takes every GPU it is given), all bound (spec.nodeName), all
      Running, and every job in phase Running. Ends when the jobs are all Running (or at the
      timeout) and writes OUT.json. With --cpu, the CPU seconds each process (the operator, the
      control plane's parts, the kubelets) spent from t = 0 until every pod was bound; with
      --metrics (the operator's /metrics URL), its API requests by verb over the same span.

  bench_operator.py report --before M0 --after M1 --window S --timings OUT.json --params P.json
                           --json RESULT.json
      The operator's cephalo_operator_api_requests_total deltas between two /metrics scrapes:
      requests/s in total and per job, by verb; prints the table and writes RESULT.json.
"""
import argparse
import http.client
import json
import os
import re
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

JOB_LABEL = 'cephalo.dev/job'
CRD_PATH = '/apis/cephalo.dev/v1alpha1'
TARGET_REST = 0.05   # requests/s per job at rest (issue 17)
TARGET_START = 3.0   # seconds for the jobs to have all their pods created, and bound


def meta(o, k, d=None):
    return (o.get('metadata') or {}).get(k, d)


class Api:
    def __init__(self, server, token, ca):
        u = urllib.parse.urlsplit(server)
        self.host, self.port, self.token = u.hostname, u.port or 443, token
        self.ctx = ssl.create_default_context(cafile=ca)

    def conn(self, timeout):
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    def headers(self):
        return {'Authorization': 'Bearer ' + self.token, 'Accept': 'application/json'}

    def list(self, path):
        c = self.conn(30)
        try:
            c.request('GET', path, headers=self.headers())
            r = c.getresponse()
            body = r.read()
            if r.status != 200:
                raise RuntimeError(f'GET {path}: HTTP {r.status}: {body[:200]!r}')
            obj = json.loads(body)
            return obj.get('items') or [], obj['metadata']['resourceVersion']
        finally:
            c.close()


def submit_parallel(api, ns, jobs_file, threads=8):
    """POSTs the jobs of jobs_file (JSON documents after '---' lines, no '---' inside one) from `threads` connections
    at once, as a pipeline submitting a batch would: `kubectl apply` creates them one after
    another (5 to 9 s for 50 on a busy 2-core machine), which would time kubectl, not the operator."""
    docs = [json.loads(d) for d in open(jobs_file).read().split('---') if d.strip()]
    errors, todo, lock = [], list(docs), threading.Lock()

    def worker():
        c = api.conn(60)
        try:
            while True:
                with lock:
                    if not todo:
                        return
                    job = todo.pop(0)
                h = dict(api.headers(), **{'Content-Type': 'application/json'})
                c.request('POST', f'{CRD_PATH}/namespaces/{ns}/cephalojobs', body=json.dumps(job), headers=h)
                r = c.getresponse()
                body = r.read()
                if r.status not in (200, 201):
                    errors.append(f'{meta(job, "name")}: HTTP {r.status}: {body[:200]!r}')
        finally:
            c.close()
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise SystemExit('bench_operator.py: creating the jobs failed: ' + '; '.join(errors[:3]))


class State:
    """The jobs and pods as the watches last told, and the first time each condition held."""

    def __init__(self, names, max_gpus):
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.names = set(names)
        self.max_gpus = max_gpus  # job -> spec.gpus.maxGPUs
        self.jobs, self.pods = {}, {}  # name -> job, uid -> pod_digest
        self.t0 = None
        self.first = {}  # event -> seconds since t0
        self.job_added = {}  # job -> seconds when its creation was seen
        self.job_created = {}  # job -> seconds when all its pods first existed
        self.job_bound = {}
        self.pods_seen, self.pods_deleted = set(), set()
        self.phases = {}
        self.listed = set()  # the kinds listed once
        self.bound = threading.Event()  # every pod bound: the start-up's end

    def mark(self, key, t):
        if key not in self.first:
            self.first[key] = round(t - self.t0, 3)
            if key == 'all_pods_bound':
                self.bound.set()

    def update(self, kind, typ, obj, t):
        with self.lock:
            if kind == 'job':
                name = meta(obj, 'name')
                if typ == 'DELETED':
                    self.jobs.pop(name, None)
                else:
                    self.jobs[name] = obj
                    if self.t0 is not None and name in self.names:
                        self.job_added.setdefault(name, round(t - self.t0, 3))
            else:
                uid = meta(obj, 'uid')
                if typ == 'DELETED':
                    self.pods.pop(uid, None)
                    self.pods_deleted.add(uid)
                else:
                    self.pods[uid] = pod_digest(obj)
                    self.pods_seen.add(uid)
                    if meta(obj, 'deletionTimestamp'):
                        self.pods_deleted.add(uid)
            if self.t0 is not None:
                self.evaluate(t)

    def evaluate(self, t):
        """Per event: kept cheap (the pods as digests, one pass), since this watcher shares the CPUs
        with what it measures."""
        if self.pods:
            self.mark('first_pod', t)
        if self.names <= set(self.jobs):
            self.mark('all_jobs_seen', t)
        live = {}  # job -> [pods: (bound, running)]
        for job, deleting, bound, running in self.pods.values():
            if not deleting:
                live.setdefault(job, []).append((bound, running))
        created = bound = running = 0
        for name in self.names:
            pods = live.get(name, [])
            if len(pods) < self.max_gpus[name]:
                continue
            created += 1
            self.job_created.setdefault(name, round(t - self.t0, 3))
            if all(b for b, _ in pods):
                bound += 1
                self.job_bound.setdefault(name, round(t - self.t0, 3))
            if all(r for _, r in pods):
                running += 1
        n = len(self.names)
        if created == n:
            self.mark('all_pods_created', t)
        if bound == n:
            self.mark('all_pods_bound', t)
        if running == n:
            self.mark('all_pods_running', t)
        phases = {}
        for name in self.names:
            ph = ((self.jobs.get(name) or {}).get('status') or {}).get('phase') or 'none'
            phases[ph] = phases.get(ph, 0) + 1
        self.phases = phases
        if phases.get('Running', 0) == n:
            self.mark('all_jobs_running', t)
            self.done.set()


def pod_digest(p):
    """What evaluate reads of a pod: (its job, being deleted, bound, Running)."""
    return ((meta(p, 'labels') or {}).get(JOB_LABEL), bool(meta(p, 'deletionTimestamp')),
            bool((p.get('spec') or {}).get('nodeName')), (p.get('status') or {}).get('phase') == 'Running')


def follow(api, state, kind, path, stop):
    """List + watch PATH (a collection URL with its query), feeding the state; relists on 410 or
    any failure."""
    rv = None
    sep = '&' if '?' in path else '?'
    while not stop.is_set():
        try:
            if rv is None:
                items, rv = api.list(path)
                t = time.time()
                with state.lock:
                    if kind == 'job':
                        state.jobs = {meta(o, 'name'): o for o in items}
                    else:
                        state.pods = {meta(o, 'uid'): pod_digest(o) for o in items}
                    if state.t0 is not None:
                        state.evaluate(t)
                state.listed.add(kind)
            c = api.conn(330)
            c.request('GET', f'{path}{sep}watch=1&allowWatchBookmarks=true&resourceVersion={rv}'
                      '&timeoutSeconds=300', headers=api.headers())
            r = c.getresponse()
            if r.status == 410:
                rv = None
                continue
            if r.status != 200:
                raise RuntimeError(f'watch {path}: HTTP {r.status}')
            while not stop.is_set():
                line = r.readline()
                if not line:
                    break
                if not line.strip():
                    continue
                t = time.time()
                ev = json.loads(line)
                typ, obj = ev.get('type'), ev.get('object') or {}
                if typ == 'ERROR':
                    rv = None
                    break
                if typ != 'BOOKMARK':
                    state.update(kind, typ, obj, t)
                rv = meta(obj, 'resourceVersion', rv)
            c.close()
        except Exception as e:  # noqa: BLE001 - relist after a pause
            print(f'bench_operator.py: watch {kind}: {type(e).__name__}: {e}; relisting', file=sys.stderr)
            rv = None
            stop.wait(0.5)


def cpu_s(pid):
    """User + system CPU seconds of process pid and its reaped children so far (None: gone)."""
    try:
        f = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()
    except OSError:
        return None
    return sum(int(x) for x in f[11:15]) / os.sysconf('SC_CLK_TCK')


def scrape(url):
    """The operator's request counters by verb, and its reconciles, from its /metrics ({} when
    unreachable)."""
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        m = re.match(r'^cephalo_operator_(?:api_requests_total\{verb="(\w+)"\}|(reconciles)_total) ([0-9.eE+-]+)$',
                     line.strip())
        if m:
            out[m.group(1) or m.group(2)] = float(m.group(3))
    return out


class Snapshot:
    """CPU seconds of the named processes and the operator's request counters, at t = 0 and again
    when every pod is bound: what the start-up cost each part of the system."""

    def __init__(self, pids, metrics):
        self.pids, self.metrics = pids, metrics
        self.cpu0 = {k: cpu_s(p) for k, p in pids.items()}
        self.req0 = scrape(metrics) if metrics else {}
        self.own0 = time.process_time()  # this watcher's own share of the CPUs
        self.cpu, self.req = {}, {}

    def end(self):
        for k, p in self.pids.items():
            c = cpu_s(p)
            if c is not None and self.cpu0[k] is not None:
                self.cpu[k] = round(self.cpu.get(k, 0) + c - self.cpu0[k], 2)
        self.cpu['bench_operator.py'] = round(time.process_time() - self.own0, 2)
        if self.metrics:
            r = scrape(self.metrics)
            self.req = {v: int(r[v] - self.req0.get(v, 0)) for v in r}


def jobs_of(path):
    """name -> spec.gpus.maxGPUs of the CephaloJobs in the multi-document file that bench_operator.sh
    writes (JSON documents, one a line)."""
    out = {}
    for line in open(path):
        line = line.strip()
        if line.startswith('{'):
            d = json.loads(line)
            out[d['metadata']['name']] = d['spec']['gpus']['maxGPUs']
    return out


def watch(a):
    token = a.token or open(a.token_file).read().strip()
    api = Api(a.server, token, a.ca)
    max_gpus = jobs_of(a.jobs_file)
    state = State(max_gpus, max_gpus)
    stop = threading.Event()
    ns = a.namespace
    for kind, path in (('job', f'{CRD_PATH}/namespaces/{ns}/cephalojobs'),
                       ('pod', f'/api/v1/namespaces/{ns}/pods?labelSelector=' +
                        urllib.parse.quote(JOB_LABEL))):
        threading.Thread(target=follow, args=(api, state, kind, path, stop), daemon=True).start()
    deadline = time.time() + 60
    while len(state.listed) < 2:
        if time.time() > deadline:
            raise SystemExit('bench_operator.py: could not list the jobs and pods within 60 s')
        time.sleep(0.05)
    pids = {}
    for kv in a.cpu or []:
        name, _, pid = kv.partition('=')
        if not pid.isdigit():
            raise SystemExit(f'bench_operator.py: --cpu {kv}: expected NAME=PID')
        pids[f'{name}#{len(pids)}'] = int(pid)
    snap = Snapshot(pids, a.metrics)
    with state.lock:
        state.t0 = time.time()

    def at_bound():
        state.bound.wait()
        snap.end()
    bound_snap = threading.Thread(target=at_bound, daemon=True)
    bound_snap.start()
    if a.submit == 'kubectl':
        r = subprocess.run(['kubectl', '--request-timeout=60s', 'apply', '-f', a.jobs_file],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise SystemExit(f'bench_operator.py: kubectl apply failed: {r.stderr.strip()}')
    else:
        submit_parallel(api, ns, a.jobs_file)
    t_applied = time.time()
    last = 0.0
    while not state.done.wait(1.0):
        now = time.time()
        if now - state.t0 > a.timeout:
            break
        if now - last >= 10:
            last = now
            with state.lock:
                print(f'# {now - state.t0:5.0f} s: jobs {dict(sorted(state.phases.items()))}, '
                      f'{len(state.job_created)}/{len(max_gpus)} with all pods, '
                      f'{len(state.pods_seen)} pods seen', file=sys.stderr, flush=True)
    stop.set()
    if state.bound.is_set():
        bound_snap.join(10)  # its figures are read below
    with state.lock:
        created = sorted(state.job_created.values())
        half = (len(max_gpus) + 1) // 2
        # each job's own latency: from its creation (as the watch saw it) to all its pods
        lat = sorted(round(state.job_created[j] - state.job_added[j], 3)
                     for j in state.job_created if j in state.job_added)
        first = state.first
        res = {
            'apply_s': round(t_applied - state.t0, 3),
            'first_pod_s': state.first.get('first_pod'),
            'all_pods_created_s': state.first.get('all_pods_created'),
            'all_pods_bound_s': state.first.get('all_pods_bound'),
            'all_pods_running_s': state.first.get('all_pods_running'),
            'all_jobs_running_s': state.first.get('all_jobs_running'),
            'all_jobs_created_s': first.get('all_jobs_seen'),
            'all_pods_created_after_first_job_s': (round(first['all_pods_created'] - min(state.job_added.values()), 3)
                                                   if 'all_pods_created' in first and state.job_added else None),
            'all_pods_created_after_last_job_s': (round(first['all_pods_created'] - first['all_jobs_seen'], 3)
                                                  if 'all_pods_created' in first and 'all_jobs_seen' in first else None),
            'job_latency_median_s': lat[len(lat) // 2] if lat else None,
            'job_latency_max_s': lat[-1] if lat else None,
            'jobs_with_all_pods': len(state.job_created),
            # when the (n+1)//2-th job had all its pods: half the jobs
            'half_jobs_all_pods_s': created[half - 1] if len(created) >= half else None,
            'jobs_all_pods_s': created,  # each job that got all its pods, in order
            'pods_created': len(state.pods_seen),
            'pods_deleted': len(state.pods_deleted),
            'gpus_requested': sum(max_gpus.values()),
            'job_phases_at_end': state.phases,
            'timed_out': not state.done.is_set(),
        }
        cpu = {}
        for k, v in snap.cpu.items():  # several processes of a name (kubelets) summed
            name = k.split('#')[0]
            cpu[name] = round(cpu.get(name, 0) + v, 2)
        if cpu:
            res['cpu_to_bound_s'] = cpu
        if snap.req:
            res['requests_to_bound'] = snap.req
    json.dump(res, open(a.out, 'w'), indent=1)
    return 0 if state.done.is_set() else 1


def counters(path):
    out = {}
    for line in open(path):
        m = re.match(r'^cephalo_operator_(api_requests_total\{verb="(\w+)"\}|reconciles_total|'
                     r'reconcile_seconds_sum) ([0-9.eE+-]+)$', line.strip())
        if m:
            out[m.group(2) or m.group(1)] = float(m.group(3))
    return out


def fmt(x, unit=''):
    return '-' if x is None else f'{x:.2f}{unit}' if isinstance(x, float) else f'{x}{unit}'


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


def report(a):
    p = json.load(open(a.params))
    rounds = [json.load(open(f)) for f in a.timings]
    # the round whose every-pod-bound time is the median stands for the start-up (a round that never
    # got there counts as the slowest)
    order = sorted(range(len(rounds)), key=lambda i: (rounds[i].get('all_pods_bound_s') is None,
                                                        rounds[i].get('all_pods_bound_s') or 0))
    tm = rounds[order[len(order) // 2]]
    tm['timed_out'] = any(r['timed_out'] for r in rounds)
    c0, c1 = counters(a.before), counters(a.after)
    verbs = ['get', 'list', 'create', 'update', 'patch', 'delete', 'watch']
    if not any(v in c1 for v in verbs):
        raise SystemExit('bench_operator.py: the operator exports no cephalo_operator_api_requests_total')
    jobs, win = p['jobs'], a.window
    by_verb = {}
    for v in verbs:
        d = c1.get(v, 0) - c0.get(v, 0)
        by_verb[v] = {'requests': int(d), 'per_s': round(d / win, 4), 'per_s_per_job': round(d / win / jobs, 5)}
    total = sum(x['requests'] for x in by_verb.values())
    rest = {'window_s': win, 'requests': total, 'per_s': round(total / win, 4),
            'per_s_per_job': round(total / win / jobs, 5), 'by_verb': by_verb,
            'reconciles': int(c1.get('reconciles_total', 0) - c0.get('reconciles_total', 0)),
            # seconds the reconcile loop (one thread) was busy: near the window, it is saturated
            'reconcile_busy_s': round(c1.get('reconcile_seconds_sum', 0) - c0.get('reconcile_seconds_sum', 0), 2),
            # every job Running before the window; otherwise the operator was still starting jobs
            'at_rest': not tm['timed_out']}
    for k in ('operator_cpu_s', 'apiserver_cpu_s'):
        if k in p:
            rest[k] = p.pop(k)
    # the status writes (PUT .../status): with workers that serve no /metrics, what is left of them
    # at rest is the operator's own bookkeeping (status.progressTime, rewritten every 5 s)
    no_upd = total - by_verb['update']['requests']
    rest['per_s_per_job_less_updates'] = round(no_upd / win / jobs, 5)
    # the goals hold for the median round (a round that never got there counts as the slowest)
    created = median(r.get('all_pods_created_s', float('inf')) or float('inf') for r in rounds)
    bound = median(r.get('all_pods_bound_s', float('inf')) or float('inf') for r in rounds)
    met = {'rest_per_job': rest['per_s_per_job'] < TARGET_REST,
           'rest_per_job_less_updates': rest['per_s_per_job_less_updates'] < TARGET_REST,
           'all_pods_created': created < TARGET_START,
           'all_pods_bound': bound < TARGET_START}
    res = dict(p, startup=tm, startup_rounds=rounds, rest=rest,
               targets={'rest_requests_per_s_per_job': TARGET_REST, 'startup_s': TARGET_START}, met=met)
    json.dump(res, open(a.json, 'w'), indent=1)

    ok = {True: 'met', False: 'NOT met'}
    print(f"\ncephalo-operator scale benchmark: {p['operator']}")
    mix = {}
    for part in p['gpu_mix'].split(';'):
        prod, _, cnt = part.split()
        mix.setdefault(prod, []).append(cnt)
    mix = ', '.join(f"{k} x{'/'.join(v)}" for k, v in mix.items())
    print(f"  {p['nodes']} nodes ({p['gpus']} GPUs; per 10 nodes: {mix})")
    print(f"  {p['kubelets']} kubelet.py processes, "
          f"heartbeat {p['heartbeat_s']:g} s; {jobs} CephaloJobs of 2..8 GPUs ({tm['gpus_requested']} GPUs)")
    rows = [('kubectl apply returned', 'apply_s', None),
            ('every job created (seen by the watch)', 'all_jobs_created_s', None),
            ('first worker pod created', 'first_pod_s', None),
            ('half the jobs with all their pods', 'half_jobs_all_pods_s', None),
            ('every job with all its pods created', 'all_pods_created_s', 'all_pods_created'),
            ('... all bound (spec.nodeName)', 'all_pods_bound_s', 'all_pods_bound'),
            ('... after the first job was created', 'all_pods_created_after_first_job_s', None),
            ('... after the last job was created', 'all_pods_created_after_last_job_s', None),
            ('... all Running (kubelet.py)', 'all_pods_running_s', None),
            ('one job, creation to all its pods: median', 'job_latency_median_s', None),
            ('... the slowest job', 'job_latency_max_s', None),
            ('every job in phase Running', 'all_jobs_running_s', None)]
    multi = len(rounds) > 1
    head = ''.join(f'{"round " + str(i + 1):>9s}' for i in range(len(rounds))) + (f'{"median":>9s}' if multi else '')
    print(f"\n  {'start-up (from kubectl apply), seconds':44s}{head}   target")
    for label, key, goal in rows:
        vals = [r.get(key) for r in rounds]
        cells = ''.join(f'{fmt(v):>9s}' for v in vals) + (f'{fmt(median(vals)):>9s}' if multi else '')
        target = f"   < {TARGET_START:g} s: {ok[met[goal]]}" if goal else ''
        print(f"  {label:44s}{cells}{target}")
    which = f' (round {order[len(order) // 2] + 1})' if multi else ''
    if tm.get('cpu_to_bound_s'):
        cpu = tm['cpu_to_bound_s']
        print(f"  {'CPU seconds until all bound' + which:44s} " + ', '.join(f'{k} {v:.2f}' for k, v in
                                                                  sorted(cpu.items(), key=lambda kv: -kv[1]))
              + f" (total {sum(cpu.values()):.2f} on {p['cores']} cores)")
    if tm.get('requests_to_bound'):
        rq = tm['requests_to_bound']
        verbs = {k: v for k, v in rq.items() if k != 'reconciles'}
        print(f"  {'operator requests until all bound' + which:44s} " + ', '.join(f'{k} {v}' for k, v in sorted(verbs.items()) if v)
              + f" (total {sum(verbs.values())}; {rq.get('reconciles', 0)} reconciles)")
    print(f"  pods created {tm['pods_created']}, deleted {tm['pods_deleted']}"
          + ('   (TIMED OUT: ' + json.dumps(tm['job_phases_at_end']) + ')' if tm['timed_out'] else ''))
    print(f"\n  at rest, {win:g} s window ({rest['reconciles']} reconciles, the loop busy {rest['reconcile_busy_s']:g} s"
          + (f", operator CPU {rest['operator_cpu_s']:.1f} s" if 'operator_cpu_s' in rest else '')
          + (f", kube-apiserver CPU {rest['apiserver_cpu_s']:.1f} s" if 'apiserver_cpu_s' in rest else '') + ')')
    if not rest['at_rest']:
        print(f"  NOT at rest: the start-up timed out with {tm['jobs_with_all_pods']} of {jobs} jobs having all "
              f"their pods; the operator was still starting jobs")
    print(f"  {'verb':8s} {'requests':>9s} {'req/s':>9s} {'req/s/job':>10s}")
    for v in verbs:
        x = by_verb[v]
        print(f"  {v:8s} {x['requests']:9d} {x['per_s']:9.3f} {x['per_s_per_job']:10.4f}")
    print(f"  {'total':8s} {total:9d} {rest['per_s']:9.3f} {rest['per_s_per_job']:10.4f}   "
          f"< {TARGET_REST:g}/job: {ok[met['rest_per_job']]}")
    print(f"  {'- update':8s} {no_upd:9d} {no_upd / win:9.3f} {rest['per_s_per_job_less_updates']:10.4f}   "
          f"< {TARGET_REST:g}/job: {ok[met['rest_per_job_less_updates']]} (the total less the status writes)")
    print(f"\n  written to {a.json}")
    return 0


def main():
    ap = argparse.ArgumentParser(prog='bench_operator.py')
    sub = ap.add_subparsers(dest='cmd', required=True)
    w = sub.add_parser('watch')
    w.add_argument('--server', required=True)
    w.add_argument('--token')
    w.add_argument('--token-file')
    w.add_argument('--ca', required=True)
    w.add_argument('--namespace', required=True)
    w.add_argument('--jobs-file', required=True)
    w.add_argument('--out', required=True)
    w.add_argument('--timeout', type=float, default=300)
    w.add_argument('--submit', choices=['parallel', 'kubectl'], default='parallel',
                   help='create the jobs from 8 connections at once (default), or with one kubectl apply')
    w.add_argument('--cpu', action='append', metavar='NAME=PID',
                   help='count this process\'s CPU seconds until every pod is bound (repeatable; a name '
                        'given more than once is summed)')
    w.add_argument('--metrics', help="the operator's /metrics URL: its requests until every pod is bound")
    r = sub.add_parser('report')
    for k in ('--before', '--after', '--params', '--json'):
        r.add_argument(k, required=True)
    r.add_argument('--timings', nargs='+', required=True, help="each round's watch output")
    r.add_argument('--window', type=float, required=True)
    a = ap.parse_args()
    return watch(a) if a.cmd == 'watch' else report(a)


if __name__ == '__main__':
    sys.exit(main())
