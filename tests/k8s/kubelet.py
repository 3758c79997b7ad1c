#!/usr/bin/env python3
"""kubelet.py - a small fake kubelet for tests: runs the pods bound to some Nodes as local processes.

The test cluster (tests/k8s/apiserver.sh) has a real kube-apiserver + etcd (and, with
--control-plane, kube-scheduler and kube-controller-manager) but no kubelet. This plays the kubelet
of the Nodes named by --nodes: like a kubelet it runs the pods bound to them (spec.nodeName, set by
the scheduler's binding, which places the operator's worker pods, or by a pod's creator):

  * list + watch all pods (all namespaces) with resourceVersion; a dropped connection or an API
    server restart is retried with backoff, 410 Gone relists; pods that vanished meanwhile are
    stopped as if deleted;
  * the nodes: with --register, the Nodes of --nodes that do not exist yet are created (labels
    kubernetes.io/hostname, os, arch and --node-label's; capacity = allocatable = cpu 8, memory
    32Gi, pods 110 and --node-gpus' nvidia.com/gpu). Every --heartbeat seconds (10; 0: never) each
    node's Lease in kube-node-lease is renewed (the nodes' beats spread over the period after the
    first, as kubelets on their own clocks would be), and its Ready condition (True, KubeletReady) at the
    first heartbeat and then every --status-report seconds (300), as a kubelet does (its
    nodeStatusReportFrequency: an unchanged status is reported every 5 minutes, the Lease says it
    is alive): the controller-manager's node lifecycle controller takes the not-ready taint
    that new Nodes get off once Ready is True, and taints a node unreachable (its pods evicted)
    when neither was renewed for 40 s. A Node that does not exist (deleted) is left alone until
    it exists again (someone else creates it; this kubelet registers only at start);
  * admission, as a kubelet's: a pod whose nvidia.com/gpu request (its containers' limits, else
    requests, summed; the largest init container's if more) exceeds the node's allocatable
    nvidia.com/gpu less the requests of the pods admitted on that node and not finished is
    refused: status Failed, reason OutOfnvidia.com/gpu, message "Pod Node didn't have enough
    resource: nvidia.com/gpu, requested: R, used: U, capacity: C"; it never runs. Pods are admitted
    in order of creation;
  * a pod bound to one of the nodes, new, not being deleted, admitted: it gets its own loopback IP
    (127.0.1.1, 127.0.1.2, ... never reused in a run) and its container runs as a process. A
    worker pod (labelled cephalo.dev/job): argv = WORKER + container.args + --extra-arg... +
    --metrics-addr POD_IP when $CEPHALO_METRICS_PORT is not 0 (container.command is ignored). Any other pod (there are no images
    here): its container's command + args as a local program (e.g. sleep 3600), args alone when
    there is no command (as for a busybox-like image without an entrypoint), `sleep infinity`
    when there are neither (a stand-in for the image's own entrypoint). With --image-cmd
    IMAGE=PATH, a pod (not a worker) whose container image is IMAGE runs PATH + container.args
    instead, its command replaced, as the image's entry point would be: IMAGE without a tag or
    digest matches the image with any (or none), IMAGE:TAG only that tag. Env = the container's
    env (value, $(VAR) references, valueFrom.fieldRef of metadata.name/namespace/uid, spec.nodeName,
    status.podIP/hostIP) over PATH, HOME and OMP_NUM_THREADS=1. MASTER_ADDR of the form
    HOST.SUBDOMAIN.NS.svc[.cluster.local] is replaced by the IP of the pod with that
    spec.hostname/spec.subdomain (the headless Service's DNS name), waiting until it has one;
  * volumes: configMap -> its keys written as files in WORK/volumes/UID/VOLUME/ at start;
    persistentVolumeClaim -> WORK/pvc/CLAIM/ (shared by pods and restarts, like a real claim);
    emptyDir -> WORK/volumes/UID/VOLUME/; hostPath -> the path. Any arg or env value that starts
    with a volumeMount's mountPath is rewritten to the local directory;
  * with --service-account-tokens, what a kubelet gives a pod for its ServiceAccount (the API
    server here runs without the ServiceAccount admission plugin, so no pod gets the volume
    itself): every pod gets KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT(_HTTPS) and
    KUBERNETES_PORT naming the real API server (--server's host and port), under its container's
    env; a pod with spec.serviceAccountName (not opting out with automountServiceAccountToken:
    false, its own or else the ServiceAccount's) also gets the files token, ca.crt and namespace
    of that account's token Secret (type kubernetes.io/service-account-token, which the controller
    manager's token controller creates: one of the account's .secrets, else one annotated
    kubernetes.io/service-account.name/uid with the account's) in WORK/volumes/UID/serviceaccount/,
    standing for /var/run/secrets/kubernetes.io/serviceaccount: args and env values under that path
    are rewritten to it, and env CEPHALO_SERVICEACCOUNT_DIR names it (a local process cannot have
    the fixed path; cephalo-operator's in-cluster configuration reads it from there). The pod waits
    (not started) until the account and its token exist;
  * WORK/logs/NS_POD_UID8.log: the container's stdout+stderr; WORK/pids/NS_POD.pid: its pid while
    it runs (a test may kill it);
  * the pod status through PATCH .../pods/NAME/status (merge patch, with the uid as precondition),
    retried until the API server takes it: Running (podIP, hostIP 127.0.0.1, startTime, Ready,
    containerStatuses running) on start; Succeeded (exit 0) or Failed on exit, with the container
    terminated {exitCode (128+N for signal N), reason Completed|Error, startedAt, finishedAt; a
    failed container with terminationMessagePolicy FallbackToLogsOnError: message, the last 80
    lines of its log, at most 2048 bytes}.
    restartPolicy is taken as Never: a container is never restarted;
  * a pod with a deletionTimestamp: SIGTERM, SIGKILL after its grace period (at most 10 s), the
    final status, then DELETE with gracePeriodSeconds=0 and a uid precondition, which is how a
    kubelet completes a graceful deletion (the API server keeps a bound pod until then);
  * a pod found Running that this kubelet did not start (an earlier run's) is reported Failed,
    reason ContainerStatusUnknown, exit code 137: it is never run twice.

One line per action on stderr. SIGTERM/SIGINT stop the processes it started and exit 0.
Python 3 standard library only.
"""
import argparse
import base64
import ctypes
import http.client
import json
import os
import random
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse

