#!/usr/bin/env python3
"""A small renderer for the subset of Helm's template language the cephalo chart uses.

There is no helm binary here (Debian has no helm package), so tests/k8s/check_chart.py renders the
chart with this instead. It implements only what charts/cephalo/templates use, with Helm's
semantics, and refuses anything else, so that a template that strays from the subset fails the
test instead of being rendered wrongly:

  {{ PIPELINE }}  {{- ... -}} (whitespace trimming)  {{/* comments */}}
  {{ if PIPELINE }} ... {{ else }} ... {{ end }}  {{ define "NAME" }} ... {{ end }}
  values: .  .Values.a.b  .Release.Name|Namespace|Service  .Chart.Name|Version|AppVersion
          "strings"  integers  true/false
  functions: include NAME CTX, toYaml V, nindent N S, indent N S, quote S, default D V,
             .Files.Get PATH
  pipelines: X | f a b  (X becomes f's last argument)

Printing a missing value is an error (Helm would print "<no value>"); a missing value in an `if`
is false, as in Helm. Values are merged like `helm --set`/`-f`: maps deeply, the rest replaced.

  render_chart.py CHART_DIR [--set-yaml 'YAML'] [--namespace NS] [--release NAME]
prints the rendered manifests as one multi-document YAML stream.
"""
import argparse
import copy
import json
import os
import re
import sys

import yaml


class TemplateError(Exception):
    pass


MISSING = object()

# ---- parsing ------------------------------------------------------------------------------------

ACTION = re.compile(r'\{\{(-\s)?(.*?)(\s-)?\}\}', re.S)


def tokenize(src, name):
    """Text and action tokens, with Helm's trim markers applied to the neighbouring text."""
    toks = []
    pos = 0
    trim_next = False
    for m in ACTION.finditer(src):
        text = src[pos:m.start()]
        if trim_next:
            text = text.lstrip(' \t\r\n')
        if m.group(1):
            text = text.rstrip(' \t\r\n')
        toks.append(('text', text))
        body = m.group(2).strip()
        if '{{' in body:
            raise TemplateError(f'{name}: unbalanced braces in action {body!r}')
        toks.append(('action', body))
        trim_next = bool(m.group(3))
        pos = m.end()
    text = src[pos:]
    if trim_next:
        text = text.lstrip(' \t\r\n')
    toks.append(('text', text))
    if '{{' in ''.join(t for k, t in toks if k == 'text') or '}}' in ''.join(t for k, t in toks if k == 'text'):
        raise TemplateError(f'{name}: a {{{{ or }}}} outside an action (unsupported form)')
    return toks


def parse(toks, name):
    """Nested lists: ('text', s), ('out', pipeline), ('if', pipeline, then, else), ('define', n, body)."""
    pos = 0

    def block(stop):
        nonlocal pos
        out = []
        while pos < len(toks):
            kind, val = toks[pos]
            pos += 1
            if kind == 'text':
                if val:
                    out.append(('text', val))
                continue
            if val.startswith('/*'):
                if not val.endswith('*/'):
                    raise TemplateError(f'{name}: unterminated comment')
                continue
            word = val.split(None, 1)[0] if val else ''
            if word in ('end', 'else'):
                if word not in stop:
                    raise TemplateError(f'{name}: unexpected {{{{ {val} }}}}')
                if val != word:
                    raise TemplateError(f'{name}: unsupported form {{{{ {val} }}}} (only plain else/end)')
                return out, word
            if word == 'if':
                cond = val[2:].strip()
                then, how = block(('end', 'else'))
                other = []
                if how == 'else':
                    other, how = block(('end',))
                out.append(('if', cond, then, other))
            elif word == 'define':
                m = re.fullmatch(r'define\s+"([^"]+)"', val)
                if not m:
                    raise TemplateError(f'{name}: bad define {val!r}')
                body, _ = block(('end',))
                out.append(('define', m.group(1), body))
            elif word in ('range', 'with', 'template', 'block', 'break', 'continue') or val.startswith('$'):
                raise TemplateError(f'{name}: {{{{ {word} }}}} is outside the supported subset')
            else:
                out.append(('out', val))
        if stop:
            raise TemplateError(f'{name}: missing {{{{ end }}}}')
        return out, None

    tree, _ = block(())
    return tree


