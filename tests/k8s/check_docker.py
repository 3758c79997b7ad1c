#!/usr/bin/env python3
"""Static checks of docker/Dockerfile.* (no Docker engine or hadolint here): the instructions parse,
the builds are multi-stage, COPY --from names a stage, the final stage runs as a non-root user,
nothing is ADDed from a URL, the build runs make and the runtime has the libraries it needs; the
worker image compiles for all eight GPU architectures (CUDA_ARCHS, as `make cuda-check` checks).
The stages start FROM ${BUILD_IMAGE} and ${BASE_IMAGE}, global ARGs whose defaults are the
images used where a registry is reachable (docker/build-images.sh passes a local Debian base
instead); the worker's CUDA argument (default 1) picks the CUDA or the CPU build; each
Dockerfile's own docker/<Dockerfile>.dockerignore lets in only what make reads.
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


def arg_defaults(ins):
    """{name: default} of ARG instructions in a list of instructions (an ARG without one: None)."""
    out = {}
    for w, r in ins:
        m = re.fullmatch(r'([A-Za-z_][A-Za-z0-9_]*)(?:=(?:"([^"]*)"|(\S*)))?', r) if w == 'ARG' else None
        if m:
            out[m.group(1)] = (m.group(2) if m.group(2) is not None else m.group(3))
    return out


def expand(text, args):
    """$NAME and ${NAME} replaced by their values in args (as the builder does for FROM)."""
    return re.sub(r'\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))',
                  lambda m: args.get(m.group(1) or m.group(2)) or '', text)


def global_args(ins):
    """The ARGs before the first FROM with their defaults expanded in order, as the builder does."""
    out = {}
    for w, r in ins:
        if w == 'FROM':
            break
        for k, v in arg_defaults([(w, r)]).items():
            out[k] = expand(v, out) if v is not None else None
    return out


def stages(ins):
    st = []
    meta = global_args(ins)
    for word, rest in ins:
        if word == 'FROM':
            m = re.fullmatch(r'(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?', rest, re.I)
            if not m:
                raise ValueError(f'bad FROM {rest!r}')
            st.append({'image': expand(m.group(1), meta), 'from': m.group(1), 'name': m.group(2), 'ins': []})
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
    # the base images are build arguments (docker/build-images.sh builds FROM a local Debian base)
    meta = global_args(ins)
    froms = [s['from'] for s in st]
    ok = (len(st) >= 2 and st[0]['from'] in ('${BUILD_IMAGE}', '$BUILD_IMAGE')
          and st[-1]['from'] in ('${BASE_IMAGE}', '$BASE_IMAGE')
          and bool(meta.get('BUILD_IMAGE')) and bool(meta.get('BASE_IMAGE')))
    report(f'{name}: FROM ${{BUILD_IMAGE}} and FROM ${{BASE_IMAGE}}, global ARGs with defaults '
           f'({meta.get("BUILD_IMAGE")}, {meta.get("BASE_IMAGE")})', ok, froms)
    unq = [v for k, v in meta.items() if k.endswith('_IMAGE') and v and not re.match(
        r'(?:[\w.-]+\.[\w.-]+(?::\d+)?/|debian:|ubuntu:)', v)]
    report(f'{name}: default images are fully qualified or Docker official images '
           '(buildah/podman resolve them without a search registry)', not unq, unq)


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
    # CUDA=1 (the default) builds cephalo-worker-cuda; CUDA=0 the CPU worker (the CPU image)
    cuda = arg_defaults(build).get('CUDA')
    runs = ' '.join(r for w, r in build if w == 'RUN')
    ok = (cuda == '1' and re.search(r'\$\{?CUDA\}?(?![A-Za-z0-9_])', runs) is not None
          and 'CUDA=0' in runs and 'build/rel/bin/cephalo-worker ' in runs + ' ')
    report(f'{name}: ARG CUDA (default 1) picks cephalo-worker-cuda or, with CUDA=0, the CPU '
           'cephalo-worker', ok, cuda)


# what `make` reads to build the binaries: a Dockerfile's own ignore file must let these in
MAKE_INPUTS = ['Makefile', 'common', 'planner', 'cli', 'worker', 'operator']


def check_ignorefile(name):
    """docker/<Dockerfile>.dockerignore (BuildKit's per-Dockerfile ignore file; build-images.sh
    passes it to buildah): an allowlist, everything out (.git, build/, runs/ too) but make's inputs."""
    path = os.path.join(ROOT, 'docker', name + '.dockerignore')
    try:
        with open(path) as f:
            pats = [ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith('#')]
    except OSError as e:
        report(f'{name}.dockerignore: exists', False, e)
        return
    kept = [p[1:].strip('/') for p in pats if p.startswith('!')]
    ok = (bool(pats) and pats[0] == '*' and set(MAKE_INPUTS) <= set(kept)
          and not {'.git', 'build', 'runs'} & set(kept)
          and all(os.path.exists(os.path.join(ROOT, k)) for k in kept))
    report(f'{name}.dockerignore: everything out but {", ".join(MAKE_INPUTS)}', ok, pats)


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
    for name in ('Dockerfile.operator', 'Dockerfile.worker'):
        check_ignorefile(name)


if __name__ == '__main__':
    sys.exit(main())
