#!/usr/bin/env python3
"""outputs.py - a probe of every command that writes (issue 38): each output option given each
input of the command under every spelling a user could give it (the path, ./ and .. spellings, a
symbolic link, a hard link beside it or in another directory, a path through a linked directory,
a pattern's or a directory's file), and each output option given every kind of path that is not a
plain file (a character device, a block device, a FIFO without a reader, a socket, a directory, a
symbolic link to nothing, to a device or to a directory). For each case, in a fresh copy of the
fixture: the command must not crash (no signal, no sanitizer report, no timeout), and nothing may
be lost: every file that was there is unchanged (content and type) unless it is one the command
may write (its own output files and directories, never an input). Prints one line per failing
case and a summary line "probe: N cases, N refused, N written, N lost, N crashed".

    tests/probe/outputs.py [BUILD]      (default build/rel; device nodes only as root)

Not part of `make test` (a few minutes); docs/development.md "Outputs" says when to run it."""
import hashlib
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile

if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
    print(__doc__)
    sys.exit(0)
BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/rel")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
C = os.path.join(BUILD, "bin", "cephalo")
W = os.path.join(BUILD, "bin", "cephalo-worker")
ROOT = os.geteuid() == 0
ENV = dict(os.environ, CEPHALO_PROFILE_CACHE="none", CEPHALO_PROFILE_STORE="none")
ENV.pop("CEPHALO_WORKER", None)
TINY = ["--model", "tiny-gpt", "--batch", "4", "--microbatch", "2", "--seq", "32", "--threads", "1", "--quiet"]
JOB = """model: tiny-gpt
batch: 4
steps: 2
seq: 32
devices: [{type: cpu, threads: 1, memory: 256M}]
data: %s
checkpoint: {dir: ckpt, every: 1}
"""


