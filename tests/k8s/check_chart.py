#!/usr/bin/env python3
"""Checks of charts/cephalo with a real helm (mk/helm.sh fetches Helm 3 once into a cache): `helm
lint --strict`, then `helm template` under several sets of values and checks of the manifests.
Prints "ok N - ..." / "not ok N - ..." lines (tests/run.sh counts them). The install, upgrade
and uninstall against an API server are tests/cli/test_chart.sh's.

  check_chart.py [--emit FILE]   --emit also writes the default render (+ dashboard) for kubectl

helm is $CEPHALO_HELM when set, else what `mk/helm.sh` prints (fetching it the first time).
"""
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
CHART = os.path.join(ROOT, 'charts', 'cephalo')
NS = 'cephalo-system'
with open(os.path.join(ROOT, 'VERSION')) as _f:
    VERSION = _f.read().strip()  # the one version source: the chart and the images name it too
n = 0
HELM = None
TMP = tempfile.mkdtemp(prefix='cephalo-chart-')
atexit.register(shutil.rmtree, TMP, True)


class HelmError(Exception):
    pass


def find_helm():
    """The helm binary: $CEPHALO_HELM, else mk/helm.sh's (which fetches it once)."""
    if os.environ.get('CEPHALO_HELM'):
        return os.environ['CEPHALO_HELM']
    r = subprocess.run(['bash', os.path.join(ROOT, 'mk', 'helm.sh')], capture_output=True, text=True)
    if r.returncode != 0:
        raise HelmError('mk/helm.sh failed: ' + (r.stderr.strip().splitlines() or ['?'])[-1])
    return r.stdout.strip()


def helm(*args, values=None):
    """Runs helm with its config, cache and data in a scratch directory; stdout, or HelmError."""
    env = dict(os.environ, HELM_CACHE_HOME=TMP, HELM_CONFIG_HOME=TMP, HELM_DATA_HOME=TMP)
    cmd = [HELM, *args]
    if values is not None:
        f = os.path.join(TMP, 'values.yaml')
        with open(f, 'w') as out:
            yaml.safe_dump(values, out)
        cmd += ['-f', f]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise HelmError(f'helm {" ".join(args)}: exit {r.returncode}: {r.stderr.strip() or r.stdout.strip()}')
    return r.stdout


def report(name, ok, detail=''):
    global n
    n += 1
    print(f'{"ok" if ok else "not ok"} {n} - {name}')
    if not ok and detail:
        for line in str(detail).splitlines()[:8]:
            print(f'#   {line}')


def check(name, fn):
    try:
        r = fn()
        report(name, r is None or r is True, '' if r in (None, True) else r)
    except (AssertionError, KeyError, TypeError, ValueError, HelmError, yaml.YAMLError) as e:
        report(name, False, f'{type(e).__name__}: {e}')


def render(over=None, release='cephalo', *extra):
    """`helm template` with OVER merged over values.yaml (as `-f`: maps deeply, the rest replaced)."""
    text = helm('template', release, CHART, '--namespace', NS, *extra, values=over)
    return [d for d in yaml.safe_load_all(text) if d is not None]


def kinds(docs):
    return sorted(d['kind'] for d in docs)


def one(docs, kind, name=None):
    got = [d for d in docs if d['kind'] == kind and (name is None or d['metadata']['name'] == name)]
    assert len(got) == 1, f'{len(got)} {kind} {name or ""}'
    return got[0]