# ---- evaluation ---------------------------------------------------------------------------------

ARG = re.compile(r'"(?:[^"\\]|\\.)*"|\S+')


def split_pipeline(src):
    parts, cur, inq = [], '', False
    i = 0
    while i < len(src):
        c = src[i]
        if c == '"' and (i == 0 or src[i - 1] != '\\'):
            inq = not inq
        if c == '|' and not inq:
            parts.append(cur.strip())
            cur = ''
        else:
            cur += c
        i += 1
    parts.append(cur.strip())
    if any(not p for p in parts):
        raise TemplateError(f'empty command in pipeline {src!r}')
    return parts


def truthy(v):
    if v is MISSING or v is None:
        return False
    if isinstance(v, (bool, int, float, str, list, dict)):
        return bool(v)
    return True


def go_string(v):
    """How Go's text/template prints a value (%v), for the kinds the chart prints."""
    if v is MISSING or v is None:
        raise TemplateError('printing a missing value (Helm would print "<no value>")')
    if isinstance(v, bool):
        return 'true' if v else 'false'
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        # Helm's values are float64 (through JSON): Go prints 8080.0 as 8080
        return str(int(v)) if v.is_integer() and abs(v) < 1e21 else repr(v)
    if isinstance(v, str):
        return v
    raise TemplateError(f'printing a {type(v).__name__} (use toYaml)')


def to_yaml(v):
    if v is MISSING or v is None:
        return 'null'
    return yaml.safe_dump(v, default_flow_style=False, sort_keys=True, allow_unicode=True).rstrip('\n')


def indent(n, s):
    pad = ' ' * n
    return pad + s.replace('\n', '\n' + pad)