def run(argv, cwd, timeout=120):
    try:
        p = subprocess.run(argv, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        return "timeout", ""


def make_fixture(fx):
    """Shards, a checkpoint directory, an exported model, a cluster, model and plan file, a run
    directory with checkpoints: what the commands read."""
    def must(argv):
        rc, out = run(argv, fx, 300)
        if rc != 0:
            sys.exit("probe: fixture: %s failed (%s): %s" % (" ".join(argv), rc, out[-500:]))
    with open(os.path.join(fx, "text.txt"), "w") as f:
        f.write(("the quick brown fox jumps over the lazy dog %d\n" * 1500) % tuple(range(1500)))
    must([C, "data", "-o", "d", "--val-fraction", "0.2", "text.txt"])
    must([W, "train", "--data", "synthetic"] + TINY + ["--steps", "2", "--ckpt-every", "1", "--ckpt-dir", "ck"])
    must([W, "export", "--checkpoint", "ck", "-o", "hf"])
    shutil.copy(os.path.join(REPO, "examples/clusters/cluster-a.yaml"), os.path.join(fx, "c.yaml"))
    shutil.copy(os.path.join(REPO, "examples/models/demo-gpt.yaml"), os.path.join(fx, "m.yaml"))
    must([C, "plan", "--cluster", "c.yaml", "--model", "gpt2-124m", "--batch", "64", "-o", "p.json"])
    with open(os.path.join(fx, "prompt.txt"), "w") as f:
        f.write("a prompt")
    with open(os.path.join(fx, "job.yaml"), "w") as f:
        f.write(JOB % "synthetic")
    with open(os.path.join(fx, "djob.yaml"), "w") as f:
        f.write(JOB % "d")
    must([C, "run", "job.yaml", "--run-dir", "r", "--quiet"])
    os.makedirs(os.path.join(fx, "elsewhere"))
    shutil.copytree(os.path.join(fx, "d"), os.path.join(fx, "dtok"))
    with open(os.path.join(fx, "dtok", "tokenizer.json"), "w") as f:
        f.write('{"mine": "a tokenizer of the user"}')
    os.symlink("d", os.path.join(fx, "dlink"))


def snapshot(root):
    """path -> (file type, content digest or None) for everything under root, links not followed."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            digest = None
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                digest = os.readlink(p)
            out[os.path.relpath(p, root)] = (stat.S_IFMT(st.st_mode), digest)
    return out


# ---- the cases: (name, setup, argv, may_change) ----
# setup: a list of (kind, path[, target]) made in the case's copy; may_change: path prefixes the
# command may write when it runs (its outputs and output directories). An output that names an
# input must be refused; every case must leave every other file as it was.

def spellings(inp):
    """Ways of naming the existing input file inp as an output: (setup, path)."""
    d, base = os.path.split(inp)
    out = [([], inp), ([], "./" + inp), ([], "elsewhere/../" + inp),
           ([("symlink", "elsewhere/sym", os.path.join("..", inp))], "elsewhere/sym"),
           ([("hardlink", "elsewhere/hard", inp)], "elsewhere/hard"),
           ([("hardlink", (d + "/" if d else "") + "hard-" + base, inp)], (d + "/" if d else "") + "hard-" + base)]
    if d:
        out.append(([("symlink", "elsewhere/dirlink", os.path.join("..", d))], "elsewhere/dirlink/" + base))
    return out


KINDS = [("fifo", "nobody-reads"), ("socket", "sock"), ("dir", "adir"), ("dangling", "dangling"),
         ("symlink-dir", "to-dir")]
if ROOT:
    KINDS += [("chardev", "null"), ("blockdev", "blk"), ("symlink-chardev", "to-null")]


def kind_setup(kind, path):
    if kind.startswith("symlink-"):
        inner = kind_setup(kind[8:], path + ".target")
        return inner + [("symlink", path, os.path.basename(path) + ".target")]
    return [(kind, path)]


# Each command: a function of the output path giving argv, the inputs it reads (files), and the
# output prefixes it may write besides the output itself.
TRAIN_LOG = [
    ("train --data DIR", lambda o: [W, "train"] + TINY + ["--steps", "1", "--data", "d", "--log", o],
     ["d/train_000000.bin"]),
    ("train --data+tokenizer.json", lambda o: [W, "train"] + TINY + ["--steps", "1", "--data", "dtok",
                                                                                "--log", o], ["dtok/tokenizer.json"]),
    ("train --data PATTERN", lambda o: [W, "train"] + TINY + ["--steps", "1", "--data", "d/train_*.bin", "--log", o],
     ["d/train_000000.bin"]),
    ("train --data d*/PATTERN", lambda o: [W, "train"] + TINY + ["--steps", "1", "--data", "d*/train_*.bin", "--log", o],
     ["d/train_000000.bin"]),
    ("train --data [d]/FILE", lambda o: [W, "train"] + TINY + ["--steps", "1", "--data", "[d]/train_000000.bin", "--log", o],
     ["d/train_000000.bin"]),
    ("train --data dlink (a linked directory)", lambda o: [W, "train"] + TINY + ["--steps", "1", "--data", "dlink", "--log", o],
     ["d/train_000000.bin"]),
    ("train --val-data DIR", lambda o: [W, "train"] + TINY + ["--steps", "1", "--data", "synthetic", "--val-data", "d",
                                                              "--log", o], ["d/val_000000.bin"]),
    ("train --resume FILE", lambda o: [W, "train"] + TINY + ["--steps", "3", "--data", "synthetic", "--ckpt-dir", "ck2",
                                                             "--resume", "ck/step_00000002.safetensors", "--log", o],
     ["ck/step_00000002.safetensors"], ["ck2"]),
    ("train --resume auto", lambda o: [W, "train"] + TINY + ["--steps", "3", "--data", "synthetic", "--ckpt-dir", "ck",
                                                             "--resume", "auto", "--log", o],
     ["ck/step_00000002.safetensors"], ["ck"]),
    ("train --init-from DIR", lambda o: [W, "train", "--data", "synthetic", "--init-from", "hf", "--batch", "4",
                                         "--microbatch", "2", "--seq", "32", "--threads", "1", "--quiet", "--steps", "1",
                                         "--log", o], ["hf/model.safetensors", "hf/config.json"]),
    ("train --model DIR", lambda o: [W, "train", "--model", "hf", "--batch", "4", "--microbatch", "2", "--seq", "32",
                                     "--data", "synthetic", "--steps", "1", "--quiet", "--log", o], ["hf/config.json"]),
    ("train --model FILE", lambda o: [W, "train", "--model", "m.yaml", "--batch", "4", "--microbatch", "2", "--seq", "32",
                                      "--data", "synthetic", "--steps", "1", "--quiet", "--log", o], ["m.yaml"]),
]
OTHERS = [
    ("plan -o", lambda o: [C, "plan", "--cluster", "c.yaml", "--model", "hf", "--batch", "8", "-o", o],
     ["c.yaml", "hf/config.json"]),
    ("plan --dump-costs", lambda o: [C, "plan", "--cluster", "c.yaml", "--model", "m.yaml", "--batch", "8",
                                     "--dump-costs", o], ["c.yaml", "m.yaml"]),
    ("report -o", lambda o: [C, "report", "r", "-o", o],
     ["r/plan.json", "r/rank-0.jsonl", "r/ckpt/latest", "r/ckpt/step_00000002.safetensors"]),
    ("sample --dump-logits", lambda o: [W, "sample", "--checkpoint", "ck", "--prompt-file", "prompt.txt",
                                        "--max-new-tokens", "2", "--dump-logits", o],
     ["prompt.txt", "ck/step_00000002.safetensors"]),
    ("sample --init-from --dump-logits", lambda o: [W, "sample", "--init-from", "hf", "--prompt", "ab",
                                                    "--max-new-tokens", "2", "--dump-logits", o],
     ["hf/model.safetensors"]),
    ("worker profile -o", lambda o: [W, "profile", "--model", "hf", "--seq", "32", "--max-micro", "1", "--min-time-ms", "1", "--threads", "1",
                                         "--quiet", "-o", o], ["hf/config.json"]),
    ("profile -o", lambda o: [C, "profile", "--model", "m.yaml", "--devices", "cpu:1t:256M", "--quick", "-o", o],
     ["m.yaml"]),
]
DIR_OUTPUTS = [
    ("data -o", lambda o: [C, "data", "-o", o, "text.txt"], ["text.txt"]),
    ("export -o", lambda o: [W, "export", "--checkpoint", "ck", "-o", o], ["ck/step_00000002.safetensors"]),
    ("train --dump", lambda o: [W, "train"] + TINY + ["--steps", "1", "--data", "d", "--dump", o], ["d/train_000000.bin"]),
    ("train --ckpt-dir", lambda o: [W, "train"] + TINY + ["--steps", "1", "--data", "d", "--ckpt-dir", o],
     ["d/train_000000.bin"]),
    ("run --run-dir", lambda o: [C, "run", "djob.yaml", "--quiet", "--run-dir", o], ["d/train_000000.bin", "djob.yaml"]),
]
# profile-comm needs a peer: only the kinds refused before the rendezvous, with a short timeout
COMM = ("worker profile-comm -o", lambda o: ["env", "RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=9",
                                             "CEPHALO_COMM_TIMEOUT=5", W, "profile-comm", "-o", o])
CHEAP = {"plan -o", "plan --dump-costs", "report -o", "train --data DIR", "train --resume auto", "sample --dump-logits",
         "worker profile -o"}


def cases():
    """(name, setup, argv, expectation, the inputs, what the command may write)"""
    for entry in TRAIN_LOG + OTHERS:
        name, argv, inputs, own = entry if len(entry) == 4 else entry + ([],)
        for inp in inputs:
            for setup, path in spellings(inp):
                yield "%s, output %s (input %s)" % (name, path, inp), setup, argv(path), "refused", inputs, own
        # (the fixture's tokenizer.json is not a real one: with it, only the spellings are tried)
        kinds = [] if "tokenizer" in name else KINDS if name in CHEAP or name.startswith("train --data") else KINDS[:2]
        for kind, path in kinds:
            may = own + ([path + ".target"] if kind == "symlink-dir" else [])
            yield "%s, output a %s" % (name, kind), kind_setup(kind, path), argv(path), "kind:" + kind, inputs, may
        yield "%s, output a new file" % name, [], argv("new.out"), "written", inputs, own + ["new.out"]
    name, argv = COMM
    for kind, path in KINDS:
        if kind in ("dir", "socket", "dangling", "blockdev", "symlink-dir"):
            yield "%s, output a %s" % (name, kind), kind_setup(kind, path), argv(path), "kind:" + kind, [], []
    for name, argv, inputs in DIR_OUTPUTS:
        for inp in inputs:
            d = os.path.dirname(inp) or "."
            yield "%s, output the input's directory (%s)" % (name, inp), [], argv(d), "any", inputs, [d]
            yield "%s, output the input file itself (%s)" % (name, inp), [], argv(inp), "refused", inputs, []
        for kind, path in KINDS:
            yield "%s, output a %s" % (name, kind), kind_setup(kind, path), argv(path), "dirkind:" + kind, inputs, []
        yield "%s, output a new directory" % name, [], argv("newdir"), "written", inputs, ["newdir"]


def make(work, kind, name, target=None):
    """Makes what setup says in the case's directory work (a link's target as the link reads it; a
    hard link's relative to work)."""
    path = os.path.join(work, name)
    if kind == "symlink":
        os.symlink(target, path)
    elif kind == "hardlink":
        os.link(os.path.join(work, target), path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)
        s.close()
    elif kind == "dir":
        os.makedirs(path)
    elif kind == "dangling":
        os.symlink("no-such-file", path)
    elif kind == "chardev":
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    elif kind == "blockdev":
        os.mknod(path, stat.S_IFBLK | 0o600, os.makedev(240, 0))  # no driver: nothing to harm


def under(p, prefixes):
    return any(p == m or p.startswith(m + "/") for m in prefixes)


def judge(expect, rc, out, before, after, inputs, may):
    """'' when the case holds, else why not. Lost: an input changed, or any file that was there
    outside what the command may write (its outputs, its own directories); a refusal before any
    work (exit 2) writes nothing outside its own directories."""
    if rc == "timeout":
        return "crashed: timed out (a wait nobody ends?)"
    if rc < 0 or rc >= 128 or "Sanitizer" in out or "runtime error" in out:
        return "crashed: exit %s %s" % (rc, out.strip().splitlines()[-1:] if out.strip() else "")
    changed = [p for p in before if after.get(p) != before[p] and (under(p, inputs) or not under(p, may))]
    if rc != 0:
        changed += [p for p in after if p not in before and not under(p, may)]
    if changed:
        return "lost: %s changed (exit %s): %s" % (", ".join(sorted(changed)[:4]), rc, out.strip()[-300:])
    if expect == "refused" and rc != 2:
        return "not refused: exit %s" % rc
    if expect in ("kind:dir", "kind:socket", "kind:dangling", "kind:blockdev", "kind:symlink-dir") and rc != 2:
        return "not refused: exit %s" % rc
    if expect == "kind:fifo" and (rc == 0 or "FIFO" not in out):  # known only when opened: after the work
        return "not refused: exit %s" % rc
    return ""


def main():
    if not (os.access(C, os.X_OK) and os.access(W, os.X_OK)):
        sys.exit("probe: build first (make): %s, %s" % (C, W))
    base = tempfile.mkdtemp(prefix="cephalo-probe-")
    try:
        fx = os.path.join(base, "fixture")
        os.makedirs(fx)
        make_fixture(fx)
        counts = {"cases": 0, "refused": 0, "written": 0, "lost": 0, "crashed": 0, "other": 0}
        for i, (name, setup, argv, expect, inputs, may) in enumerate(cases()):
            work = os.path.join(base, "case%d" % i)
            shutil.copytree(fx, work, symlinks=True)
            for item in setup:
                make(work, *item)
            before = snapshot(work)
            rc, out = run(argv, work)
            after = snapshot(work)
            why = judge(expect, rc, out, before, after, inputs, may)
            counts["cases"] += 1
            if why.startswith("lost"):
                counts["lost"] += 1
            elif why.startswith("crashed"):
                counts["crashed"] += 1
            elif why:
                counts["other"] += 1
            else:
                counts["refused" if rc == 2 else "written"] += 1
            if why:
                print("FAIL %s: %s" % (name, why))
            shutil.rmtree(work)
        print("probe: %(cases)d cases, %(refused)d refused, %(written)d written, %(lost)d lost, %(crashed)d crashed, "
              "%(other)d not as expected" % counts)
        return 0 if counts["lost"] == counts["crashed"] == counts["other"] == 0 else 1
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
