#!/usr/bin/env python3
"""Checks of charts/cephalo without helm: renders the templates with render_chart.py (the subset of
Helm's template language the chart uses) under several sets of values and checks the manifests.
Prints "ok N - ..." / "not ok N - ..." lines (tests/run.sh counts them).

  check_chart.py [--emit FILE]   --emit also writes the default render (+ dashboard) for kubectl
"""
import json
import os
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from render_chart import TemplateError, render_chart  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
CHART = os.path.join(ROOT, 'charts', 'cephalo')
NS = 'cephalo-system'
n = 0


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
    except (AssertionError, KeyError, TypeError, ValueError, TemplateError, yaml.YAMLError) as e:
        report(name, False, f'{type(e).__name__}: {e}')


def render(over=None, release='cephalo'):
    docs, _ = render_chart(CHART, over, release, NS)
    return [d for _, d in docs]


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
}
ROLE_RULES = {('coordination.k8s.io', 'leases', v): 1 for v in ('get', 'create', 'update')}


def flatten(rules):
    out = {}
    for r in rules:
        assert set(r) <= {'apiGroups', 'resources', 'verbs'}, f'unexpected keys {set(r)}'
        for g in r['apiGroups']:
            for res in r['resources']:
                for v in r['verbs']:
                    assert '*' not in (g, res, v), 'wildcard in a rule'
                    out[(g, res, v)] = 1
    return out


def main():
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
        assert c['image'] == 'ghcr.io/cephalo/cephalo-operator:0.1.0', c['image']
        assert c['imagePullPolicy'] == 'IfNotPresent'
        assert pod['serviceAccountName'] == one(docs, 'ServiceAccount')['metadata']['name']
        assert c['resources']['requests']['memory'] == '64Mi'
    check('Deployment: selector matches the pod labels, image tag = appVersion, service account', deployment)

    def args():
        a = c['args']
        for want in ('--metrics-addr=:8080', '--leader-elect=true', f'--leader-election-namespace={NS}',
                     '--leader-election-id=cephalo-operator', '--log-level=info',
                     '--worker-image=ghcr.io/cephalo/cephalo-worker:0.1.0', '--plan-timeout=30s',
                     '--plan-workers=2', '--worker-archs=60 61 70 75 80 86 89 90'):
            assert want in a, f'missing {want} in {a}'
        assert not any(x.startswith('--namespace') for x in a), 'watchNamespace "" must not pass --namespace'
        assert not any(x.startswith('--profile-configmap') for x in a), 'profileConfigMap "" passes no flag'
        env = {e['name']: e['valueFrom']['fieldRef']['fieldPath'] for e in c['env']}
        assert env == {'POD_NAME': 'metadata.name', 'POD_NAMESPACE': 'metadata.namespace'}, env
    check('Deployment: leader election, metrics, planning and worker-archs flags, POD_NAME/POD_NAMESPACE from the downward API', args)

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
                    'operator': {'image': {'tag': 'v9'}, 'watchNamespace': 'ml', 'profileConfigMap': 'gpu-profiles',
                                 'planTimeout': '2m', 'planWorkers': 4,
                                 'nodeSelector': {'pool': 'system'},
                                 'tolerations': [{'key': 'k', 'operator': 'Exists'}],
                                 'leaderElection': {'enabled': False}}})
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
        assert {'--plan-timeout=2m', '--plan-workers=4', '--worker-archs=80 86 90'} <= set(p['containers'][0]['args']), p['containers'][0]['args']
        assert p['nodeSelector'] == {'pool': 'system'} and p['tolerations'][0]['key'] == 'k'
        return check_dashboard(one(d, 'ConfigMap'))
    check('serviceMonitor, dashboard, tag, namespace, profileConfigMap, planTimeout, planWorkers, worker.archs, nodeSelector, tolerations values take effect', everything)

    def no_workers_sm():
        d = render({'serviceMonitor': {'enabled': True, 'workers': False}})
        assert [x['metadata']['name'] for x in d if x['kind'] == 'ServiceMonitor'] == ['cephalo-operator']
    check('serviceMonitor.workers: false leaves only the operator\'s ServiceMonitor', no_workers_sm)

    def no_rbac():
        d = render({'rbac': {'create': False}, 'serviceAccount': {'create': False, 'name': 'mine'}},
                   release='ceph')
        assert kinds(d) == ['Deployment', 'Service'], kinds(d)
        assert one(d, 'Deployment')['spec']['template']['spec']['serviceAccountName'] == 'mine'
        assert one(d, 'Deployment')['metadata']['name'] == 'ceph-operator'
    check('rbac.create/serviceAccount.create false: no RBAC, the named ServiceAccount is used', no_rbac)

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
            'Created', 'Planned', 'Running', 'Restarting', 'Succeeded', 'Failed', 'Suspended']
    check('CRD: the chart\'s copy equals crds/, group/kind/version, status subresource, columns', crd)

    def chart_yaml():
        with open(os.path.join(CHART, 'Chart.yaml')) as f:
            c = yaml.safe_load(f)
        assert c['apiVersion'] == 'v2' and c['name'] == 'cephalo' and c['version'] and c['appVersion']
        with open(os.path.join(CHART, 'values.yaml')) as f:
            v = yaml.safe_load(f)
        for k in ('operator', 'worker', 'serviceAccount', 'rbac', 'serviceMonitor', 'grafanaDashboard'):
            assert k in v, k
    check('Chart.yaml (apiVersion v2) and values.yaml parse', chart_yaml)

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