class Renderer:
    def __init__(self, chart_dir, values, release, namespace):
        self.dir = chart_dir
        with open(os.path.join(chart_dir, 'Chart.yaml')) as f:
            chart = yaml.safe_load(f)
        self.root = {
            'Values': values,
            'Release': {'Name': release, 'Namespace': namespace, 'Service': 'Helm'},
            'Chart': {'Name': chart['name'], 'Version': str(chart['version']),
                      'AppVersion': str(chart.get('appVersion', ''))},
        }
        self.defines = {}

    def files_get(self, path):
        full = os.path.normpath(os.path.join(self.dir, path))
        if not full.startswith(os.path.normpath(self.dir) + os.sep):
            raise TemplateError(f'.Files.Get outside the chart: {path}')
        if not os.path.exists(full):
            return ''   # Helm returns "" for a missing file
        with open(full) as f:
            return f.read()

    def value(self, tok, dot):
        if tok == '.':
            return dot
        if tok.startswith('"'):
            return json.loads(tok)
        if re.fullmatch(r'-?\d+', tok):
            return int(tok)
        if tok in ('true', 'false'):
            return tok == 'true'
        if re.fullmatch(r'(\.[A-Za-z_][A-Za-z0-9_]*)+', tok):
            v = dot
            for part in tok[1:].split('.'):
                if v is MISSING or v is None:
                    raise TemplateError(f'{tok}: nil pointer evaluating {part}')
                if not isinstance(v, dict):
                    raise TemplateError(f'{tok}: {part} of a {type(v).__name__}')
                v = v.get(part, MISSING)
            return v
        raise TemplateError(f'unsupported operand {tok!r}')

    def command(self, cmd, dot, piped):
        args = ARG.findall(cmd)
        if not args:
            raise TemplateError('empty command')
        if '(' in cmd or ')' in cmd:
            raise TemplateError(f'parentheses are outside the supported subset: {cmd!r}')
        fn, rest = args[0], args[1:]
        extra = piped or []
        vals = [self.value(a, dot) for a in rest] + extra
        if fn == 'include':
            if len(vals) != 2 or not isinstance(vals[0], str):
                raise TemplateError(f'include needs a name and a context: {cmd!r}')
            if vals[0] not in self.defines:
                raise TemplateError(f'include of an undefined template {vals[0]!r}')
            return self.run(self.defines[vals[0]], vals[1])
        if fn == '.Files.Get':
            if len(vals) != 1:
                raise TemplateError('.Files.Get needs one path')
            return self.files_get(vals[0])
        if fn == 'toYaml':
            if len(vals) != 1:
                raise TemplateError('toYaml needs one value')
            return to_yaml(vals[0])
        if fn in ('nindent', 'indent'):
            if len(vals) != 2 or not isinstance(vals[0], int):
                raise TemplateError(f'{fn} needs a width and a string')
            s = indent(vals[0], go_string(vals[1]))
            return '\n' + s if fn == 'nindent' else s
        if fn == 'quote':
            if len(vals) != 1:
                raise TemplateError('quote needs one value')
            return json.dumps(go_string(vals[0]))
        if fn == 'default':
            if len(vals) != 2:
                raise TemplateError('default needs a default and a value')
            return vals[1] if truthy(vals[1]) else vals[0]
        if rest or extra:
            raise TemplateError(f'unknown function {fn!r}')
        return self.value(fn, dot)

    def pipeline(self, src, dot):
        v = None
        for i, cmd in enumerate(split_pipeline(src)):
            v = self.command(cmd, dot, None if i == 0 else [v])
        return v

    def run(self, tree, dot):
        out = []
        for node in tree:
            kind = node[0]
            if kind == 'text':
                out.append(node[1])
            elif kind == 'out':
                out.append(go_string(self.pipeline(node[1], dot)))
            elif kind == 'if':
                out.append(self.run(node[2] if truthy(self.pipeline(node[1], dot)) else node[3], dot))
            elif kind == 'define':
                self.defines[node[1]] = node[2]
        return ''.join(out)

    def render(self):
        """{template file name: rendered text}; helpers (_*.tpl) are loaded first."""
        tdir = os.path.join(self.dir, 'templates')
        names = sorted(os.listdir(tdir))
        trees = {}
        for n in names:
            with open(os.path.join(tdir, n)) as f:
                trees[n] = parse(tokenize(f.read(), n), n)
        for n in names:
            for node in trees[n]:
                if node[0] == 'define':
                    self.defines[node[1]] = node[2]
        out = {}
        for n in names:
            if n.startswith('_') or not n.endswith(('.yaml', '.yml')):
                continue
            try:
                out[n] = self.run(trees[n], self.root)
            except TemplateError as e:
                raise TemplateError(f'{n}: {e}') from None
        return out


def merge(base, over):
    if isinstance(base, dict) and isinstance(over, dict):
        r = dict(base)
        for k, v in over.items():
            r[k] = merge(base.get(k), v) if k in base else v
        return r
    return copy.deepcopy(over)


def render_chart(chart_dir, overrides=None, release='cephalo', namespace='cephalo-system'):
    """(documents, {template: text}); documents are the parsed non-empty YAML documents."""
    with open(os.path.join(chart_dir, 'values.yaml')) as f:
        values = yaml.safe_load(f) or {}
    if overrides:
        values = merge(values, overrides)
    texts = Renderer(chart_dir, values, release, namespace).render()
    docs = []
    for n, t in texts.items():
        for d in yaml.safe_load_all(t):
            if d is not None:
                docs.append((n, d))
    return docs, texts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('chart')
    ap.add_argument('--set-yaml', default='', help='values to merge over values.yaml, as YAML')
    ap.add_argument('--release', default='cephalo')
    ap.add_argument('--namespace', default='cephalo-system')
    a = ap.parse_args()
    try:
        _, texts = render_chart(a.chart, yaml.safe_load(a.set_yaml) if a.set_yaml else None,
                                a.release, a.namespace)
    except (TemplateError, yaml.YAMLError) as e:
        print(f'render_chart: {e}', file=sys.stderr)
        return 1
    for n, t in texts.items():
        if t.strip():
            print(f'---\n# Source: cephalo/templates/{n}')
            print(t.strip('\n'))
    return 0


if __name__ == '__main__':
    sys.exit(main())
