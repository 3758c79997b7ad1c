#!/usr/bin/env python3
"""Static checks of docker/Dockerfile.* (no Docker engine or hadolint here): the instructions parse,
the builds are multi-stage, COPY --from names a stage, the final stage runs as a non-root user,
nothing is ADDed from a URL, the build runs make and the runtime has the libraries it needs; the
worker image compiles for all eight GPU architectures (CUDA_ARCHS, as `make cuda-check` checks).
Prints "ok N - ..." / "not ok N - ..." lines.
"""
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
INSTRUCTIONS = {'FROM', 'RUN', 'CMD', 'LABEL', 'EXPOSE', 'ENV', 'ADD', 'COPY', 'ENTRYPOINT', 'VOLUME',
                'USER', 'WORKDIR', 'ARG', 'ONBUILD', 'STOPSIGNAL', 'HEALTHCHECK', 'SHELL'}
n = 0


def report(name, ok, detail=''):
    global n
    n += 1
    print(f'{"ok" if ok else "not ok"} {n} - {name}')
    if not ok and detail:
        print(f'#   {detail}')


def parse(path):
    """[(instruction, arguments)], continuation lines joined, comments and directives dropped."""
    out, cur = [], ''
    with open(path) as f:
        for raw in f:
            line = raw.rstrip('\n')
            if not cur and (not line.strip() or line.lstrip().startswith('#')):
                continue
            if cur and line.lstrip().startswith('#'):
                continue   # comment lines inside a continued instruction are dropped
            if line.endswith('\\'):
                cur += line[:-1] + ' '
                continue
            cur += line
            word, _, rest = cur.strip().partition(' ')
            out.append((word.upper(), rest.strip()))
            cur = ''
    if cur:
        raise ValueError('the file ends inside a continued line')
    return out


def stages(ins):
    st = []
    for word, rest in ins:
        if word == 'FROM':
            m = re.fullmatch(r'(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?', rest, re.I)
            if not m:
                raise ValueError(f'bad FROM {rest!r}')
            st.append({'image': m.group(1), 'name': m.group(2), 'ins': []})
        elif st:
            st[-1]['ins'].append((word, rest))
    return st


def check_file(name, build_image, final_image, build_target, runtime_libs):
    path = os.path.join(ROOT, 'docker', name)
    try:
        ins = parse(path)
        st = stages(ins)
    except (OSError, ValueError) as e:
        report(f'{name}: parses', False, e)
        return
    bad = [w for w, _ in ins if w not in INSTRUCTIONS]
    report(f'{name}: every instruction is a Dockerfile instruction', not bad, bad)
    report(f'{name}: multi-stage, {build_image} build stage, {final_image} final stage',
           len(st) >= 2 and build_image in st[0]['image'] and final_image in st[-1]['image'],
           [s['image'] for s in st])
    names = {s['name'] for s in st if s['name']}
    froms = [re.search(r'--from=(\S+)', r).group(1) for w, r in ins if w == 'COPY' and '--from=' in r]
    report(f'{name}: COPY --from names an earlier stage', froms and all(f in names for f in froms), froms)
    users = [r for w, r in st[-1]['ins'] if w == 'USER']
    ok = bool(users) and users[-1].split(':')[0] not in ('root', '0', '')
    report(f'{name}: the final stage runs as a non-root user', ok, users)
    urls = [r for w, r in ins if w == 'ADD' and re.search(r'https?://|git@', r)]
    report(f'{name}: no ADD of a URL', not urls, urls)
    build_runs = ' '.join(r for w, r in st[0]['ins'] if w == 'RUN')
    report(f'{name}: the build stage runs make {build_target}', f'make ' in build_runs and build_target in build_runs)
    final_runs = ' '.join(r for w, r in st[-1]['ins'] if w == 'RUN')
    missing = [lib for lib in runtime_libs if not re.search(rf'(?<![\w.-]){re.escape(lib)}(?![\w.-])', final_runs)]
    report(f'{name}: the runtime stage installs {", ".join(runtime_libs)}', not missing, missing)
    ep = [r for w, r in st[-1]['ins'] if w == 'ENTRYPOINT']
    report(f'{name}: an exec-form ENTRYPOINT', bool(ep) and ep[-1].startswith('['), ep)


# the architectures the worker image must compile for: the Makefile's CUDA_ARCHS_ALL
WORKER_ARCHS = ['60', '61', '70', '75', '80', '86', '89', '90']


def check_worker_archs(name):
    """The build stage passes CUDA_ARCHS (an ARG whose default lists every architecture) to make."""
    path = os.path.join(ROOT, 'docker', name)
    try:
        st = stages(parse(path))
    except (OSError, ValueError) as e:
        report(f'{name}: parses', False, e)
        return
    build = st[0]['ins']
    args = {}
    for w, r in build:
        m = re.fullmatch(r'([A-Za-z_][A-Za-z0-9_]*)=(?:"([^"]*)"|(\S*))', r) if w == 'ARG' else None
        if m:
            args[m.group(1)] = (m.group(2) if m.group(2) is not None else m.group(3)).split()
    archs = args.get('CUDA_ARCHS')
    report(f'{name}: the build stage\'s CUDA_ARCHS lists {" ".join(WORKER_ARCHS)}',
           archs is not None and sorted(archs) == WORKER_ARCHS, archs)
    makes = [r for w, r in build if w == 'RUN' and re.search(r'\bmake\b', r)]
    passed = any(re.search(r'CUDA_ARCHS="?\$\{?CUDA_ARCHS\}?"?', r) for r in makes)
    report(f'{name}: make gets CUDA_ARCHS="${{CUDA_ARCHS}}" on its command line', passed, makes)
    # the Makefile's list is the same one
    try:
        with open(os.path.join(ROOT, 'Makefile')) as f:
            m = re.search(r'^CUDA_ARCHS_ALL\s*:?=\s*(.*)$', f.read(), re.M)
        mk = m.group(1).split() if m else None
    except OSError:
        mk = None
    report('Makefile: CUDA_ARCHS_ALL is the same list', mk == WORKER_ARCHS, mk)


def main():
    check_file('Dockerfile.operator', 'debian:bookworm', 'debian:bookworm-slim', 'cephalo-operator',
               ['libcurl4', 'libyaml-0-2', 'libcjson1', 'libmicrohttpd12'])
    check_file('Dockerfile.worker', '-devel-ubuntu', '-runtime-ubuntu', 'cephalo-worker-cuda',
               ['libopenblas0-openmp', 'libyaml-0-2', 'libcjson1', 'libmicrohttpd12'])
    check_worker_archs('Dockerfile.worker')
    try:
        with open(os.path.join(ROOT, '.dockerignore')) as f:
            ign = {ln.strip() for ln in f if ln.strip() and not ln.startswith('#')}
        ok = {'.git', 'build', 'runs'} <= ign
    except OSError:
        ok = False
    report('.dockerignore keeps .git, build/ and runs/ out of the build context', ok)


if __name__ == '__main__':
    sys.exit(main())
