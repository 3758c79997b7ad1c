#!/usr/bin/env bash
# test_layers.sh - the include rule (docs/development.md, "Layers"; mk/layers.sh): the tree keeps
# it, and the checker catches each kind of breach in a copy of the tree: an include from a lower
# worker layer to a higher one, one from the operator into the worker, a header included by its
# name alone, and a source file left at worker/'s top.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/cli/lib.sh
san_once # runs none of $BUILD's binaries
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

check "the tree: every include by its path and downwards" 0 "every include goes by its path and downwards" -- mk/layers.sh

# a copy of the sources, with one breach planted at a time
copy() { copy_tree "$T/tree" common planner cli operator worker tests bench fuzz mk; }
plant() { # FILE LINE: appends LINE to FILE in the copy
  copy && printf '%s\n' "$2" >>"$T/tree/$1"
}

plant worker/model/train.c '#include "state/ckpt.h"'
check "model including state is refused, naming the file and the rooms" 1 \
  "worker/model/train.c:" -- mk/layers.sh "$T/tree"
check "... and saying what model may include" 1 "model may not include state" -- mk/layers.sh "$T/tree"

plant worker/formats/data.c '#include "devices/device.h"'
check "formats (a leaf) including devices is refused" 1 "formats may not include devices" -- mk/layers.sh "$T/tree"

plant worker/comm/comm.c '#include "cmd/cmd.h"'
check "comm including cmd is refused" 1 "comm may not include cmd" -- mk/layers.sh "$T/tree"

plant operator/reconcile.c '#include "model/train.h"'
check "the operator including the worker is refused" 1 "operator may not include model" -- mk/layers.sh "$T/tree"

plant operator/client/cache.c '#include "operator/reconcile.h"'
check "the Kubernetes client including the controller is refused" 1 "client may not include operator" -- mk/layers.sh "$T/tree"

plant operator/client/kube.c '#include "planner/plan.h"'
check "... and the client including the planner" 1 "client may not include planner" -- mk/layers.sh "$T/tree"

plant operator/rec_pods.c '#include "operator/client/kube.h"'
check "the controller including the client is allowed" 0 "every include goes by its path" -- mk/layers.sh "$T/tree"

plant cli/run.c '#include "state/ckpt.h"'
check "cli including the worker's state is refused" 1 "cli may not include state" -- mk/layers.sh "$T/tree"

plant common/log.c '#include "planner/model.h"'
check "common including the planner is refused" 1 "common may not include planner" -- mk/layers.sh "$T/tree"

plant worker/cmd/train.c '#include "log.h"'
check "a header by its name alone is refused" 1 "\"log.h\" is included by its name" -- mk/layers.sh "$T/tree"

copy && printf 'int stray;\n' >"$T/tree/worker/stray.c"
check "a source file at worker/'s top is refused" 1 "worker/stray.c: a source file at worker/'s top" -- mk/layers.sh "$T/tree"

plant worker/cmd/train.c '#include "model/train.h"'
check "a downward include is allowed" 0 "every include goes by its path" -- mk/layers.sh "$T/tree"
