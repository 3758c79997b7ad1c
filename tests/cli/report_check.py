"""report_check.py - reads `cephalo report`'s page back (tests/cli/test_report.sh).

  report_check.py page REPORT.html RUN_DIR     the page against the run's own files: every curve
                                               has one point per logged step and its points, mapped
                                               back through the plot's axes, are the logs' values;
                                               bars and tables are the plan's and the logs' numbers;
                                               nothing is fetched from anywhere
  report_check.py dom DOM.html                 Chromium's rendered DOM (--dump-dom) has the charts
  report_check.py png SHOT.png                 a screenshot shows the curves (the stroke colours,
                                               across most of a plot's width) and is not blank
  report_check.py gen RUN_DIR N                RUN_DIR (with a plan.json) gets N step records per
                                               rank, written by awk from formulas of the step
  report_check.py big REPORT.html RUN_DIR N    the page of such a run against the same formulas,
                                               computed here (medians by sorting, peaks, curves):
                                               logs of millions of lines are not read back
  report_check.py rusage RC T0 SECONDS MAX_MIB ERR   exec'ed by the shell that ran a command
                                               (under `timeout SECONDS`, from time T0, stderr in
                                               ERR, exit status RC): its wall time and peak RSS;
                                               fails when it failed, timed out or used more

Prints one line of findings; exits 1 with the reason on the first mismatch. Debian's python3
(numpy); the PNG decoder is zlib + numpy, no imaging library."""
import json, re, struct, sys, zlib
from html.parser import HTMLParser

TRAIN, VAL = (0x1F, 0x77, 0xB4), (0xD6, 0x27, 0x28)
RANK1 = (0xFF, 0x7F, 0x0E)  # palette[1]: used only by rank 1's samples/s curve


def fail(msg):
    print(msg)
    sys.exit(1)