# The least-privilege set (docs/k8s.md, "RBAC"): (apiGroup, resource, verb).
CLUSTER_RULES = {
    **{('cephalo.dev', 'cephalojobs', v): 1 for v in ('get', 'list', 'watch', 'update', 'patch')},
    **{('cephalo.dev', 'cephalojobs/status', v): 1 for v in ('get', 'update', 'patch')},
    ('cephalo.dev', 'cephalojobs/finalizers', 'update'): 1,
    **{('', 'pods', v): 1 for v in ('create', 'delete', 'get', 'list', 'watch')},
    **{('', r, v): 1 for r in ('services', 'configmaps')
       for v in ('create', 'delete', 'get', 'list', 'watch', 'patch')},
    **{('', 'nodes', v): 1 for v in ('get', 'list', 'watch')},
    **{('', 'events', v): 1 for v in ('create', 'patch')},
    ('', 'persistentvolumeclaims', 'get'): 1,
}
ROLE_RULES = {('coordination.k8s.io', 'leases', v): 1 for v in ('get', 'create', 'update')}
# With operator.watchNamespaces: the ClusterRole keeps the cluster-wide reads, and a Role in each
# listed namespace grants the rest (the writes for its jobs).
CLUSTER_READS = {('', r, v): 1 for r in ('pods', 'nodes') for v in ('get', 'list', 'watch')}
JOB_RULES = {k: 1 for k in CLUSTER_RULES if k not in CLUSTER_READS}
SM_API = ('--api-versions', 'monitoring.coreos.com/v1/ServiceMonitor')  # as if its CRD were installed


def flatten(rules):
    out = {}
    for r in rules:
        assert set(r) <= {'apiGroups', 'resources', 'verbs', 'resourceNames'}, f'unexpected keys {set(r)}'
        for g in r['apiGroups']:
            for res in r['resources']:
                for v in r['verbs']:
                    assert '*' not in (g, res, v), 'wildcard in a rule'
                    for name in r.get('resourceNames', [None]):
                        out[(g, res if name is None else f'{res}/{name}', v)] = 1
    return out