WORKER_LABEL = 'cephalo.dev/job'  # the operator's worker pods: they run --worker
GPU = 'nvidia.com/gpu'
MAX_GRACE_S = 10.0
LEASE_DURATION_S = 40  # a kubelet's default (nodeLeaseDurationSeconds)
SA_MOUNT = '/var/run/secrets/kubernetes.io/serviceaccount'  # where a kubelet mounts the token
SA_DIR_ENV = 'CEPHALO_SERVICEACCOUNT_DIR'  # where this kubelet's pods find it instead
SA_TOKEN_TYPE = 'kubernetes.io/service-account-token'
WATCH_TIMEOUT_S = 60


def log(msg):
    t = time.time()
    stamp = time.strftime('%H:%M:%S', time.localtime(t)) + '.%03d' % int((t % 1) * 1000)
    print(f'kubelet {stamp} {msg}', file=sys.stderr, flush=True)


def rfc3339(t):
    return time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(t))


def rfc3339_micro(t):
    """A MicroTime (a Lease's renewTime)."""
    return time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(t)) + '.%06dZ' % int((t % 1) * 1e6)


def meta(obj, key, default=None):
    return (obj.get('metadata') or {}).get(key, default)


def pod_key(pod):
    return f"{meta(pod, 'namespace')}/{meta(pod, 'name')}"


# ---- the API -------------------------------------------------------------------------------------

class ApiError(Exception):
    def __init__(self, status, msg):
        super().__init__(msg)
        self.status = status


class Api:
    def __init__(self, server, token, ca):
        u = urllib.parse.urlsplit(server)
        if u.scheme != 'https' or not u.hostname:
            raise SystemExit(f'kubelet.py: --server {server!r}: expected https://HOST:PORT')
        self.host, self.port = u.hostname, u.port or 443
        self.token = token
        self.ctx = ssl.create_default_context(cafile=ca)
        self.local = threading.local()  # each thread's kept connection

    def connect(self, timeout):
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    def headers(self, ctype=None):
        h = {'Authorization': 'Bearer ' + self.token, 'Accept': 'application/json',
             'User-Agent': 'cephalo-test-kubelet'}
        if ctype:
            h['Content-Type'] = ctype
        return h

    def request(self, method, path, body=None, ctype='application/json', timeout=5):
        """(status, object or None); status 0 when no answer came. Each thread keeps its connection
        open between requests, as a real kubelet does: a TLS handshake per request cost the API
        server a fifth of its CPU under load (its RSA signature). A kept connection that the
        server closed while idle fails at once; that request is sent again on a new one."""
        data = json.dumps(body).encode() if body is not None else None
        for attempt in (0, 1):
            c = getattr(self.local, 'conn', None)
            reused = c is not None
            if c is None:
                c = self.local.conn = self.connect(timeout)
            try:
                c.timeout = timeout
                if c.sock is not None:
                    c.sock.settimeout(timeout)
                c.request(method, path, body=data, headers=self.headers(ctype if data else None))
                r = c.getresponse()
                raw = r.read()
                if r.will_close:
                    self.drop()
                try:
                    obj = json.loads(raw) if raw else None
                except ValueError:
                    obj = None
                return r.status, obj
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                self.drop()
                if not reused or attempt:
                    return 0, {'message': f'{type(e).__name__}: {e}'}
            except (OSError, http.client.HTTPException) as e:
                self.drop()
                return 0, {'message': f'{type(e).__name__}: {e}'}
        return 0, {'message': 'no answer'}

    def drop(self):
        """Closes this thread's kept connection (the next request opens a new one)."""
        c = getattr(self.local, 'conn', None)
        self.local.conn = None
        if c is not None:
            c.close()


def status_message(obj):
    if isinstance(obj, dict):
        return obj.get('message') or obj.get('reason') or ''
    return ''


# ---- the pods' cache (list + watch) --------------------------------------------------------------

class PodStore:
    """All pods as the API server last told; uid -> pod."""

    def __init__(self):
        self.lock = threading.Lock()
        self.pods = {}
        self.synced = False
        self.changed = threading.Event()

    def replace(self, items):
        with self.lock:
            self.pods = {meta(p, 'uid'): p for p in items}
            self.synced = True
        self.changed.set()

    def put(self, pod):
        with self.lock:
            self.pods[meta(pod, 'uid')] = pod
        self.changed.set()

    def remove(self, pod):
        with self.lock:
            self.pods.pop(meta(pod, 'uid'), None)
        self.changed.set()

    def snapshot(self):
        with self.lock:
            return dict(self.pods), self.synced


class Watcher(threading.Thread):
    def __init__(self, api, store, stop):
        super().__init__(name='watch', daemon=True)
        self.api, self.store, self.stop = api, store, stop

    def list(self):
        items, cont = [], ''
        while True:
            path = '/api/v1/pods?limit=500'
            if cont:
                path += '&continue=' + urllib.parse.quote(cont, safe='')
            st, obj = self.api.request('GET', path, timeout=20)
            if st != 200:
                raise ApiError(st, f'list pods: HTTP {st}: {status_message(obj)}')
            items += obj.get('items') or []
            cont = (obj.get('metadata') or {}).get('continue') or ''
            if not cont:
                rv = obj['metadata']['resourceVersion']
                break
        self.store.replace(items)
        log(f'listed {len(items)} pods at resourceVersion {rv}')
        return rv

    def watch(self, rv):
        """Follows the watch from rv. Returns (rv, gone, events)."""
        path = (f'/api/v1/pods?watch=1&allowWatchBookmarks=true'
                f'&resourceVersion={rv}&timeoutSeconds={WATCH_TIMEOUT_S}')
        c = self.api.connect(WATCH_TIMEOUT_S + 30)
        events = 0
        try:
            c.request('GET', path, headers=self.api.headers())
            r = c.getresponse()
            if r.status == 410:
                return rv, True, 0
            if r.status != 200:
                raise ApiError(r.status, f'watch pods: HTTP {r.status}: {status_message(_json(r.read()))}')
            while not self.stop.is_set():
                line = r.readline()
                if not line:
                    break  # the server ended the watch (its timeout, or it went away)
                line = line.strip()
                if not line:
                    continue
                ev = json.loads(line)
                typ, obj = ev.get('type'), ev.get('object') or {}
                if typ == 'ERROR':
                    if obj.get('code') == 410:
                        return rv, True, events
                    raise ApiError(obj.get('code', 0), f'watch pods: ERROR event: {status_message(obj)}')
                if typ in ('ADDED', 'MODIFIED'):
                    self.store.put(obj)
                elif typ == 'DELETED':
                    self.store.remove(obj)
                elif typ != 'BOOKMARK':
                    raise ApiError(0, f'watch pods: unknown event type {typ!r}')
                rv = meta(obj, 'resourceVersion', rv)
                events += 1
            return rv, False, events
        finally:
            c.close()

    def run(self):
        rv, failures = None, 0
        while not self.stop.is_set():
            try:
                if rv is None:
                    rv = self.list()
                    failures = 0
                t0 = time.monotonic()
                rv, gone, events = self.watch(rv)
                if gone:
                    log('watch: resourceVersion too old (410 Gone): listing again')
                    rv = None
                    continue
                if events == 0 and time.monotonic() - t0 < 1.0:
                    raise ApiError(0, 'watch pods: the stream ended at once')
                failures = 0
            except Exception as e:  # noqa: BLE001 - whatever it was, list/watch again after a pause
                failures += 1
                delay = min(0.25 * 2 ** (failures - 1), 4.0) * random.uniform(0.5, 1.0)
                log(f'watch: {type(e).__name__}: {e}; retrying in {delay:.1f}s')
                self.stop.wait(delay)


