#!/usr/bin/env python3
"""gpuwatch.py OUT STOP [PAUSE] - checks, about every second until the file STOP exists, that no node's GPUs
are booked twice: the nvidia.com/gpu requests of the non-terminal pods of each node are at most its
allocatable ones. A pod is a node's when bound to it (spec.nodeName) or, not bound yet, when its
required node affinity names that one node (kubernetes.io/hostname In [v], v the node's hostname
label or name; or matchFields metadata.name In [name]), as the operator's accounting charges it
(docs/operator.md, "Placement"). Violations are appended to OUT, the number of polls is written to
OUT.polls at the end. While the file PAUSE exists, polls are not judged (a test that over-books a
node itself, a foreign pod pinned onto GPUs the operator's unbound pods hold, pauses the check until
the operator has moved them). Uses kubectl (KUBECONFIG); Python 3 standard library only."""
import json
import os
import subprocess
import sys
import time


def get(*a):
    return json.loads(subprocess.run(['kubectl', '--request-timeout=10s', 'get', *a, '-o', 'json'],
                                     capture_output=True, text=True, timeout=30).stdout)


def gpus(c):
    r = c.get('resources') or {}
    for k in ('requests', 'limits'):
        v = (r.get(k) or {}).get('nvidia.com/gpu')
        if v is not None:
            return int(v)
    return 0


def node_of(p, by_host):
    """The node a pod is bound to, or pinned to by its required node affinity; None otherwise."""
    spec = p['spec']
    if spec.get('nodeName'):
        return spec['nodeName']
    terms = (((spec.get('affinity') or {}).get('nodeAffinity') or {})
             .get('requiredDuringSchedulingIgnoredDuringExecution') or {}).get('nodeSelectorTerms') or []
    if len(terms) != 1:
        return None
    for e in terms[0].get('matchExpressions') or []:
        if e['key'] == 'kubernetes.io/hostname' and e['operator'] == 'In' and len(e['values']) == 1:
            return by_host.get(e['values'][0], e['values'][0])
    for e in terms[0].get('matchFields') or []:
        if e['key'] == 'metadata.name' and e['operator'] == 'In' and len(e['values']) == 1:
            return e['values'][0]
    return None


def main():
    out, stop = sys.argv[1], sys.argv[2]
    pause = sys.argv[3] if len(sys.argv) > 3 else None
    polls = 0
    while not os.path.exists(stop):
        try:
            pods = get('pods', '-A')  # before the nodes: a pod's node (created meanwhile) is in the list
            nodes = get('nodes')
        except Exception:
            time.sleep(0.5)
            continue
        alloc = {n['metadata']['name']: int(((n.get('status') or {}).get('allocatable') or {}).get('nvidia.com/gpu', '0'))
                 for n in nodes['items']}
        by_host = {(n['metadata'].get('labels') or {}).get('kubernetes.io/hostname', n['metadata']['name']):
                   n['metadata']['name'] for n in nodes['items']}
        used = {}
        for p in pods['items']:
            node, phase = node_of(p, by_host), (p.get('status') or {}).get('phase')
            if node and phase not in ('Succeeded', 'Failed'):
                used[node] = used.get(node, 0) + sum(gpus(c) for c in p['spec']['containers'])
        bad = {n: (u, alloc[n]) for n, u in used.items() if n in alloc and u > alloc[n]}
        if pause and os.path.exists(pause):
            time.sleep(1)
            continue
        polls += 1
        if bad:
            with open(out, 'a') as f:
                f.write('%s requested/allocatable %s\n' % (time.strftime('%H:%M:%S'), bad))
        time.sleep(1)
    open(out + '.polls', 'w').write(str(polls))


if __name__ == '__main__':
    main()
