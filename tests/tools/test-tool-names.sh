#!/usr/bin/env bash
# nbd-fscache: objects named by what they cache, not by hashes (issue
# 45).  Without fscache-key an object's key is a hash of the plugin's
# parameters (they may hold passwords), and the tools showed "#" and 12
# hex digits for each.  Each object now records a label (the plugin,
# the parameters that name the image, the export), shown by ls, stat,
# their --json and the Prometheus labels, and never a secret.
#
#  1. Unkeyed objects over the nbd plugin (a socket, an export name),
#     the file plugin, and curl with a user and password in the URL and
#     a signature in its query (nginx serves it): ls shows each by its
#     plugin and image; ls --json and stat --json carry "label"; the
#     password, the user and the signature appear nowhere in the tools'
#     output nor in the cache directory's files.
#  2. fscache-key=NAME: the key stays the name.
#  3. Prometheus: promtool accepts the output, whose key labels are the
#     names (object= stays the file name).
#  4. tools/grafana/nbd-fscache.json: every metric its panels query is
#     in that output (the miss-ratio curve's too: the objects were read).
#
# Each object is opened twice (a second pass reopens it, the label
# already on disk, which must read back as written).
#
# Truth: the parameters given, the tools' output, grep over the files.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires nbdkit curl --dump-plugin
requires nginx -v
requires test -r "$FILTER"
requires test -x "$TOOL"
requires promtool --version

C="$TMP/cache"
make_random "$TMP/img" $((2 * 1024 * 1024))
mkdir -p "$TMP/www" "$TMP/exports"
cp "$TMP/img" "$TMP/www/img"
cp "$TMP/img" "$TMP/exports/disk-a"
start_nginx "$TMP/www" '$request $status'
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" file dir="$TMP/exports"

# through ARGS...: one copy through the filter in front of ARGS.
through ()
{
  local export=$1; shift
  start_nbdkit -P "$TMP/f.pid" -U "$TMP/f.sock" --filter="$FILTER" "$@" \
    fscache-dir="$C"
  nbdcopy "nbd+unix:///$export?socket=$TMP/f.sock" null: ||
    fail "a copy through: $*"
  stop_nbdkit "$TMP/f.pid"
}
secret="s3cr3t-PaSS" sig="Sig-Zz9"
url="http://fleetuser:$secret@127.0.0.1:$PORT/img?X-Amz-Signature=$sig"
for pass in 1 2; do
  through disk-a nbd socket="$TMP/up.sock" dynamic-export=true
  through "" file "$TMP/img"
  through "" curl "$url"
done
through "" nbd socket="$TMP/up.sock" export=disk-a fscache-key=golden-v7

"$TOOL" --dir "$C" ls > "$TMP/ls.out" || fail "ls"
"$TOOL" --dir "$C" ls --json > "$TMP/ls.json" || fail "ls --json"
"$TOOL" --dir "$C" stat --json > "$TMP/stat.json" || fail "stat --json"
"$TOOL" --dir "$C" stat --prometheus > "$TMP/prom.out" || fail "stat --prometheus"
cat "$TMP/ls.out"

grep -q "^nbd socket=$TMP/up.sock export=disk-a " "$TMP/ls.out" ||
  fail "part 1: ls does not name the nbd export"
grep -q "^file file=$TMP/img " "$TMP/ls.out" ||
  fail "part 1: ls does not name the file"
grep -q "^curl url=http://127.0.0.1:$PORT/img " "$TMP/ls.out" ||
  fail "part 1: ls does not name the URL (without its user, password, query)"
grep -q '^golden-v7[/ ]' "$TMP/ls.out" || fail "part 2: fscache-key is not the name"
if grep -q '^#' "$TMP/ls.out"; then
  fail "part 1: an object is still shown by a hash"
fi
for f in ls.json stat.json; do
  [ "$(grep -c '"label":' "$TMP/$f")" -ge 3 ] ||
    fail "part 1: $f carries no labels"
done
"$PYTHON" -c 'import json, sys; json.load(open(sys.argv[1])); json.load(open(sys.argv[2]))' \
  "$TMP/ls.json" "$TMP/stat.json" || fail "part 1: the JSON does not parse"
for s in "$secret" fleetuser "$sig" X-Amz; do
  if grep -rq -- "$s" "$TMP/ls.out" "$TMP/ls.json" "$TMP/stat.json" \
       "$TMP/prom.out" "$C"; then
    fail "part 1: '$s' (from the curl URL) is in the tools' output or the cache"
  fi
done
echo "part 1: objects named by plugin and image; no secret anywhere"
grep -q "key=\"curl url=http://127.0.0.1:$PORT/img\"" "$TMP/prom.out" ||
  fail "part 3: the Prometheus key label is not the name"
promtool check metrics < "$TMP/prom.out" > "$TMP/promtool.out" 2>&1 ||
  { cat "$TMP/promtool.out"; fail "part 3: promtool rejects the output"; }
echo "part 3: promtool accepts the named labels"

# ---- 4. the Grafana dashboard's queries ----
"$PYTHON" - "$top_srcdir/tools/grafana/nbd-fscache.json" "$TMP/prom.out" <<'PY' ||
import json, re, sys
d = json.load(open(sys.argv[1]))
have = {l.split()[2] for l in open(sys.argv[2]) if l.startswith("# TYPE ")}
want = {m for p in d["panels"] for t in p["targets"]
        for m in re.findall(r"nbd_fscache_[a-z_]+", t["expr"])}
missing = sorted(want - have)
if missing:
    sys.exit("the dashboard queries metrics stat --prometheus lacks: " + " ".join(missing))
print("part 4: the dashboard's %d metrics are all in the output" % len(want))
PY
  fail "part 4: the Grafana dashboard queries a metric that does not exist"

echo "$0: OK"
