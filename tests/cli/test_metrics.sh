#!/usr/bin/env bash
# CLI tests of the workers' metrics (docs/metrics.md): `cephalo run --metrics-port` gives each
# rank its own port; a real Prometheus (Debian's `prometheus`) scrapes them through the run's
# prometheus-targets.json and its HTTP API returns cephalo_train_tokens_per_second for every rank;
# a second worker on a taken port fails clearly; the Grafana dashboard
# (charts/cephalo/dashboards/cephalo.json) is valid, portable, every metric its worker queries name
# is one a real worker's /metrics exports, and every worker panel's query gives series in Prometheus
# (the operator's panels: test_operator.sh). Everything started here is stopped at the end.
set -u
B=${BUILD:-build/rel}/bin
C=$B/cephalo
W=$B/cephalo-worker
PY=/usr/bin/python3
DASH=charts/cephalo/dashboards/cephalo.json
T=$(mktemp -d)
run_pid= prom_pid=
cleanup() {
  for p in $prom_pid $run_pid; do kill -TERM "$p" 2>/dev/null; done
  for p in $prom_pid $run_pid; do wait "$p" 2>/dev/null; done
  rm -rf "$T"
}
trap cleanup EXIT
. "$(dirname "$0")/lib.sh"
unset CEPHALO_WORKER CEPHALO_METRICS_PORT

# Four consecutive free ports: the three ranks' and Prometheus's.
BASE=$($PY - <<'EOF'
import random, socket
for _ in range(200):
    base = random.randrange(20000, 40000)
    socks = []
    try:
        for p in range(base, base + 4):
            s = socket.socket(); s.bind(("0.0.0.0", p)); socks.append(s)
        print(base); break
    except OSError:
        pass
    finally:
        for s in socks: s.close()
EOF
)
PROM_PORT=$((BASE + 3))

# GET URL -> the status line, then the body, on stdout ("000" when nothing answers)
get() {
  $PY -c '
import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=5); print(r.status); print(r.read().decode())
except urllib.error.HTTPError as e: print(e.code); print(e.read().decode())
except Exception: print("000")' "$1"
}
status() { get "$1" | sed -n 1p; } # sed reads it all: no broken pipe

# ---- options ----

cat >"$T/job.yaml" <<'EOF'
name: metrics-test
model: tiny-gpt
data: synthetic
validation: {data: synthetic, every: 20, samples: 12} # the dashboard's validation-loss panel
batch: 12
seq: 32
steps: 1000000
devices:
  - {type: cpu, threads: 1, memory: 256M, count: 3}
EOF
check "bad --metrics-port" 2 "--metrics-port: '70000'" -- "$C" run --metrics-port 70000 "$T/job.yaml"
sed 's/^steps:.*/&\nmetrics_port: 65535/' "$T/job.yaml" >"$T/high.yaml"
check "ports beyond 65535" 2 "ranks 0..2 would need ports up to 65537" -- "$C" run "$T/high.yaml" --run-dir "$T/high"
sed 's/^steps:.*/&\nmetrics_port: http/' "$T/job.yaml" >"$T/word.yaml"
check "job metrics_port not a number" 2 "word.yaml:8: metrics_port" -- "$C" run "$T/word.yaml" --run-dir "$T/word"
check "worker --metrics-port range" 2 "--metrics-port: '-1'" -- "$W" train --data synthetic --model tiny-gpt --batch 2 --metrics-port -1
check "bad \$CEPHALO_METRICS_PORT" 2 "CEPHALO_METRICS_PORT is 'x'" -- \
  env CEPHALO_METRICS_PORT=x "$W" train --data synthetic --model tiny-gpt --batch 2 --steps 1
check "dry run: a port per rank" 0 "--metrics-port $((BASE + 2))" -- \
  "$C" run "$T/job.yaml" --run-dir "$T/dry" --metrics-port "$BASE" --dry-run

# ---- a run, scraped ----