def _json(raw):
    try:
        return json.loads(raw)
    except ValueError:
        return None


# ---- the nodes: registration and heartbeat -------------------------------------------------------

def quantity_int(q):
    """A whole-number resource quantity ("2" or 2: GPUs are counted whole); 0 for anything else."""
    try:
        return int(str(q))
    except ValueError:
        return 0


def pod_gpus(pod):
    """The pod's nvidia.com/gpu request as a scheduler and a kubelet count it: the containers'
    (limits, which the API server copies to requests for extended resources, else requests)
    summed, or the largest init container's if that is more."""
    spec = pod.get('spec') or {}

    def one(c):
        r = c.get('resources') or {}
        v = (r.get('limits') or {}).get(GPU, (r.get('requests') or {}).get(GPU, 0))
        return quantity_int(v)
    total = sum(one(c) for c in spec.get('containers') or [])
    return max([total] + [one(c) for c in spec.get('initContainers') or []])


class NodeKeeper(threading.Thread):
    """Registers the nodes (--register) and renews their Ready condition and Lease."""

    def __init__(self, api, nodes, args, stop):
        super().__init__(name='nodes', daemon=True)
        self.api, self.nodes, self.args, self.stop = api, sorted(nodes), args, stop
        self.since = rfc3339(time.time())  # Ready's lastTransitionTime: Ready since this kubelet began
        self.state = {}  # node -> the last outcome logged ('ok', 'absent', 'HTTP 500 ...')
        self.reported = {}  # node -> when its Ready condition was last reported
        self.uid = {}  # node -> its uid (the Lease's owner), known once its status was patched
        self.gpus, self.labels = {}, {n: {} for n in self.nodes}
        for g in args.node_gpus:
            name, _, count = g.partition('=')
            if name not in self.labels or not count.isdigit():
                raise SystemExit(f'kubelet.py: --node-gpus {g!r}: expected NODE=COUNT for a node of --nodes')
            self.gpus[name] = int(count)
        for lab in args.node_label:
            name, _, kv = lab.partition(':')
            key, eq, value = kv.partition('=')
            if name not in self.labels or not key or not eq:
                raise SystemExit(f'kubelet.py: --node-label {lab!r}: expected NODE:KEY=VALUE for a node of --nodes')
            self.labels[name][key] = value

    def ready(self, now):
        return {'type': 'Ready', 'status': 'True', 'reason': 'KubeletReady',
                'message': 'kubelet.py is posting ready status', 'lastHeartbeatTime': rfc3339(now),
                'lastTransitionTime': self.since}

    def register(self, name):
        """True once the Node exists (created now or before)."""
        res = {'cpu': '8', 'memory': '32Gi', 'pods': '110'}
        if name in self.gpus:
            res[GPU] = str(self.gpus[name])
        labels = {'kubernetes.io/hostname': name, 'kubernetes.io/os': 'linux', 'kubernetes.io/arch': 'amd64'}
        labels.update(self.labels[name])
        node = {'apiVersion': 'v1', 'kind': 'Node', 'metadata': {'name': name, 'labels': labels},
                'status': {'capacity': res, 'allocatable': dict(res), 'conditions': [self.ready(time.time())]}}
        st, obj = self.api.request('POST', '/api/v1/nodes', node)
        if st == 201:
            log(f'node {name}: registered ({", ".join(f"{k} {v}" for k, v in res.items())})')
            return True
        if st == 409:
            log(f'node {name}: already registered')
            return True
        log(f'node {name}: register: HTTP {st}: {status_message(obj)}; retrying')
        return False

    def note(self, name, state, msg):
        if self.state.get(name) != state:
            log(f'node {name}: {msg}')
        self.state[name] = state

    def beat(self, name):
        now = time.time()
        fresh = now - self.reported.get(name, 0) >= self.args.status_report or name not in self.uid
        if fresh:
            # a strategic merge patch: the conditions list is merged by type, the others are kept
            st, obj = self.api.request('PATCH', f'/api/v1/nodes/{name}/status',
                                       {'status': {'conditions': [self.ready(now)]}},
                                       ctype='application/strategic-merge-patch+json')
            if st == 404:
                self.uid.pop(name, None)
                self.note(name, 'absent', 'no such Node (deleted?): no heartbeat until it exists again')
                return
            if st != 200:
                self.note(name, f'HTTP {st}', f'heartbeat: HTTP {st}: {status_message(obj)}; trying again')
                return
            self.uid[name], self.reported[name] = meta(obj, 'uid'), now
        uid = self.uid[name]
        lease = f'/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}'
        spec = {'holderIdentity': name, 'leaseDurationSeconds': LEASE_DURATION_S,
                'renewTime': rfc3339_micro(now)}
        st, obj = self.api.request('PATCH', lease, {'spec': spec}, ctype='application/merge-patch+json')
        if st == 404 and not fresh:  # the Lease is gone (its Node deleted?): the Node's status first
            self.uid.pop(name, None)
            return self.beat(name)
        if st == 404:  # the first beat: create it, owned by the Node (gone with it), as a kubelet does
            st, obj = self.api.request('POST', '/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases', {
                'apiVersion': 'coordination.k8s.io/v1', 'kind': 'Lease',
                'metadata': {'name': name, 'ownerReferences': [
                    {'apiVersion': 'v1', 'kind': 'Node', 'name': name, 'uid': uid}]},
                'spec': spec})
        if st not in (200, 201):
            self.note(name, f'lease HTTP {st}', f'lease: HTTP {st}: {status_message(obj)}; trying again')
            return
        self.note(name, 'ok', f'Ready, Lease renewed every {self.args.heartbeat:g}s, the condition every '
                              f'{max(self.args.heartbeat, self.args.status_report):g}s')

    def run(self):
        todo = list(self.nodes) if self.args.register else []
        while todo and not self.stop.is_set():
            todo = [n for n in todo if not self.register(n)]
            if todo:
                self.stop.wait(1.0)
        first = True
        while self.args.heartbeat > 0 and not self.stop.is_set():
            start = time.monotonic()
            for i, name in enumerate(self.nodes):
                # after the first round, each node's beat at its own point of the period, as kubelets
                # on their own clocks: not every node in one burst (hundreds of requests at once)
                due = start + (0 if first else self.args.heartbeat * i / len(self.nodes))
                if self.stop.wait(max(0.0, due - time.monotonic())):
                    return
                try:
                    self.beat(name)
                except Exception as e:  # noqa: BLE001 - a heartbeat must not end the thread
                    self.note(name, 'error', f'heartbeat: {type(e).__name__}: {e}')
            first = False
            self.stop.wait(max(0.0, start + self.args.heartbeat - time.monotonic()))