def main():
    global HELM
    try:
        HELM = find_helm()
        ver = helm('version', '--template', '{{.Version}}').strip()
    except (HelmError, OSError) as e:
        report('helm is available (mk/helm.sh)', False, e)
        return
    report(f'helm {ver} is available (mk/helm.sh)', ver.startswith('v3.'), ver)

    # ---- helm lint ------------------------------------------------------------------------------
    def lint(over=None):
        out = helm('lint', '--strict', CHART, '--namespace', NS, values=over)
        assert '1 chart(s) linted, 0 chart(s) failed' in out, out
        bad = [x for x in out.splitlines() if x.startswith(('[WARNING]', '[ERROR]'))]
        assert not bad, bad
    check('helm lint --strict: no warning, no error', lint)
    check('helm lint --strict with the optional parts on (dashboard, no RBAC, namespaces, priority class)',
          lambda: lint({'grafanaDashboard': {'enabled': True}, 'rbac': {'create': False},
                        'operator': {'avoidGPUNodes': False, 'watchNamespaces': ['ml'], 'priorityClassName': 'high'}}))

    def kube_versions():
        assert kinds(render(None, 'cephalo', '--kube-version', 'v1.20.0'))
        try:
            helm('template', 'cephalo', CHART, '--kube-version', 'v1.19.9')
        except HelmError as e:
            assert 'kubeVersion' in str(e) or 'incompatible' in str(e), e
        else:
            raise AssertionError('helm template for Kubernetes 1.19 rendered (Chart.yaml kubeVersion >=1.20.0-0)')
    check('helm template renders for Kubernetes 1.20 and refuses 1.19 (Chart.yaml kubeVersion)', kube_versions)

    # ---- defaults -------------------------------------------------------------------------------
    docs = []

    def defaults():
        docs[:] = render()
        want = ['ClusterRole', 'ClusterRoleBinding', 'Deployment', 'Role', 'RoleBinding', 'Service',
                'ServiceAccount']
        assert kinds(docs) == want, kinds(docs)
    check('default values render to the operator, its ServiceAccount, RBAC and metrics Service', defaults)
    if not docs:
        return

    def required_fields():
        for d in docs:
            assert d.get('apiVersion') and d.get('kind') and d['metadata'].get('name'), d
            if d['kind'] not in ('ClusterRole', 'ClusterRoleBinding'):
                assert d['metadata'].get('namespace') == NS, f'{d["kind"]} namespace'
            assert d['metadata']['labels']['app.kubernetes.io/instance'] == 'cephalo'
    check('every manifest has apiVersion, kind, name, labels, the release namespace', required_fields)

    dep = one(docs, 'Deployment')
    pod = dep['spec']['template']['spec']
    c = pod['containers'][0]

    def deployment():
        assert dep['spec']['selector']['matchLabels'].items() <= dep['spec']['template']['metadata']['labels'].items()
        assert c['image'] == f'ghcr.io/cephalo/cephalo-operator:{VERSION}', c['image']
        assert c['imagePullPolicy'] == 'IfNotPresent'
        assert pod['serviceAccountName'] == one(docs, 'ServiceAccount')['metadata']['name']
        assert c['resources']['requests']['memory'] == '64Mi'
    check('Deployment: selector matches the pod labels, image tag = appVersion, service account', deployment)

    def args():
        a = c['args']
        for want in ('--metrics-addr=:8080', '--leader-elect=true', f'--leader-election-namespace={NS}',
                     '--leader-election-id=cephalo-operator', '--log-level=info',
                     f'--worker-image=ghcr.io/cephalo/cephalo-worker:{VERSION}', '--plan-timeout=30s',
                     '--plan-workers=2', '--workers=8', '--worker-archs=60 61 70 75 80 86 89 90',
                     '--restart-backoff=10s', '--restart-backoff-max=6m'):
            assert want in a, f'missing {want} in {a}'
        assert not any(x.startswith('--namespace') for x in a), 'watchNamespaces [] must not pass --namespace'
        assert not any(x.startswith('--profile-configmap') for x in a), 'profileConfigMap "" passes no flag'
        env = {e['name']: e['valueFrom']['fieldRef']['fieldPath'] for e in c['env']}
        assert env == {'POD_NAME': 'metadata.name', 'POD_NAMESPACE': 'metadata.namespace'}, env
    check('Deployment: leader election, metrics, planning, restart backoff and worker-archs flags, POD_NAME/POD_NAMESPACE from the downward API', args)

    def archs():
        # the operator's --worker-archs must be what the worker image is compiled for (the Makefile's
        # CUDA_ARCHS_ALL, which the Dockerfile passes): a GPU the image runs must not be left out
        import re
        mk = re.search(r'^CUDA_ARCHS_ALL\s*:?=\s*(.*)$', open('Makefile').read(), re.M).group(1).split()
        got = [x for x in c['args'] if x.startswith('--worker-archs=')]
        assert got == ['--worker-archs=' + ' '.join(mk)], (got, mk)
    check('Deployment: --worker-archs (values worker.archs) is the worker image\'s CUDA_ARCHS_ALL', archs)

    def probes():
        ports = {p['name']: p['containerPort'] for p in c['ports']}
        assert ports == {'metrics': 8080}, ports
        assert c['livenessProbe']['httpGet'] == {'path': '/healthz', 'port': 'metrics'}
        assert c['readinessProbe']['httpGet'] == {'path': '/readyz', 'port': 'metrics'}
    check('Deployment: liveness /healthz and readiness /readyz on the metrics port', probes)

    def security():
        ps, cs = pod['securityContext'], c['securityContext']
        assert ps['runAsNonRoot'] is True and ps['runAsUser'] != 0 and ps['runAsGroup'] != 0
        assert cs['runAsNonRoot'] is True and cs['allowPrivilegeEscalation'] is False
        assert cs['readOnlyRootFilesystem'] is True and cs['capabilities']['drop'] == ['ALL']
        assert ps['seccompProfile']['type'] == 'RuntimeDefault'
    check('Deployment: non-root, no privilege escalation, read-only root, no capabilities', security)

    def off_gpu_nodes():
        na = pod['affinity']['nodeAffinity']
        assert set(pod['affinity']) == {'nodeAffinity'}, pod['affinity']
        terms = na['requiredDuringSchedulingIgnoredDuringExecution']['nodeSelectorTerms']
        assert terms == [{'matchExpressions': [
            {'key': 'nvidia.com/gpu.present', 'operator': 'NotIn', 'values': ['true']},
            {'key': 'nvidia.com/gpu.count', 'operator': 'DoesNotExist'}]}], terms
        assert 'preferredDuringSchedulingIgnoredDuringExecution' not in na
    check('Deployment: by default a required node affinity keeps the operator off GPU nodes '
          '(nvidia.com/gpu.present NotIn [true], no nvidia.com/gpu.count)', off_gpu_nodes)

    def affinity_values():
        spec = lambda over: one(render({'operator': over}), 'Deployment')['spec']['template']['spec']
        assert 'affinity' not in spec({'avoidGPUNodes': False}), 'avoidGPUNodes: false must drop the rule'
        mine = {'preferredDuringSchedulingIgnoredDuringExecution': [
            {'weight': 1, 'preference': {'matchExpressions': [{'key': 'pool', 'operator': 'In', 'values': ['system']}]}}]}
        got = spec({'affinity': {'nodeAffinity': mine}})['affinity']
        assert got == {'nodeAffinity': mine}, f'a nodeAffinity of operator.affinity must replace the default: {got}'
        anti = {'podAntiAffinity': {'preferredDuringSchedulingIgnoredDuringExecution': [
            {'weight': 1, 'podAffinityTerm': {'topologyKey': 'kubernetes.io/hostname',
                                              'labelSelector': {'matchLabels': {'app': 'x'}}}}]}}
        got = spec({'affinity': anti})['affinity']
        assert got['podAntiAffinity'] == anti['podAntiAffinity'] and got['nodeAffinity'] == pod['affinity']['nodeAffinity'], got
        assert spec({'avoidGPUNodes': False, 'affinity': anti})['affinity'] == anti
    check('operator.avoidGPUNodes false drops the rule; a nodeAffinity in operator.affinity replaces it, '
          'pod (anti-)affinity is added to it', affinity_values)

    def service():
        s = one(docs, 'Service')
        assert s['spec']['selector'].items() <= dep['spec']['template']['metadata']['labels'].items()
        assert s['spec']['ports'] == [{'name': 'metrics', 'port': 8080, 'targetPort': 'metrics', 'protocol': 'TCP'}]
    check('metrics Service selects the operator pod and targets its metrics port', service)

    def rbac():
        cr = one(docs, 'ClusterRole')
        got = flatten(cr['rules'])
        extra = sorted(set(got) - set(CLUSTER_RULES))
        missing = sorted(set(CLUSTER_RULES) - set(got))
        assert not extra and not missing, f'extra {extra} missing {missing}'
        role = one(docs, 'Role')
        got = flatten(role['rules'])
        assert got == ROLE_RULES, sorted(got)
        assert role['metadata']['namespace'] == NS
    check('RBAC: the ClusterRole and the leader-election Role grant exactly the least-privilege set', rbac)

    def pods_read_cluster_wide():
        cr = one(docs, 'ClusterRole')
        got = flatten(cr['rules'])
        for v in ('get', 'list', 'watch'):
            assert ('', 'pods', v) in got, v
        for v in ('update', 'patch', 'deletecollection'):
            assert ('', 'pods', v) not in got, v
        # cluster-wide: bound by a ClusterRoleBinding (not per-namespace RoleBindings), also when
        # the operator watches some namespaces' jobs only
        d = render({'operator': {'watchNamespaces': ['ml']}})
        assert one(d, 'ClusterRoleBinding')['roleRef']['name'] == one(d, 'ClusterRole')['metadata']['name']
        assert flatten(one(d, 'ClusterRole')['rules']) == CLUSTER_READS, sorted(flatten(one(d, 'ClusterRole')['rules']))
    check('RBAC: pods get/list/watch in every namespace (GPU accounting), bound cluster-wide even with watchNamespaces', pods_read_cluster_wide)

    def namespaced():
        d = render({'operator': {'watchNamespaces': ['ml', 'research'], 'profileConfigMap': 'gpu-profiles'}})
        a = one(d, 'Deployment')['spec']['template']['spec']['containers'][0]['args']
        assert '--namespace=ml,research' in a, a
        sa = one(d, 'ServiceAccount')['metadata']['name']
        roles = {(x['metadata']['namespace'], x['metadata']['name']): x for x in d if x['kind'] == 'Role'}
        binds = {(x['metadata']['namespace'], x['metadata']['name']): x for x in d if x['kind'] == 'RoleBinding'}
        assert sorted(roles) == sorted(binds) == [('cephalo-system', 'cephalo-operator-leader-election'),
                                                  ('ml', 'cephalo-operator'), ('research', 'cephalo-operator')], sorted(roles)
        for ns in ('ml', 'research'):
            got = flatten(roles[(ns, 'cephalo-operator')]['rules'])
            assert got == JOB_RULES, f'{ns}: extra {sorted(set(got) - set(JOB_RULES))} missing {sorted(set(JOB_RULES) - set(got))}'
            b = binds[(ns, 'cephalo-operator')]
            assert b['roleRef'] == {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'Role', 'name': 'cephalo-operator'}
            assert b['subjects'] == [{'kind': 'ServiceAccount', 'name': sa, 'namespace': NS}], b['subjects']
        # the profiles ConfigMap of the release namespace, by name only (the ClusterRole no longer reads ConfigMaps)
        le = flatten(roles[(NS, 'cephalo-operator-leader-election')]['rules'])
        assert le == {**ROLE_RULES, ('', 'configmaps/gpu-profiles', 'get'): 1}, sorted(le)
        writes = {k for k in flatten(one(d, 'ClusterRole')['rules']) if k[2] not in ('get', 'list', 'watch')}
        assert not writes, f'the ClusterRole must not write anything with watchNamespaces: {sorted(writes)}'
    check('RBAC with operator.watchNamespaces [ml, research]: --namespace=ml,research, a Role and RoleBinding per namespace '
          'with exactly the job rules, the ClusterRole reads only, the profiles ConfigMap by name', namespaced)

    def bindings():
        sa = one(docs, 'ServiceAccount')['metadata']['name']
        crb, rb = one(docs, 'ClusterRoleBinding'), one(docs, 'RoleBinding')
        assert crb['roleRef'] == {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'ClusterRole',
                                  'name': one(docs, 'ClusterRole')['metadata']['name']}
        assert rb['roleRef']['kind'] == 'Role' and rb['roleRef']['name'] == one(docs, 'Role')['metadata']['name']
        for b in (crb, rb):
            assert b['subjects'] == [{'kind': 'ServiceAccount', 'name': sa, 'namespace': NS}], b['subjects']
    check('RBAC: the bindings bind the operator\'s ServiceAccount to its roles', bindings)

    # ---- everything on --------------------------------------------------------------------------
    def everything():
        d = render({'serviceMonitor': {'enabled': True, 'labels': {'release': 'kube-prometheus'}},
                    'worker': {'archs': '80 86 90'},
                    'grafanaDashboard': {'enabled': True},
                    'operator': {'image': {'tag': 'v9'}, 'watchNamespaces': ['ml'], 'profileConfigMap': 'gpu-profiles',
                                 'priorityClassName': 'system-cluster-critical',
                                 'planTimeout': '2m', 'planWorkers': 4, 'workers': 12,
                                 'restartBackoff': {'initial': '5s', 'max': '2m'},
                                 'nodeSelector': {'pool': 'system'},
                                 'tolerations': [{'key': 'k', 'operator': 'Exists'}],
                                 'leaderElection': {'enabled': False}}}, 'cephalo', *SM_API)
        sms = [x for x in d if x['kind'] == 'ServiceMonitor']
        assert len(sms) == 2, len(sms)
        for sm in sms:
            assert sm['apiVersion'] == 'monitoring.coreos.com/v1'
            assert sm['metadata']['labels']['release'] == 'kube-prometheus'
            assert sm['spec']['endpoints'][0]['port'] == 'metrics'
        w = [sm for sm in sms if sm['metadata']['name'].endswith('-workers')][0]
        assert w['spec']['namespaceSelector'] == {'any': True}
        assert w['spec']['endpoints'][0]['honorLabels'] is True
        p = one(d, 'Deployment')['spec']['template']['spec']
        assert p['containers'][0]['image'].endswith(':v9')
        assert '--namespace=ml' in p['containers'][0]['args'] and '--leader-elect=false' in p['containers'][0]['args']
        assert f'--profile-configmap={NS}/gpu-profiles' in p['containers'][0]['args'], p['containers'][0]['args']
        assert {'--plan-timeout=2m', '--plan-workers=4', '--workers=12', '--worker-archs=80 86 90',
                '--restart-backoff=5s', '--restart-backoff-max=2m'} <= set(p['containers'][0]['args']), p['containers'][0]['args']
        assert p['nodeSelector'] == {'pool': 'system'} and p['tolerations'][0]['key'] == 'k'
        assert p['priorityClassName'] == 'system-cluster-critical' and 'priorityClassName' not in pod
        return check_dashboard(one(d, 'ConfigMap'))
    check('serviceMonitor, dashboard, tag, namespaces, priorityClassName, profileConfigMap, planTimeout, restartBackoff, planWorkers, workers, worker.archs, nodeSelector, tolerations values take effect', everything)

    def no_workers_sm():
        d = render({'serviceMonitor': {'enabled': True, 'workers': False}}, 'cephalo', *SM_API)
        assert [x['metadata']['name'] for x in d if x['kind'] == 'ServiceMonitor'] == ['cephalo-operator']
    check('serviceMonitor.workers: false leaves only the operator\'s ServiceMonitor', no_workers_sm)

    def no_rbac():
        d = render({'rbac': {'create': False}, 'serviceAccount': {'create': False, 'name': 'mine'}},
                   release='ceph')
        assert kinds(d) == ['Deployment', 'Service'], kinds(d)
        assert one(d, 'Deployment')['spec']['template']['spec']['serviceAccountName'] == 'mine'
        assert one(d, 'Deployment')['metadata']['name'] == 'ceph-operator'
    check('rbac.create/serviceAccount.create false: no RBAC, the named ServiceAccount is used', no_rbac)

    # ---- values refused -------------------------------------------------------------------------
    def refused(over, *want, extra=()):
        try:
            render(over, 'cephalo', *extra)
        except HelmError as e:
            for w in want:
                assert w in str(e), f'{w!r} not in: {e}'
            return True
        raise AssertionError(f'rendered with {over}')

    check('values.schema.json: an unknown key is refused, named (operator.watchNamespace, the old spelling)',
          lambda: refused({'operator': {'watchNamespace': 'ml'}}, 'Additional property watchNamespace is not allowed'))
    check('... a string where the list of namespaces goes (--set operator.watchNamespaces=ml)',
          lambda: refused({'operator': {'watchNamespaces': 'ml'}}, 'operator.watchNamespaces', 'Expected: array, given: string'))
    check('... a namespace that is not a DNS label, and one listed twice',
          lambda: all((refused({'operator': {'watchNamespaces': ['ML']}}, 'operator.watchNamespaces.0'),
                   refused({'operator': {'watchNamespaces': ['ml', 'ml']}}, 'operator.watchNamespaces', 'unique'))))
    check('... wrong types and ranges: workers 0, replicas "two", a duration "soon", a log level, a pull policy, archs',
          lambda: all((refused({'operator': {'workers': 0}}, 'operator.workers'),
                   refused({'operator': {'replicas': 'two'}}, 'operator.replicas', 'Expected: integer'),
                   refused({'operator': {'planTimeout': 'soon'}}, 'operator.planTimeout'),
                   refused({'operator': {'logLevel': 'loud'}}, 'operator.logLevel'),
                   refused({'worker': {'image': {'pullPolicy': 'Sometimes'}}}, 'worker.image.pullPolicy'),
                   refused({'worker': {'archs': 'sm_80'}}, 'worker.archs'))))
    check('guard: operator.metrics.port 0 is refused with the reason (the probes and the Service use it)',
          lambda: refused({'operator': {'metrics': {'port': 0}}}, 'operator.metrics.port: 0', 'probes'))
    check('guard: replicas 2 without leader election is refused with the reason',
          lambda: refused({'operator': {'replicas': 2, 'leaderElection': {'enabled': False}}},
                          'operator.replicas: 2 replicas need operator.leaderElection.enabled=true'))
    check('guard: serviceMonitor.enabled without the ServiceMonitor kind is refused, saying what to install',
          lambda: refused({'serviceMonitor': {'enabled': True}}, 'serviceMonitor.enabled', 'Prometheus Operator'))
    check('... and renders where the cluster has it, 2 replicas with leader election render',
          lambda: kinds(render({'serviceMonitor': {'enabled': True}, 'operator': {'replicas': 2}}, 'cephalo', *SM_API)).count('ServiceMonitor') == 2)

    def dash_ns():
        d = render({'grafanaDashboard': {'enabled': True, 'namespace': 'monitoring'}})
        assert one(d, 'ConfigMap')['metadata']['namespace'] == 'monitoring'
    check('grafanaDashboard.namespace puts the dashboard ConfigMap there', dash_ns)

    # ---- the CRD --------------------------------------------------------------------------------
    def crd():
        a = os.path.join(ROOT, 'crds', 'cephalojobs.cephalo.dev.yaml')
        b = os.path.join(CHART, 'crds', 'cephalojobs.cephalo.dev.yaml')
        with open(a, 'rb') as f, open(b, 'rb') as g:
            assert f.read() == g.read(), 'charts/cephalo/crds/ differs from crds/ (copy crds/ over it)'
        with open(a) as f:
            x = yaml.safe_load(f)
        assert x['kind'] == 'CustomResourceDefinition' and x['spec']['group'] == 'cephalo.dev'
        assert x['spec']['names']['kind'] == 'CephaloJob'
        assert 'cj' not in x['spec']['names'].get('shortNames', [])
        v = x['spec']['versions'][0]
        assert v['name'] == 'v1alpha1' and v['subresources'] == {'status': {}}
        cols = [c['name'] for c in v['additionalPrinterColumns'] if not c.get('priority')]
        assert cols == ['Phase', 'GPUs', 'Step', 'Samples/s', 'Age'], cols
        conds = v['schema']['openAPIV3Schema']['properties']['status']['properties']['conditions']
        assert conds['items']['properties']['type']['enum'] == [
            'Created', 'Admitted', 'Planned', 'Running', 'Restarting', 'Succeeded', 'Failed', 'Suspended']
    check('CRD: the chart\'s copy equals crds/, group/kind/version, status subresource, columns', crd)

    def chart_yaml():
        with open(os.path.join(CHART, 'Chart.yaml')) as f:
            c = yaml.safe_load(f)
        assert c['apiVersion'] == 'v2' and c['name'] == 'cephalo'
        # one release: the chart's version and appVersion are VERSION, and the images default to it
        assert c['version'] == VERSION and c['appVersion'] == VERSION, (c['version'], c['appVersion'], VERSION)
        with open(os.path.join(CHART, 'values.yaml')) as f:
            v = yaml.safe_load(f)
        for k in ('operator', 'worker', 'serviceAccount', 'rbac', 'serviceMonitor', 'grafanaDashboard'):
            assert k in v, k
        assert v['operator']['image']['tag'] == '' and v['worker']['image']['tag'] == '', 'image tags default to appVersion'
    check('Chart.yaml (apiVersion v2): version and appVersion = VERSION; values.yaml parses, image tags from appVersion', chart_yaml)

    if len(sys.argv) == 3 and sys.argv[1] == '--emit':
        d = render({'grafanaDashboard': {'enabled': True}})
        with open(sys.argv[2], 'w') as f:
            yaml.safe_dump_all(d, f, sort_keys=False)


def check_dashboard(cm):
    assert cm['metadata']['labels']['grafana_dashboard'] == '1', 'label must be the string "1"'
    (key, text), = cm['data'].items()
    assert key.endswith('.json'), key
    with open(os.path.join(CHART, 'dashboards', 'cephalo.json')) as f:
        want = json.load(f)
    got = json.loads(text)
    assert got == want, 'the embedded dashboard differs from dashboards/cephalo.json'
    assert got.get('uid') == 'cephalo-training'


if __name__ == '__main__':
    main()