"$C" run "$T/job.yaml" --run-dir "$T/run" --metrics-port "$BASE" >"$T/run.out" 2>&1 &
run_pid=$!
up=0
end=$((SECONDS + 600)) # while the run lives (a SAN build on a busy machine starts slowly)
while [ $SECONDS -lt $end ]; do
  up=0
  for r in 0 1 2; do [ "$(status "http://127.0.0.1:$((BASE + r))/healthz")" = 200 ] && up=$((up + 1)); done
  [ $up = 3 ] && break
  kill -0 $run_pid 2>/dev/null || break
  sleep 0.1
done
n=$((n + 1))
if [ $up = 3 ]; then echo "ok $n - every rank's /healthz answers 200"; else
  echo "not ok $n - $up of 3 ranks answer /healthz on ports $BASE..$((BASE + 2))"; tail -5 "$T/run.out" "$T"/run/rank-*.log | sed 's/^/#   /'; fi
check "the start line names the endpoints" 0 "metrics on http://127.0.0.1:$BASE..$((BASE + 2))/metrics" -- cat "$T/run.out"
check "prometheus-targets.json" 0 "\"127.0.0.1:$((BASE + 2))\"" -- cat "$T/run/prometheus-targets.json"
check "a taken port: a clear error" 1 "cannot listen on 0.0.0.0 port $BASE: Address already in use" -- \
  "$W" train --data synthetic --model tiny-gpt --batch 2 --steps 1 --metrics-port "$BASE" --quiet

if ! command -v prometheus >/dev/null; then
  n=$((n + 1)); echo "not ok $n - Prometheus scrapes every rank (no 'prometheus' binary: run 'make deps', Debian package prometheus)"
else
  cat >"$T/prometheus.yml" <<EOF
global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: cephalo
    honor_labels: true # keep the workers' job label (the Cephalo job), docs/metrics.md
    file_sd_configs: [{files: ["$T/run/prometheus-targets.json"]}]
    # the namespace label the Prometheus Operator gives a ServiceMonitor's targets (the job's
    # namespace), which the dashboard's namespace variable selects on
    relabel_configs: [{target_label: namespace, replacement: metrics-ns}]
EOF
  prometheus --config.file="$T/prometheus.yml" --storage.tsdb.path="$T/tsdb" \
    --web.listen-address="127.0.0.1:$PROM_PORT" >"$T/prometheus.log" 2>&1 &
  prom_pid=$!
  # until one series per rank, each with a positive value and the job's name as its job label
  verdict=$($PY - "$PROM_PORT" <<'EOF'
import json, sys, time, urllib.parse, urllib.request
url = "http://127.0.0.1:%s/api/v1/query?" % sys.argv[1] + urllib.parse.urlencode({"query": "cephalo_train_tokens_per_second"})
last = "Prometheus never answered"
deadline = time.time() + 90
while time.time() < deadline:
    try:
        res = json.load(urllib.request.urlopen(url, timeout=5))
        series = res["data"]["result"]
        ranks = sorted(s["metric"].get("rank", "?") for s in series if float(s["value"][1]) > 0)
        jobs = {s["metric"].get("job") for s in series}
        last = "series %s, positive for ranks %s, jobs %s" % (len(series), ranks, jobs)
        if ranks == ["0", "1", "2"] and jobs == {"metrics-test"}:
            print("ok " + last); sys.exit(0)
    except Exception as e:
        last = "query failed: %s" % e
    time.sleep(0.5)
print("not ok " + last)
EOF
)
  n=$((n + 1))
  case $verdict in
    ok*) echo "ok $n - Prometheus scrapes cephalo_train_tokens_per_second of every rank (${verdict#ok })" ;;
    *) echo "not ok $n - Prometheus: ${verdict#not ok }"; tail -5 "$T/prometheus.log" | sed 's/^/#   /' ;;
  esac
  # the build of every rank, as its --version says (docs/development.md, "Versions")
  want=$("$W" --version | cut -d' ' -f2)
  verdict=$($PY - "$PROM_PORT" "$want" <<'EOF'
import json, sys, time, urllib.parse, urllib.request
url = "http://127.0.0.1:%s/api/v1/query?" % sys.argv[1] + urllib.parse.urlencode({"query": "cephalo_build_info"})
last = "no answer"
for _ in range(20):
    try:
        series = json.load(urllib.request.urlopen(url, timeout=5))["data"]["result"]
        got = sorted((s["metric"].get("rank"), s["metric"].get("component"), s["metric"].get("version"), s["value"][1])
                     for s in series)
        last = str(got)
        if got == [(r, "worker", sys.argv[2], "1") for r in ("0", "1", "2")]:
            print("ok " + last); sys.exit(0)
    except Exception as e:
        last = "query failed: %s" % e
    time.sleep(0.5)
print("not ok " + last)
EOF
)
  n=$((n + 1))
  case $verdict in
    ok*) echo "ok $n - Prometheus scrapes cephalo_build_info{component=worker, version=$want} of every rank" ;;
    *) echo "not ok $n - Prometheus cephalo_build_info: ${verdict#not ok }" ;;
  esac
fi

# ---- the dashboard ----