# ---- running pods --------------------------------------------------------------------------------

class Instance:
    """One pod (one uid) bound to our nodes and what this kubelet did with it."""

    def __init__(self, pod):
        self.pod = pod
        self.ns, self.name, self.uid = meta(pod, 'namespace'), meta(pod, 'name'), meta(pod, 'uid')
        self.key = f'{self.ns}/{self.name}'
        self.ip = None
        self.proc = None
        self.pid_file = None
        self.started = None  # epoch seconds
        self.finished = None
        self.exit_code = None
        self.signal = None
        self.done_before = False  # finished (or started by someone else) before this kubelet saw it
        self.admitted = False  # passed admission: holds its GPUs on the node until it finishes
        self.rejected = False  # refused at admission (Failed, OutOfnvidia.com/gpu): never runs
        self.gpus = pod_gpus(pod)
        self.waiting = None  # the last reason it could not start yet (logged once)
        self.status = None  # the status patch still to write
        self.status_try = 0.0
        self.status_failures = 0
        self.deleting = False
        self.term_at = None
        self.kill_at = None
        self.killed = False
        self.delete_try = 0.0
        self.delete_failures = 0
        self.gone = False  # deleted from the API (by us or anyone)

    def running(self):
        return self.proc is not None and self.exit_code is None

    def grace(self):
        g = meta(self.pod, 'deletionGracePeriodSeconds')
        if g is None:
            g = (self.pod.get('spec') or {}).get('terminationGracePeriodSeconds', 30)
        return max(0.0, min(float(g), MAX_GRACE_S))


class NotYet(Exception):
    """The pod cannot start yet (a ConfigMap or the master's IP is missing); tried again later."""


MASTER_RE = re.compile(r'^([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.'
                       r'([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.svc(\.cluster\.local)?\.?$')


def expand(s, env):
    """Kubernetes' $(VAR) expansion: $(VAR) of a defined variable is its value, $$ is $."""
    out, i = [], 0
    while i < len(s):
        if s[i] == '$' and i + 1 < len(s):
            if s[i + 1] == '$':
                out.append('$')
                i += 2
                continue
            if s[i + 1] == '(':
                j = s.find(')', i + 2)
                if j > 0:
                    name = s[i + 2:j]
                    out.append(env[name] if name in env else s[i:j + 1])
                    i = j + 1
                    continue
        out.append(s[i])
        i += 1
    return ''.join(out)


def image_repo(image):
    """An image reference less its tag and digest: registry:5000/a/b:1.0@sha256:... -> registry:5000/a/b."""
    image = image.split('@', 1)[0]
    slash = image.rfind('/')
    colon = image.rfind(':')
    return image[:colon] if colon > slash else image


def parse_image_cmds(specs):
    """--image-cmd IMAGE=PATH... -> [(IMAGE, absolute PATH)], in order."""
    out = []
    for spec in specs:
        image, eq, path = spec.partition('=')
        if not image or not eq or not path:
            raise SystemExit(f'kubelet.py: --image-cmd {spec!r}: expected IMAGE=PATH')
        path = os.path.abspath(path)
        if not os.access(path, os.X_OK):
            raise SystemExit(f'kubelet.py: --image-cmd {spec!r}: {path} is not an executable')
        out.append((image, path))
    return out


def image_program(image_cmds, image):
    """The program --image-cmd maps a container image to, or None. IMAGE with a tag or digest
    matches exactly; IMAGE without one matches that image with any tag or digest, or none."""
    for want, path in image_cmds:
        if image == want or (want == image_repo(want) and image_repo(image) == want):
            return path
    return None


