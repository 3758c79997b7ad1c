"""dash_queries.py - every panel query of the Grafana dashboard against a live Prometheus.

  dash_queries.py workers DASHBOARD.json PROM_PORT JOB   the workers' panels (tests/cli/test_metrics.sh)
  dash_queries.py operator DASHBOARD.json PROM_PORT      the operator's panels (test_operator.sh)

Each panel's PromQL gets Grafana's variables as a user who picks JOB in its namespace and all ranks
has them ($namespace NS, $DASH_NAMESPACE or metrics-ns, as test_metrics.sh's Prometheus labels the
targets; $job JOB, $rank the "All" value .*, $__rate_interval 4 scrape intervals of 1 s, Grafana's minimum), and
is sent to /api/v1/query until it gives at least one series (workers: with a finite value; the
operator's may be NaN, as a quantile of an idle interval is) or $DASH_QUERY_WAIT seconds (60) pass. The variables'
label_values(SELECTOR, LABEL) go to /api/v1/series (workers: JOB and ranks 0..2 must be among the
values, and NS among the namespaces). A query that never gives a series is a wrong dashboard (a metric, label or matcher the
components do not have), and is named. Prints one line; exit 1 on a failure."""
import json, math, os, re, sys, time, urllib.parse, urllib.request

mode, dash, port = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3]
job = sys.argv[4] if mode == "workers" else "none"
api = "http://127.0.0.1:%s/api/v1/" % port
ns = os.environ.get("DASH_NAMESPACE", "metrics-ns")
subst = {"$namespace": ns, "$job": job, "$rank": ".*", "$__rate_interval": "4s"}


def expand(expr):
    for k in sorted(subst, key=len, reverse=True):
        expr = expr.replace("${%s}" % k[1:], subst[k]).replace(k, subst[k])
    left = re.findall(r"\$\{?\w+", expr)
    assert not left, "no value for %s in %r" % (left, expr)
    return expr


def get(path, **q):
    url = api + path + "?" + urllib.parse.urlencode(q, doseq=True)
    return json.load(urllib.request.urlopen(url, timeout=5))["data"]


def panels(ps):
    for p in ps:
        yield p
        yield from panels(p.get("panels", []))


def is_operator(expr):
    return "cephalo_operator_" in expr


queries = [(p["title"], t["refId"], expand(t["expr"])) for p in panels(dash["panels"]) if p["type"] != "row"
           for t in p["targets"] if is_operator(t["expr"]) == (mode == "operator")]
if not queries:
    print("no %s panels in the dashboard" % mode)
    sys.exit(1)


def answers(q):
    res = get("query", query=q)["result"]
    return res and (mode == "operator" or any(math.isfinite(float(s["value"][1])) for s in res))


wait = float(os.environ.get("DASH_QUERY_WAIT", "60"))
pending, deadline = {(t, r): q for t, r, q in queries}, time.time() + wait
while pending and time.time() < deadline:
    for key, q in list(pending.items()):
        try:
            if answers(q):
                del pending[key]
        except OSError:
            pass  # Prometheus still starting
    if pending:
        time.sleep(1)
bad = ["panel %r query %s: no series%s after %g s: %s" % (k[0], k[1], "" if mode == "operator" else " with a finite value", wait, q)
       for k, q in pending.items()]
n_vars = 0
if mode == "workers":
    want = {"namespace": {ns}, "job": {job}, "rank": {"0", "1", "2"}}
    for v in dash["templating"]["list"]:
        if v["type"] != "query":
            continue
        n_vars += 1
        m = re.fullmatch(r"label_values\((.+), *(\w+)\)", v["definition"])
        assert m, "variable %r: %r is not label_values(SELECTOR, LABEL)" % (v["name"], v["definition"])
        got = {s.get(m.group(2)) for s in get("series", **{"match[]": expand(m.group(1))})}
        if not want[v["name"]] <= got:
            bad.append("variable %r: %s gives %s, expected %s" % (v["name"], v["definition"], sorted(got), sorted(want[v["name"]])))
print("\n".join(bad) if bad else "%d queries of %d %s panels%s give series"
      % (len(queries), len({t for t, _, _ in queries}), mode, " and %d variables" % n_vars if n_vars else ""))
sys.exit(1 if bad else 0)