class Page(HTMLParser):
    """Elements as (tag, attrs) in order, the text of every table cell by table id."""

    def __init__(self):
        super().__init__()
        self.elems, self.tables, self.table, self.cell = [], {}, None, None
        self.plots = []  # (svg id, plot attrs)
        self.svg = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.elems.append((tag, a, self.svg))
        if tag == "svg":
            self.svg = a.get("id")
        if tag == "g" and a.get("class") == "plot":
            self.plots.append((self.svg, a))
        if tag == "table":
            self.table = a.get("id")
            self.tables[self.table] = []
        if tag == "tr" and self.table:
            self.tables[self.table].append([])
        if tag in ("td", "th") and self.table:
            self.cell = ""

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag):
        if tag == "svg":
            self.svg = None
        if tag == "table":
            self.table = None
        if tag in ("td", "th") and self.cell is not None:
            self.tables[self.table][-1].append(self.cell.strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def read_log(path):
    recs = []
    for line in open(path):
        if line.strip():
            o = json.loads(line)
            if "step" in o:
                recs.append(o)
    return recs


def unmap(plot, pts):
    """SVG points back to (x, y) values through the plot's data-box / data-x / data-y."""
    left, top, w, h = map(float, plot["data-box"].split())
    x0, x1 = map(float, plot["data-x"].split())
    y0, y1 = map(float, plot["data-y"].split())
    out = []
    for p in pts.split():
        px, py = map(float, p.split(","))
        out.append((x0 + (px - left) / w * (x1 - x0), y0 + (top + h - py) / h * (y1 - y0)))
    return out, (x1 - x0) / w, (y1 - y0) / h  # values, and one pixel in each unit


MAX_POINTS = 4000  # cli/report.c REP_MAX_POINTS


def drawn(points):
    """The points of a curve the page draws (docs/report.md): all of them up to MAX_POINTS, else
    every k-th, k the smallest power of two that leaves at most MAX_POINTS, and the last."""
    k = 1
    while -(-len(points) // k) > MAX_POINTS:
        k *= 2
    keep = points[::k]
    if (len(points) - 1) % k:
        keep.append(points[-1])
    return keep


def close_curve(name, got, want, px, py):
    close_points(name, got, drawn(want), len(want), px, py)


def close_points(name, got, want, steps, px, py):
    """A curve's points got against those drawn of its `steps` points (want)."""
    if len(got) != len(want):
        fail("%s: %d points, the log has %d steps%s" % (name, len(got), steps,
                                                       "" if steps == len(want) else " (%d drawn)" % len(want)))
    for (gx, gy), (wx, wy) in zip(got, want):
        # points are printed to 0.01 px: half of that, plus rounding
        if abs(gx - wx) > 0.01 * px + 1e-9 or abs(gy - wy) > 0.01 * py + 1e-9:
            fail("%s: point (%.6g, %.6g) is not the log's (%.6g, %.6g)" % (name, gx, gy, wx, wy))


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def check_page(html_path, run):
    text = open(html_path, encoding="utf-8").read()
    for bad in ("http://", "https://", "<script", "<link", "@import", "url(", "src=", "//cdn"):
        if bad in text:
            fail("the page has %r: it must not fetch anything" % bad)
    page = Page()
    page.feed(text)
    plan = json.load(open(run + "/plan.json"))
    world = plan["world_size"]
    logs = [read_log("%s/rank-%d.jsonl" % (run, r)) for r in range(world)]
    plots = {svg: a for svg, a in page.plots}
    lines = [(a, svg) for t, a, svg in page.elems if t == "polyline"]
    # the loss chart: rank 0's train loss at every step, the validation losses where logged
    train = [a for a, svg in lines if a.get("class") == "train-loss"]
    if len(train) != 1 or "loss" not in plots:
        fail("loss chart: %d train-loss curves, plots %s" % (len(train), sorted(plots)))
    got, px, py = unmap(plots["loss"], train[0]["points"])
    losses = [(o["step"] + 1, o["loss"]) for o in logs[0] if o["loss"] is not None]  # null: not finite, a gap
    close_curve("train loss", got, losses, px, py)
    if int(train[0]["data-n"]) != len(drawn(losses)):
        fail("train loss data-n %s, %d losses" % (train[0]["data-n"], len(losses)))
    vals = [(o["step"] + 1, o["val_loss"]) for o in logs[0] if o.get("val_loss") is not None]
    val = [a for a, svg in lines if a.get("class") == "val-loss"]
    if vals:
        if len(val) != 1:
            fail("loss chart: %d val-loss curves, the log has %d validation losses" % (len(val), len(vals)))
        close_curve("validation loss", unmap(plots["loss"], val[0]["points"])[0], vals, px, py)
    # samples/s: one curve per rank, each its own log's
    sps = {int(a["data-rank"]): a for a, svg in lines if a.get("class") == "samples-per-s"}
    if sorted(sps) != list(range(min(world, 8))):
        fail("samples/s curves for ranks %s, world %d" % (sorted(sps), world))
    for r, a in sps.items():
        got, px, py = unmap(plots["samples"], a["points"])
        close_curve("rank %d samples/s" % r, got, [(o["step"] + 1, o["samples_per_s"]) for o in logs[r]], px, py)
    # the bars: measured and predicted step time and peak memory per rank
    bars = {(a["data-rank"], svg, a["data-kind"]): float(a["data-value"]) for t, a, svg in page.elems
            if t == "rect" and a.get("class") == "bar"}
    for r in range(world):
        pr = plan["ranks"][r]
        ms = [o["step_ms"] for o in logs[r]]
        want = {("step-time", "measured"): median(ms[2:] if len(ms) > 2 else ms),
                ("step-time", "predicted iteration"): plan["predicted"]["iter_ms"],
                ("step-time", "predicted compute"): pr["predicted"]["fwd_ms"] + pr["predicted"]["bwd_ms"] + pr["predicted"]["optimizer_ms"],
                ("memory", "measured"): max(o["peak_bytes"] for o in logs[r]),
                ("memory", "predicted"): pr["predicted"]["peak_bytes"],
                ("memory", "capacity"): pr["memory_bytes"]}
        for (svg, kind), v in want.items():
            g = bars.get((str(r), svg, kind))
            if g is None or abs(g - v) > 1e-9 * max(1, abs(v)):
                fail("rank %d %s bar %r: %r, expected %r" % (r, svg, kind, g, v))
    # the plan table: a row per rank with the plan's device, batch, microbatch, microbatches
    rows = page.tables.get("plan", [])[1:]
    if len(rows) != world:
        fail("plan table: %d rows for %d ranks" % (len(rows), world))
    for r, row in enumerate(rows):
        pr = plan["ranks"][r]
        want = [str(r), pr["node"], pr["device"], str(pr.get("threads", "")), str(pr["batch"]), str(pr["microbatch"]),
                str(pr["microbatches"]), "%.2f%%" % (100 * pr["state_ratio"]), str(pr["state_params"])]
        if row[:9] != want:
            fail("plan table row %d: %s, expected %s" % (r, row[:9], want))
    m = page.tables.get("measured", [])[1:]
    if len(m) != world or any(row[1] != str(len(logs[r])) for r, row in enumerate(m)):
        fail("measured table: %s" % m)
    print("%d steps, %d validation losses, %d ranks: curves, bars and tables match the logs and the plan"
          % (len(logs[0]), len(vals), world))


def check_dom(path):
    dom = open(path, encoding="utf-8").read()
    need = {"<svg": 4, 'class="train-loss"': 1, 'class="samples-per-s"': 3, 'class="bar"': 18, '<table id="plan"': 1}
    got = {k: dom.count(k) for k in need}
    if any(got[k] < v for k, v in need.items()):
        fail("rendered DOM: %s, expected at least %s" % (got, need))
    print("rendered DOM: " + ", ".join("%s x%d" % (k.strip("<"), v) for k, v in got.items()))


def png_pixels(path):
    import numpy as np
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail("%s: not a PNG" % path)
    pos, idat, hdr = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
    w, h, depth, ctype, _, _, interlace = hdr
    if depth != 8 or ctype not in (2, 6) or interlace:
        fail("%s: PNG depth %d colour type %d interlace %d (expected 8-bit RGB/RGBA)" % (path, depth, ctype, interlace))
    bpp = 3 if ctype == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(h, 1 + w * bpp)
    img = np.zeros((h, w * bpp), dtype=np.uint8)
    prev = np.zeros(w * bpp, dtype=np.int32)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        if f == 0:
            cur = line
        elif f == 1:  # Sub: a running sum per channel
            cur = np.cumsum(line.reshape(w, bpp), axis=0).reshape(-1) % 256
        elif f == 2:
            cur = (line + prev) % 256
        else:  # Average, Paeth: pixel by pixel
            cur = line.copy()
            for x in range(w * bpp):
                a = cur[x - bpp] if x >= bpp else 0
                b, c = prev[x], prev[x - bpp] if x >= bpp else 0
                if f == 3:
                    pred = (a + b) // 2
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                cur[x] = (cur[x] + pred) % 256
        img[y] = cur
        prev = cur
    return img.reshape(h, w, bpp)[:, :, :3].astype(np.int32)


def check_png(path):
    import numpy as np
    img = png_pixels(path)
    h, w, _ = img.shape
    white = (img >= 250).all(axis=2)
    if white.mean() > 0.98:
        fail("the screenshot is blank: %.1f%% white" % (100 * white.mean()))

    def where(rgb):
        return (np.abs(img - np.array(rgb)) <= 12).all(axis=2)

    val = where(VAL)
    if val.sum() < 50:
        fail("no validation loss curve: %d pixels of #d62728" % val.sum())
    rows = np.nonzero(val.any(axis=1))[0]
    band = where(TRAIN)[rows.min() - 40:rows.max() + 40]  # the loss chart, located by its red curve
    xs = np.nonzero(band.any(axis=0))[0]
    if band.sum() < 300 or xs.max() - xs.min() < 0.4 * w:
        fail("the train loss curve: %d pixels of #1f77b4 over x %d..%d in the loss chart" % (band.sum(), xs.min() if len(xs) else -1, xs.max() if len(xs) else -1))
    r1 = where(RANK1)
    x1 = np.nonzero(r1.any(axis=0))[0]
    if r1.sum() < 200 or x1.max() - x1.min() < 0.4 * w:
        fail("rank 1's samples/s curve: %d pixels of #ff7f0e" % r1.sum())
    print("screenshot %dx%d: %.1f%% not white; train loss %d px across %d px, validation %d px, rank 1 samples/s %d px"
          % (w, h, 100 - 100 * white.mean(), band.sum(), xs.max() - xs.min(), val.sum(), r1.sum()))


# ---- runs of millions of steps (gen, big, measure) ----

# Rank R's step s as `gen` writes it: a step time among 10,007 values 5.000..15.006 ms (the worker
# logs step_ms to the microsecond: a long run repeats a few thousand values), a null loss (not
# finite: a gap in the curve) at steps 77, 250077, ..., a validation loss every 1000 steps.
AWK = r"""BEGIN {
  for (s = 0; s < N; s++) {
    ms = 5 + ((s * 7919 + R * 104729) % 10007) / 1000
    loss = s % 250000 == 77 ? "null" : sprintf("%.6g", 6 - s / 250000)
    val = s % 1000 == 999 ? sprintf(",\"val_loss\":%.6g", 3 + s / 1e6) : ""
    printf "{\"step\":%d,\"loss\":%s,\"lr\":0.0003,\"step_ms\":%.3f,\"samples_per_s\":%.3f,\"peak_bytes\":%d,\"rank\":%d%s}\n",
      s, loss, ms, 12000 / ms, 1000000 + (s * 31) % 99991 + R, R, val
  }
}"""
MS = [float("%.3f" % (5 + k / 1000)) for k in range(10007)]
SPS = [float("%.3f" % (12000 / (5 + k / 1000))) for k in range(10007)]


def gen(run, n):
    import subprocess
    world = json.load(open(run + "/plan.json"))["world_size"]
    procs = [subprocess.Popen(["awk", "-v", "N=%d" % n, "-v", "R=%d" % r, AWK], stdout=open("%s/rank-%d.jsonl" % (run, r), "w"))
             for r in range(world)]
    if any(p.wait() for p in procs):
        fail("awk failed")
    print("%d ranks x %d step records" % (world, n))


def check_big(html_path, run, n):
    page = Page()
    page.feed(open(html_path, encoding="utf-8").read())
    world = json.load(open(run + "/plan.json"))["world_size"]
    plots = {svg: a for svg, a in page.plots}
    lines = [a for t, a, svg in page.elems if t == "polyline"]
    curve = lambda cls, rank=None: [a for a in lines if a.get("class") == cls and a.get("data-rank") == rank]
    steps = [s for s in range(n) if s % 250000 != 77]
    got, px, py = unmap(plots["loss"], curve("train-loss")[0]["points"])
    want = [(s + 1, float("%.6g" % (6 - s / 250000))) for s in drawn(steps)]
    close_points("train loss", got, want, len(steps), px, py)
    vals = [(s + 1, float("%.6g" % (3 + s / 1e6))) for s in range(999, n, 1000)]
    got, px, py = unmap(plots["loss"], curve("val-loss")[0]["points"])
    close_points("validation loss", got, drawn(vals), len(vals), px, py)
    bars = {(a["data-rank"], svg, a["data-kind"]): float(a["data-value"]) for t, a, svg in page.elems
            if t == "rect" and a.get("class") == "bar"}
    table = page.tables.get("measured", [])[1:]
    for r in range(world):
        ks = [(s * 7919 + r * 104729) % 10007 for s in range(n)]
        ms = sorted(MS[k] for k in ks[2:])  # the median leaves the first 2 steps out
        med = ms[len(ms) // 2] if len(ms) % 2 else (ms[len(ms) // 2 - 1] + ms[len(ms) // 2]) / 2
        peak = max(1000000 + (s * 31) % 99991 + r for s in range(n))
        for (svg, kind), v in {("step-time", "measured"): med, ("memory", "measured"): peak}.items():
            g = bars.get((str(r), svg, kind))
            if g is None or abs(g - v) > 1e-9 * abs(v):
                fail("rank %d %s bar %r: %r, expected %r" % (r, svg, kind, g, v))
        mean = sum(SPS[k] for k in ks) / n
        if table[r][1] != str(n) or abs(float(table[r][5]) - mean) > 0.051:
            fail("measured table row %d: %s, expected %d steps, mean samples/s %.2f" % (r, table[r], n, mean))
        if r < 8:
            got, px, py = unmap(plots["samples"], curve("samples-per-s", str(r))[0]["points"])
            close_points("rank %d samples/s" % r, got, [(s + 1, SPS[ks[s]]) for s in drawn(list(range(n)))], n, px, py)
        if r == 0:
            first_median = med
    head = "steps logged: %d (1..%d)" % (n, n)
    if head not in open(html_path, encoding="utf-8").read():
        fail("the header lacks %r" % head)
    print("%d ranks x %d steps: medians (rank 0: %.4f ms), peaks and steps match; curves of %d points, each on its log"
          % (world, n, first_median, len(drawn(steps))))


def rusage(rc, t0, seconds, max_mib, err):
    """The measure of a command the shell ran just before exec'ing this (report_check.py rusage RC
    T0 ...): RUSAGE_CHILDREN survives the exec and holds the command's peak RSS alone. (Run as a
    child of Python, the peak would include the Python forked before the exec.)"""
    import resource, time
    wall, rss = time.time() - t0, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    said = "wall %.2f s, max RSS %.1f MiB" % (wall, rss)
    if rc == 124:
        fail("%s: still running after %d s, killed (a linear pass takes a few: a quadratic one?)" % (said, seconds))
    if rc:
        fail("%s: exit %d: %s" % (said, rc, open(err, errors="replace").read()[-400:]))
    if max_mib and rss > max_mib:
        fail("%s: more than %d MiB" % (said, max_mib))
    print(said + (" (bound %d MiB)" % max_mib if max_mib else ""))


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "page":
        check_page(sys.argv[2], sys.argv[3])
    elif mode == "dom":
        check_dom(sys.argv[2])
    elif mode == "png":
        check_png(sys.argv[2])
    elif mode == "gen":
        gen(sys.argv[2], int(sys.argv[3]))
    elif mode == "big":
        check_big(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif mode == "rusage":
        rusage(int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    else:
        fail("unknown mode %r" % mode)