def pdeathsig_setter():
    """A preexec_fn that makes the child get SIGKILL when this process dies (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    def set_it():
        prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    return set_it


class Kubelet:
    def __init__(self, args):
        self.args = args
        self.nodes = set(n for n in args.nodes.split(',') if n)
        token = args.token
        if args.token_file:
            with open(args.token_file) as f:
                token = f.read().strip()
        if not token:
            raise SystemExit('kubelet.py: give --token or --token-file')
        self.api = Api(args.server, token, args.ca)
        self.work = os.path.abspath(args.work)
        for d in ('logs', 'pids', 'volumes', 'pvc'):
            os.makedirs(os.path.join(self.work, d), exist_ok=True)
        self.worker = os.path.abspath(args.worker)
        if not os.access(self.worker, os.X_OK):
            raise SystemExit(f'kubelet.py: --worker {args.worker}: not an executable')
        self.image_cmds = parse_image_cmds(args.image_cmd)
        with open(args.ca, 'rb') as f:
            self.ca_pem = f.read()  # ca.crt of a token Secret that has none
        a, b, c, d = (int(x) for x in args.first_ip.split('.'))
        self.next_ip = (a << 24) | (b << 16) | (c << 8) | d
        self.stop = threading.Event()
        self.store = PodStore()
        self.insts = {}  # uid -> Instance
        self.preexec = pdeathsig_setter()

    # -- addresses --

    def alloc_ip(self):
        n = self.next_ip
        self.next_ip += 1
        if (self.next_ip & 0xff) == 0xff:  # skip .255 and .0
            self.next_ip += 2
        return '.'.join(str((n >> s) & 0xff) for s in (24, 16, 8, 0))

    def pod_ip(self, pod):
        inst = self.insts.get(meta(pod, 'uid'))
        if inst and inst.ip:
            return inst.ip
        return (pod.get('status') or {}).get('podIP')

    def resolve_master(self, value, ns, pods):
        m = MASTER_RE.match(value)
        if not m:
            return value
        host, sub, svc_ns = m.group(1), m.group(3), m.group(5)
        for p in pods.values():
            s = p.get('spec') or {}
            if (meta(p, 'namespace') == svc_ns and s.get('hostname') == host and
                    s.get('subdomain') == sub and not meta(p, 'deletionTimestamp')):
                ip = self.pod_ip(p)
                if ip:
                    return ip
        raise NotYet(f'MASTER_ADDR {value}: no pod {host} in subdomain {sub} of {svc_ns} with an IP yet')

    # -- volumes --

    def volume_dirs(self, inst):
        """volume name -> local directory; writes the ConfigMaps' files."""
        out = {}
        for v in (inst.pod.get('spec') or {}).get('volumes') or []:
            name = v['name']
            own = os.path.join(self.work, 'volumes', inst.uid, name)
            if 'configMap' in v:
                src = v['configMap']
                cm_name = src.get('name', '')
                st, cm = self.api.request('GET', f'/api/v1/namespaces/{inst.ns}/configmaps/{cm_name}')
                if st == 404 and src.get('optional'):
                    cm = {}
                elif st != 200:
                    raise NotYet(f'volume {name}: ConfigMap {inst.ns}/{cm_name}: HTTP {st}: '
                                 f'{status_message(cm)}')
                files = dict((cm or {}).get('data') or {})
                for k, b in ((cm or {}).get('binaryData') or {}).items():
                    files[k] = base64.b64decode(b)
                if src.get('items'):
                    files = {it['path']: files[it['key']] for it in src['items'] if it['key'] in files}
                os.makedirs(own, exist_ok=True)
                for rel, content in files.items():
                    p = os.path.join(own, rel)
                    os.makedirs(os.path.dirname(p), exist_ok=True)
                    with open(p, 'wb') as f:
                        f.write(content.encode() if isinstance(content, str) else content)
                out[name] = own
            elif 'persistentVolumeClaim' in v:
                d = os.path.join(self.work, 'pvc', v['persistentVolumeClaim']['claimName'])
                os.makedirs(d, exist_ok=True)
                out[name] = d
            elif 'hostPath' in v:
                out[name] = v['hostPath']['path']
            else:
                if 'emptyDir' not in v:
                    log(f'{inst.key}: volume {name}: unsupported source {sorted(v)}; '
                        'an empty directory instead')
                os.makedirs(own, exist_ok=True)
                out[name] = own
        return out

    # -- service accounts --

    def service_env(self):
        """The API server's environment variables, as a kubelet gives every pod (the `kubernetes`
        Service's; here the real API server's address)."""
        host, port = self.api.host, str(self.api.port)
        addr = f'[{host}]' if ':' in host else host
        return {'KUBERNETES_SERVICE_HOST': host, 'KUBERNETES_SERVICE_PORT': port,
                'KUBERNETES_SERVICE_PORT_HTTPS': port, 'KUBERNETES_PORT': f'tcp://{addr}:{port}'}

    def token_secret(self, ns, sa):
        """The token Secret of ServiceAccount `sa` (its .secrets first, else by annotation), or None."""
        name, uid = meta(sa, 'name'), meta(sa, 'uid')

        def fits(sec):
            ann = meta(sec, 'annotations') or {}
            return (sec.get('type') == SA_TOKEN_TYPE and (sec.get('data') or {}).get('token') and
                    ann.get('kubernetes.io/service-account.name') == name and
                    ann.get('kubernetes.io/service-account.uid', uid) == uid)
        for ref in sa.get('secrets') or []:
            st, sec = self.api.request('GET', f'/api/v1/namespaces/{ns}/secrets/{ref.get("name", "")}')
            if st == 200 and fits(sec):
                return sec
        sel = urllib.parse.quote('type=' + SA_TOKEN_TYPE, safe='')
        st, obj = self.api.request('GET', f'/api/v1/namespaces/{ns}/secrets?fieldSelector={sel}')
        if st != 200:
            raise NotYet(f'secrets of {ns}: HTTP {st}: {status_message(obj)}')
        found = sorted((s for s in obj.get('items') or [] if fits(s)), key=lambda s: meta(s, 'name'))
        return found[0] if found else None

    def service_account_dir(self, inst):
        """With --service-account-tokens: the local directory standing for the pod's
        /var/run/secrets/kubernetes.io/serviceaccount (token, ca.crt, namespace written), or None
        when the pod has no ServiceAccount or opts out. NotYet while the account or its token Secret
        does not exist (the token controller has not made it yet)."""
        spec = inst.pod.get('spec') or {}
        name = spec.get('serviceAccountName') or spec.get('serviceAccount')
        if not name or spec.get('automountServiceAccountToken') is False:
            return None
        st, sa = self.api.request('GET', f'/api/v1/namespaces/{inst.ns}/serviceaccounts/{name}')
        if st != 200:
            raise NotYet(f'ServiceAccount {inst.ns}/{name}: HTTP {st}: {status_message(sa)}')
        if sa.get('automountServiceAccountToken') is False and spec.get('automountServiceAccountToken') is not True:
            return None
        sec = self.token_secret(inst.ns, sa)
        if sec is None:
            raise NotYet(f'ServiceAccount {inst.ns}/{name}: no token Secret yet')
        data = sec.get('data') or {}
        files = {'token': base64.b64decode(data['token']),
                 'ca.crt': base64.b64decode(data['ca.crt']) if data.get('ca.crt') else self.ca_pem,
                 'namespace': base64.b64decode(data['namespace']) if data.get('namespace') else inst.ns.encode()}
        d = os.path.join(self.work, 'volumes', inst.uid, 'serviceaccount')
        os.makedirs(d, exist_ok=True)
        for fname, content in files.items():
            with open(os.path.join(d, fname + '.tmp'), 'wb') as f:
                f.write(content)
            os.replace(os.path.join(d, fname + '.tmp'), os.path.join(d, fname))
        log(f'{inst.key}: ServiceAccount {name}: token of Secret {meta(sec, "name")} in {d}')
        return d

    # -- starting --

    def start(self, inst, pods):
        spec = inst.pod.get('spec') or {}
        ctrs = spec.get('containers') or []
        if not ctrs:
            raise NotYet('no containers')
        if len(ctrs) > 1:
            log(f'{inst.key}: {len(ctrs)} containers; only the first ({ctrs[0].get("name")}) runs')
        ctr = ctrs[0]
        worker = WORKER_LABEL in (meta(inst.pod, 'labels') or {})
        if worker and ctr.get('command'):
            log(f'{inst.key}: container command {ctr["command"]} ignored: the worker runs instead')
        vols = self.volume_dirs(inst)
        mounts = []
        for m in ctr.get('volumeMounts') or []:
            if m['name'] not in vols:
                raise NotYet(f'volumeMount {m["name"]}: no such volume')
            local = vols[m['name']]
            if m.get('subPath'):
                local = os.path.join(local, m['subPath'])
                os.makedirs(local, exist_ok=True)
            mounts.append((m['mountPath'].rstrip('/') or '/', local))
        sa_dir = self.service_account_dir(inst) if self.args.service_account_tokens else None
        if sa_dir and not any(mp == SA_MOUNT for mp, _ in mounts):
            mounts.append((SA_MOUNT, sa_dir))
        mounts.sort(key=lambda x: -len(x[0]))

        def rewrite(v):
            for mp, local in mounts:
                if v == mp or v.startswith(mp + '/'):
                    return local + v[len(mp):]
            return v

        fields = {'metadata.name': inst.name, 'metadata.namespace': inst.ns, 'metadata.uid': inst.uid,
                  'spec.nodeName': spec.get('nodeName', ''), 'spec.serviceAccountName':
                  spec.get('serviceAccountName', ''), 'status.podIP': inst.ip, 'status.hostIP': '127.0.0.1'}
        cenv = {}
        for e in ctr.get('env') or []:
            if 'value' in e or not e.get('valueFrom'):
                val = expand(e.get('value', ''), cenv)
            else:
                ref = e['valueFrom'].get('fieldRef')
                if not ref or ref.get('fieldPath') not in fields:
                    log(f'{inst.key}: env {e["name"]}: unsupported valueFrom {e["valueFrom"]}; left out')
                    continue
                val = fields[ref['fieldPath']]
            if e['name'] == 'MASTER_ADDR':
                val = self.resolve_master(val, inst.ns, pods)
            cenv[e['name']] = rewrite(val)
        env = {'PATH': os.environ.get('PATH', '/usr/local/bin:/usr/bin:/bin'),
               'HOME': os.environ.get('HOME', '/'), 'OMP_NUM_THREADS': '1', 'HOSTNAME': inst.name}
        if self.args.service_account_tokens:
            env.update(self.service_env())
            if sa_dir:
                env[SA_DIR_ENV] = rewrite(SA_MOUNT)
        env.update(cenv)
        cargs = [rewrite(expand(a, cenv)) for a in ctr.get('args') or []]
        program = None if worker else image_program(self.image_cmds, ctr.get('image', ''))
        if worker:
            # the pod's IP for its metrics, when they are on (the worker refuses an address it
            # would not use)
            serve = cenv.get('CEPHALO_METRICS_PORT', '0') not in ('', '0')
            argv = [self.worker] + cargs + self.args.extra_arg + (['--metrics-addr', inst.ip] if serve else [])
        elif program:  # --image-cmd: the image's entry point, the container's args after it
            if ctr.get('command'):
                log(f'{inst.key}: container command {ctr["command"]} replaced by {program} (--image-cmd)')
            argv = [program] + cargs
        else:  # not a worker: the container's own program, run here (there are no images)
            argv = [rewrite(expand(a, cenv)) for a in ctr.get('command') or []] + cargs
            if not argv:
                argv = ['sleep', 'infinity']

        cwd = os.path.join(self.work, 'volumes', inst.uid)
        os.makedirs(cwd, exist_ok=True)
        log_path = self.log_path(inst)
        inst.started = time.time()
        try:
            with open(log_path, 'ab') as lf:
                inst.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=lf,
                                             stderr=subprocess.STDOUT, start_new_session=True,
                                             preexec_fn=self.preexec)
        except OSError as e:
            log(f'{inst.key}: cannot start {argv[0]}: {e}')
            inst.finished, inst.exit_code = time.time(), 128
            inst.status = self.terminated_status(inst, 'StartError')
            return
        inst.pid_file = os.path.join(self.work, 'pids', f'{inst.ns}_{inst.name}.pid')
        with open(inst.pid_file + '.tmp', 'w') as f:
            f.write(f'{inst.proc.pid}\n')
        os.replace(inst.pid_file + '.tmp', inst.pid_file)
        log(f'start {inst.key} uid={inst.uid[:8]} node={spec.get("nodeName")} ip={inst.ip} '
            f'pid={inst.proc.pid} log={log_path}: {" ".join(argv[1:] if worker else argv)}' +
            (f' (MASTER_ADDR={cenv["MASTER_ADDR"]})' if 'MASTER_ADDR' in cenv else ''))
        inst.status = self.running_status(inst)

    # -- admission --

    def admit(self, inst, node_alloc):
        """A kubelet's resource admission for nvidia.com/gpu: True (admitted), False (refused:
        the Failed status is set), or NotYet when the Node cannot be read."""
        node = (inst.pod.get('spec') or {}).get('nodeName')
        if inst.gpus > 0:
            if node not in node_alloc:
                st, obj = self.api.request('GET', f'/api/v1/nodes/{node}')
                if st != 200:
                    raise NotYet(f'node {node}: HTTP {st}: {status_message(obj)}')
                node_alloc[node] = quantity_int(((obj.get('status') or {}).get('allocatable') or {}).get(GPU, 0))
            cap = node_alloc[node]
            used = sum(i.gpus for i in self.insts.values()
                       if i.admitted and not i.gone and i.exit_code is None and
                       (i.pod.get('spec') or {}).get('nodeName') == node)
            if inst.gpus > cap - used:
                msg = (f"Node didn't have enough resource: {GPU}, requested: {inst.gpus}, used: {used}, "
                       f'capacity: {cap}')
                log(f'{inst.key} uid={inst.uid[:8]} refused on {node}: {msg}')
                inst.rejected = True
                inst.status = {'phase': 'Failed', 'reason': 'OutOf' + GPU, 'message': 'Pod ' + msg}
                return False
        inst.admitted = True
        return True

    # -- status --

    def container(self, inst):
        ctrs = (inst.pod.get('spec') or {}).get('containers') or [{}]
        return ctrs[0]

    def running_status(self, inst):
        t = rfc3339(inst.started)
        ctr = self.container(inst)
        cond = [{'type': ty, 'status': 'True', 'lastTransitionTime': t}
                for ty in ('Initialized', 'Ready', 'ContainersReady', 'PodScheduled')]
        return {'phase': 'Running', 'podIP': inst.ip, 'podIPs': [{'ip': inst.ip}], 'hostIP': '127.0.0.1',
                'startTime': t, 'conditions': cond,
                'containerStatuses': [{'name': ctr.get('name', ''), 'ready': True, 'started': True,
                                       'restartCount': 0, 'image': ctr.get('image', ''), 'imageID': '',
                                       'containerID': f'fake://{inst.proc.pid}',
                                       'state': {'running': {'startedAt': t}}}]}

    def log_path(self, inst):
        """WORK/logs/NS_POD_UID8.log: the container's stdout and stderr."""
        return os.path.join(self.work, 'logs', f'{inst.ns}_{inst.name}_{inst.uid[:8]}.log')

    def log_tail(self, inst):
        """A failed container's message under FallbackToLogsOnError, as the kubelet takes it: the
        last 80 lines of its log, at most the last 2048 bytes."""
        try:
            with open(self.log_path(inst), 'rb') as f:
                data = f.read()
        except OSError:
            return ''
        return b'\n'.join(data.split(b'\n')[-81:])[-2048:].decode('utf-8', 'replace')

    def terminated_status(self, inst, reason=None):
        ok = inst.exit_code == 0
        t0, t1 = rfc3339(inst.started), rfc3339(inst.finished)
        ctr = self.container(inst)
        term = {'exitCode': inst.exit_code, 'reason': reason or ('Completed' if ok else 'Error'),
                'startedAt': t0, 'finishedAt': t1}
        if inst.proc:
            term['containerID'] = f'fake://{inst.proc.pid}'
        if inst.signal:
            term['signal'] = inst.signal
        if not ok and ctr.get('terminationMessagePolicy') == 'FallbackToLogsOnError':
            term['message'] = self.log_tail(inst)
        nr = 'PodCompleted' if ok else 'ContainersNotReady'
        cond = [{'type': 'Initialized', 'status': 'True', 'lastTransitionTime': t0},
                {'type': 'Ready', 'status': 'False', 'lastTransitionTime': t1, 'reason': nr},
                {'type': 'ContainersReady', 'status': 'False', 'lastTransitionTime': t1, 'reason': nr},
                {'type': 'PodScheduled', 'status': 'True', 'lastTransitionTime': t0}]
        st = {'phase': 'Succeeded' if ok else 'Failed', 'hostIP': '127.0.0.1', 'startTime': t0,
              'conditions': cond,
              'containerStatuses': [{'name': ctr.get('name', ''), 'ready': False, 'started': False,
                                     'restartCount': 0, 'image': ctr.get('image', ''), 'imageID': '',
                                     'state': {'terminated': term}}]}
        if inst.ip:
            st.update({'podIP': inst.ip, 'podIPs': [{'ip': inst.ip}]})
        return st

    def write_status(self, inst, now):
        st, obj = self.api.request('PATCH', f'/api/v1/namespaces/{inst.ns}/pods/{inst.name}/status',
                                   {'metadata': {'uid': inst.uid}, 'status': inst.status},
                                   ctype='application/merge-patch+json')
        phase = inst.status['phase']
        if st == 200:
            log(f'status {inst.key} uid={inst.uid[:8]}: {phase}' +
                (f' podIP {inst.ip}' if phase == 'Running' else
                 f' ({inst.status["reason"]})' if inst.rejected else f' (exit code {inst.exit_code})'))
            inst.status, inst.status_failures = None, 0
        elif st == 404:
            log(f'status {inst.key}: the pod is gone')
            inst.status, inst.gone = None, True
        elif st in (0, 429) or st >= 500:
            inst.status_failures += 1
            delay = min(0.25 * 2 ** (inst.status_failures - 1), 4.0)
            inst.status_try = now + delay
            log(f'status {inst.key} {phase}: HTTP {st}: {status_message(obj)}; retrying in {delay:.1f}s')
        else:  # 409/422: another pod of that name (uid precondition) or refused: not ours to write
            log(f'status {inst.key} {phase}: HTTP {st}: {status_message(obj)}; given up')
            inst.status = None

    # -- deleting --

    def finish_deletion(self, inst, now):
        body = {'apiVersion': 'v1', 'kind': 'DeleteOptions', 'gracePeriodSeconds': 0,
                'preconditions': {'uid': inst.uid}}
        st, obj = self.api.request('DELETE', f'/api/v1/namespaces/{inst.ns}/pods/{inst.name}', body)
        if st in (200, 202):
            log(f'deleted {inst.key} uid={inst.uid[:8]}')
            inst.gone = True
        elif st in (404, 409):
            log(f'delete {inst.key} uid={inst.uid[:8]}: HTTP {st}: already gone')
            inst.gone = True
        else:
            inst.delete_failures += 1
            delay = min(0.25 * 2 ** (inst.delete_failures - 1), 4.0)
            inst.delete_try = now + delay
            log(f'delete {inst.key}: HTTP {st}: {status_message(obj)}; retrying in {delay:.1f}s')

    def terminate(self, inst, why):
        inst.term_at = time.monotonic()
        inst.kill_at = inst.term_at + inst.grace()
        if inst.running():
            log(f'stop {inst.key} uid={inst.uid[:8]} pid={inst.proc.pid} ({why}): SIGTERM, '
                f'SIGKILL after {inst.grace():.0f}s')
            try:
                inst.proc.send_signal(signal.SIGTERM)
            except OSError:
                pass

    def reap(self, inst):
        rc = inst.proc.poll()
        if rc is None:
            return
        inst.finished = time.time()
        if rc < 0:
            inst.signal, inst.exit_code = -rc, 128 - rc
        else:
            inst.exit_code = rc
        if inst.pid_file:
            try:
                with open(inst.pid_file) as f:
                    if f.read().strip() == str(inst.proc.pid):
                        os.unlink(inst.pid_file)
            except OSError:
                pass
        log(f'exit {inst.key} uid={inst.uid[:8]} pid={inst.proc.pid}: exit code {inst.exit_code}' +
            (f' (signal {inst.signal})' if inst.signal else ''))
        if not inst.gone:
            inst.status = self.terminated_status(inst)
            inst.status_try = 0.0

    # -- the loop --

    def tick(self):
        pods, synced = self.store.snapshot()
        now = time.monotonic()
        mine = [p for p in pods.values() if (p.get('spec') or {}).get('nodeName') in self.nodes]
        for pod in mine:
            uid = meta(pod, 'uid')
            inst = self.insts.get(uid)
            if inst is None:
                inst = self.insts[uid] = Instance(pod)
                pst = pod.get('status') or {}
                if pst.get('phase') in ('Succeeded', 'Failed'):
                    inst.done_before = True
                elif pst.get('phase') == 'Running' and not meta(pod, 'deletionTimestamp'):
                    # started by an earlier kubelet whose process is gone: never run it twice
                    # (restartPolicy Never); report it lost, as a kubelet does
                    inst.done_before, inst.ip = True, pst.get('podIP')
                    inst.started = inst.finished = time.time()
                    inst.exit_code = 137
                    inst.status = self.terminated_status(inst, 'ContainerStatusUnknown')
                    log(f'{inst.key} uid={uid[:8]} was Running before this kubelet: its container is lost')
            inst.pod = pod
        # addresses first, so that a pod's MASTER_ADDR can name a pod started in this same pass
        startable = []
        for pod in mine:
            inst = self.insts[meta(pod, 'uid')]
            if inst.gone:
                continue
            if meta(pod, 'deletionTimestamp'):
                if not inst.deleting:
                    inst.deleting = True
                    log(f'{inst.key} uid={inst.uid[:8]} is being deleted (grace {inst.grace():.0f}s)')
                    self.terminate(inst, 'pod deleted')
            elif inst.proc is None and inst.exit_code is None and not inst.done_before and not inst.rejected:
                startable.append(inst)
        # admission in order of creation, then addresses for all the admitted, so that a pod's
        # MASTER_ADDR can name a pod started in this same pass
        startable.sort(key=lambda i: (meta(i.pod, 'creationTimestamp') or '', i.name))
        node_alloc = {}  # node -> allocatable nvidia.com/gpu, read once per pass
        admitted = []
        for inst in startable:
            try:
                if not inst.admitted and not self.admit(inst, node_alloc):
                    continue
            except NotYet as e:
                if inst.waiting != str(e):
                    log(f'{inst.key}: waiting: {e}')
                inst.waiting = str(e)
                continue
            if inst.ip is None:
                inst.ip = self.alloc_ip()
            admitted.append(inst)
        for inst in admitted:
            try:
                self.start(inst, pods)
                inst.waiting = None
            except Exception as e:  # noqa: BLE001 - NotYet, or a pod this kubelet cannot run yet
                why = str(e) if isinstance(e, NotYet) else f'{type(e).__name__}: {e}'
                if inst.waiting != why:
                    log(f'{inst.key}: waiting: {why}')
                inst.waiting = why
        # pods that vanished from the API (force-deleted, or deleted while the watch was down)
        if synced:
            for uid, inst in self.insts.items():
                if uid not in pods and not inst.gone:
                    inst.gone, inst.status = True, None
                    if inst.running():
                        self.terminate(inst, 'pod gone from the API')
        for inst in self.insts.values():
            if inst.running():
                self.reap(inst)
            if inst.running() and inst.kill_at is not None and now >= inst.kill_at and not inst.killed:
                log(f'kill {inst.key} pid={inst.proc.pid}: SIGKILL after the grace period')
                inst.killed = True
                try:
                    inst.proc.kill()
                except OSError:
                    pass
            if inst.status is not None and not inst.gone and now >= inst.status_try:
                self.write_status(inst, now)
            if (inst.deleting and not inst.gone and not inst.running() and inst.status is None and
                    now >= inst.delete_try):
                self.finish_deletion(inst, now)

    def shutdown(self):
        running = [i for i in self.insts.values() if i.running()]
        for inst in running:
            log(f'stop {inst.key} pid={inst.proc.pid} (kubelet shutting down): SIGTERM')
            try:
                inst.proc.send_signal(signal.SIGTERM)
            except OSError:
                pass
        deadline = time.monotonic() + 5
        for inst in running:
            try:
                inst.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log(f'kill {inst.key} pid={inst.proc.pid}: SIGKILL')
                inst.proc.kill()
                inst.proc.wait()
            if inst.pid_file:
                try:
                    os.unlink(inst.pid_file)
                except OSError:
                    pass

    def run(self):
        def on_signal(signum, frame):
            self.stop.set()
            self.store.changed.set()
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        log(f'nodes {",".join(sorted(self.nodes))}, server {self.args.server}, worker {self.worker} '
            f'{" ".join(self.args.extra_arg)}, work {self.work}')
        NodeKeeper(self.api, self.nodes, self.args, self.stop).start()
        Watcher(self.api, self.store, self.stop).start()
        try:
            while not self.stop.is_set():
                self.store.changed.wait(0.2)
                self.store.changed.clear()
                self.tick()
        finally:
            self.shutdown()
            log('stopped')