get "http://127.0.0.1:$((BASE + 1))/metrics" >"$T/scrape.txt"
n=$((n + 1))
if out=$($PY - "$DASH" "$T/scrape.txt" <<'EOF' 2>&1
import json, re, sys
dash = json.load(open(sys.argv[1]))  # valid JSON
lines = open(sys.argv[2]).read().splitlines()
assert lines and lines[0] == "200", "the worker's /metrics did not answer"
exported = {re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", l).group(0) for l in lines[1:] if l and not l.startswith("#")}
# and the families it declares (a sample such as the validation loss comes at its first evaluation)
exported |= {m.group(1) + suffix for l in lines[1:] for m in [re.match(r"# TYPE (\S+) (\w+)", l)] if m
             for suffix in (("_bucket", "_sum", "_count") if m.group(2) == "histogram" else ("",))}
assert "cephalo_train_tokens_per_second" in exported, "scrape lacks samples: %s" % sorted(exported)
assert dash.get("uid") == "cephalo-training", "uid %r" % dash.get("uid")
assert "__inputs" not in dash and "${DS_" not in json.dumps(dash), "import inputs (__inputs / ${DS_...})"
tvars = dash["templating"]["list"]
assert any(v["type"] == "datasource" and v["name"] == "datasource" and v["query"] == "prometheus" for v in tvars), "no datasource variable"
def panels(ps):
    for p in ps:
        yield p
        yield from panels(p.get("panels", []))
names = set()
n_targets = 0
for p in panels(dash["panels"]):
    if p["type"] == "row":
        continue
    assert p.get("datasource") == {"type": "prometheus", "uid": "${datasource}"}, "panel %r: datasource %r" % (p["title"], p.get("datasource"))
    assert p.get("targets"), "panel %r has no queries" % p["title"]
    for t in p["targets"]:
        n_targets += 1
        assert t.get("datasource", p["datasource"])["uid"] == "${datasource}", "panel %r: a target's datasource" % p["title"]
        used = set(re.findall(r"\bcephalo_[a-z_]+", t["expr"]))
        assert used, "panel %r: %r names no cephalo metric" % (p["title"], t["expr"])
        operator = all(u.startswith("cephalo_operator_") for u in used)
        # a worker query: the namespace variable in every selector, and jobs of one name in two
        # namespaces kept apart in every aggregation by job
        if not operator:
            n_sel = len(re.findall(r"\bcephalo_[a-z_]+\{", t["expr"]))
            assert t["expr"].count('namespace=~"$namespace"') == n_sel, "panel %r: a selector without the namespace variable: %r" % (p["title"], t["expr"])
            assert not re.search(r"by \((?![^)]*namespace)[^)]*\bjob\b", t["expr"]), "panel %r: by job without namespace: %r" % (p["title"], t["expr"])
        used = {u for u in used if not u.startswith("cephalo_operator_")}  # test_operator.sh's
        missing = used - exported
        assert not missing, "panel %r queries %s, which the worker does not export" % (p["title"], sorted(missing))
        names |= used
for v in tvars:
    if v["type"] == "query":
        missing = set(re.findall(r"\bcephalo_[a-z_]+", v["definition"])) - exported
        assert not missing, "variable %r: %s not exported" % (v["name"], sorted(missing))
assert [v["name"] for v in tvars if v["type"] == "query"] == ["namespace", "job", "rank"], [v["name"] for v in tvars]
assert any(p.get("title") == "Validation loss" for p in panels(dash["panels"])), "no validation-loss panel"
print("%d queries over %d metrics" % (n_targets, len(names)))
EOF
); then echo "ok $n - dashboard: valid JSON, uid, datasource variable, namespace/job/rank variables, the namespace in every worker query and aggregation, a validation-loss panel, every query's metric exported ($out)"
else echo "not ok $n - dashboard"; echo "$out" | tail -5 | sed 's/^/#   /'; fi

# ---- every panel's query against the live Prometheus ----

# Each panel's PromQL with Grafana's variables as a user who picks this job and all ranks gets
# them ($job the job, $rank the "All" value .*, $__rate_interval 4 scrape intervals, Grafana's
# minimum), and the variables' label_values() through /api/v1/series: each must give at least one
# series with a finite value while the three ranks train. A query that never does is a wrong
# dashboard (a metric, label or matcher the workers do not have), and the test names it.
if [ -n "$prom_pid" ]; then
  n=$((n + 1))
  if out=$($PY "$(dirname "$0")/dash_queries.py" workers "$DASH" "$PROM_PORT" metrics-test 2>&1); then echo "ok $n - every dashboard query returns series from the live run ($out)"
  else echo "not ok $n - dashboard queries against Prometheus"; echo "$out" | tail -8 | sed 's/^/#   /'; fi
  # and it catches a wrong one: a matcher no series has (kind="peek")
  sed 's/kind=\\"peak\\"/kind=\\"peek\\"/' "$DASH" >"$T/wrong.json"
  check "... and names a panel whose query gives nothing" 1 "panel 'Device memory per rank' query A: no series with a finite value" -- \
    env DASH_QUERY_WAIT=2 $PY "$(dirname "$0")/dash_queries.py" workers "$T/wrong.json" "$PROM_PORT" metrics-test
fi

# ---- stop: everything started here goes ----

[ -n "$prom_pid" ] && kill -TERM "$prom_pid" 2>/dev/null && wait "$prom_pid" 2>/dev/null
prom_pid=
kill -TERM "$run_pid" 2>/dev/null
wait "$run_pid"
rc=$?
run_pid=
n=$((n + 1))
if [ $rc = 130 ]; then echo "ok $n - the run stops on SIGTERM (exit 130)"; else echo "not ok $n - the run's exit status $rc, expected 130"; tail -5 "$T/run.out" | sed 's/^/#   /'; fi
left=0
for r in 0 1 2; do [ "$(status "http://127.0.0.1:$((BASE + r))/healthz")" != 000 ] && left=$((left + 1)); done
n=$((n + 1))
if [ $left = 0 ]; then echo "ok $n - no worker left serving metrics"; else echo "not ok $n - $left workers still answer"; fi