def main():
    ap = argparse.ArgumentParser(
        prog='kubelet.py', formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split('\n\n', 1)[1],
        epilog='example: kubelet.py --server https://127.0.0.1:6443 --token T --ca ca.crt '
               '--nodes gpu-a,gpu-b --worker build/rel/bin/cephalo-worker --work /tmp/kl '
               '--extra-arg=--device --extra-arg=cpu')
    ap.add_argument('--server', required=True, help='the API server, https://HOST:PORT')
    ap.add_argument('--token', help='a bearer token (one that may read ConfigMaps and Nodes, write pod and Node status, create Nodes and Leases; '
                                    'with --service-account-tokens also read ServiceAccounts and Secrets)')
    ap.add_argument('--token-file', help='read the bearer token from this file instead')
    ap.add_argument('--ca', required=True, help="the API server's CA certificate (PEM)")
    ap.add_argument('--nodes', required=True, help='comma-separated Node names whose pods this kubelet runs')
    ap.add_argument('--worker', required=True, help='the program a worker pod (labelled cephalo.dev/job) runs, its container args after it')
    ap.add_argument('--work', required=True, help='state directory: logs/, pids/, volumes/, pvc/')
    ap.add_argument('--extra-arg', action='append', default=[], metavar='ARG',
                    help='an argument added after the container args (repeat; use --extra-arg=--flag)')
    ap.add_argument('--first-ip', default='127.0.1.1', help='the first pod IP (default 127.0.1.1)')
    ap.add_argument('--register', action='store_true', help='create the Nodes of --nodes that do not exist')
    ap.add_argument('--node-gpus', action='append', default=[], metavar='NODE=COUNT',
                    help='with --register: the nvidia.com/gpu capacity of a node (repeat; default 0)')
    ap.add_argument('--node-label', action='append', default=[], metavar='NODE:KEY=VALUE',
                    help='with --register: a label of a node (repeat)')
    ap.add_argument('--heartbeat', type=float, default=10.0, metavar='SECONDS',
                    help="renew the nodes' Lease this often (default 10; 0: never)")
    ap.add_argument('--status-report', type=float, default=300.0, metavar='SECONDS',
                    help="report the nodes' Ready condition at the first heartbeat and then this "
                         "often (default 300, a kubelet's nodeStatusReportFrequency)")
    ap.add_argument('--image-cmd', action='append', default=[], metavar='IMAGE=PATH',
                    help="a pod (not a worker) whose container image is IMAGE (without a tag: any "
                         "tag) runs PATH + the container's args, as the image's entry point (repeat)")
    ap.add_argument('--service-account-tokens', action='store_true',
                    help='give pods the API server environment (KUBERNETES_SERVICE_HOST/PORT) and '
                         "their ServiceAccount's token, ca.crt and namespace (from its token Secret) "
                         'in a local directory named by $CEPHALO_SERVICEACCOUNT_DIR')
    args = ap.parse_args()
    Kubelet(args).run()
    return 0


if __name__ == '__main__':
    sys.exit(main())
