#!/bin/bash
# `mammoth launch` across two "hosts": two network namespaces joined by a veth pair, each with
# its own address (10.77.0.1, 10.77.0.2) and nothing shared between them but the file system.
# The remote shell is a script that runs the command inside the host's namespace with a clean
# environment (as ssh would: only what mpirun forwards arrives); Open MPI uses TCP only.
#   1. dp 2, one rank per host, matches the one-process loss curve;
#   2. a host that cannot be reached is named before anything starts;
#   3. a busy TCP port on a host is named before anything starts;
#   4. MAMMOTH_* reaches the remote rank (-x) and the failing rank's exit code comes back;
#   5. hostfile, --include/--exclude and --master-addr errors are refused by name; a bare
#      host line, --include and --nproc-per-node 2 (dp 4 over the two hosts) run;
#   6. --elastic: rank 2 (the second host's first) killed; the restart runs on 2 + 1 slots.
# Needs root and `ip netns`; the namespaces are removed however the test ends.
set -euo pipefail
mammoth="$(realpath "$1")"
py="${MAMMOTH_PYTHON:-/usr/bin/python3}"
work="$(mktemp -d /tmp/launch_netns.XXXXXX)"  # short: Open MPI's socket paths live under it
ns_a="m28a$$"
ns_b="m28b$$"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  ip netns del "$ns_a" 2>/dev/null || true
  ip netns del "$ns_b" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
export HOME="$work/home"  # the embedded corpus is tokenized into $HOME/.cache
export TMPDIR="$work"

ip netns add "$ns_a"
ip netns add "$ns_b"
ip link add "va$$" type veth peer name "vb$$"
ip link set "va$$" netns "$ns_a"
ip link set "vb$$" netns "$ns_b"
ip -n "$ns_a" addr add 10.77.0.1/24 dev "va$$"
ip -n "$ns_b" addr add 10.77.0.2/24 dev "vb$$"
for ns in "$ns_a" "$ns_b"; do
  ip -n "$ns" link set lo up
done
ip -n "$ns_a" link set "va$$" up
ip -n "$ns_b" link set "vb$$" up

# The remote shell: "agent HOST COMMAND..." as `ssh HOST COMMAND...` would run it.
cat >"$work/agent" <<AGENT
#!/bin/bash
host="\$1"
shift
case "\$host" in
  10.77.0.1) ns=$ns_a ;;
  10.77.0.2) ns=$ns_b ;;
  *) echo "ssh: connect to host \$host port 22: No route to host" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" env -i PATH=/usr/bin:/bin HOME="$HOME" TMPDIR="$work" /bin/sh -c "\$*"
AGENT
chmod +x "$work/agent"
in_a() { ip netns exec "$ns_a" "$@"; }
launch=(launch --ssh "$work/agent" --btl tcp,self --master-addr 10.77.0.1)
common=(--steps 6 --log-every 1 --eval-every 0 --warmup 2 --threads 1 --seq-len 32)

cat >"$work/hosts" <<'HOSTS'
# two hosts, DeepSpeed's form and Open MPI's
10.77.0.1 slots=1
10.77.0.2 slots=1 max_slots=2   # the second
HOSTS

# 1. dp 2 over TCP between the namespaces, against one process with the same global batch.
"$mammoth" train "${common[@]}" --micro-batch 4 --metrics "$work/np1.jsonl" >"$work/np1.log" 2>&1 ||
  { cat "$work/np1.log"; fail "one process"; }
in_a "$mammoth" "${launch[@]}" --hostfile "$work/hosts" -- train "${common[@]}" --micro-batch 2 \
  --metrics "$work/dp2.jsonl" >"$work/dp2.log" 2>&1 || { cat "$work/dp2.log"; fail "launch dp 2"; }
cat "$work/dp2.log" | grep -v "^\[data\]"
grep -q "^\[launch\] 10.77.0.2: reachable, same binary, ports free; 1 rank" "$work/dp2.log" ||
  fail "no check line for the second host"
grep -q "^\[launch\] 2 ranks on 2 hosts: mpirun .*--mca plm_rsh_agent $work/agent --mca btl tcp,self .*--mca oob_tcp_if_include 10.77.0.0/24 .*-H 10.77.0.1:1,10.77.0.2:1 -np 2 .*$mammoth train" \
  "$work/dp2.log" || fail "the mpirun line is not printed as expected"
grep -q "batch 2 x 32 tokens x 1 accumulation x 2 dp" "$work/dp2.log" || fail "not dp 2"
"$py" - "$work/np1.jsonl" "$work/dp2.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
assert len(a) == len(b) == 6, (len(a), len(b))
for i, (x, y) in enumerate(zip(a, b)):
    assert abs(x - y) <= 1e-5 * abs(x), f"step {i + 1}: one process {x}, dp 2 over TCP {y}"
print("dp 2 across the namespaces matches one process:", b)
PY

# 2. An unreachable host: named, nothing started.
printf '10.77.0.1 slots=1\n10.77.0.3 slots=1\n' >"$work/bad_hosts"
rc=0
in_a "$mammoth" "${launch[@]}" --hostfile "$work/bad_hosts" -- train "${common[@]}" \
  --metrics "$work/never.jsonl" >"$work/unreachable.log" 2>&1 || rc=$?
cat "$work/unreachable.log"
[[ $rc -eq 1 ]] || fail "unreachable host: exit $rc"
grep -q "host 10.77.0.3 (hostfile line 2) is unreachable through '$work/agent' (exit 255: ssh: connect to host 10.77.0.3 port 22: No route to host); nothing was started" \
  "$work/unreachable.log" || fail "the unreachable host is not named"
if grep -q "mpirun" "$work/unreachable.log" || [[ -e "$work/never.jsonl" ]]; then
  fail "something started"
fi

# 3. A busy port on the second host.
ip netns exec "$ns_b" "$py" -c '
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 29510)); s.listen(); open("'"$work/listening"'", "w").close(); time.sleep(300)' &
pids+=($!)
for _ in $(seq 1 100); do [[ -e "$work/listening" ]] && break; sleep 0.1; done
rc=0
in_a "$mammoth" "${launch[@]}" --hostfile "$work/hosts" --port-base 29510 --port-range 1 -- \
  train "${common[@]}" >"$work/busy.log" 2>&1 || rc=$?
cat "$work/busy.log"
[[ $rc -eq 1 ]] || fail "busy port: exit $rc"
grep -q "host 10.77.0.2 (hostfile line 3): 0 of TCP ports 29510..29510 are free, 1 rank needs one each (in use: 29510)" "$work/busy.log" ||
  fail "the busy port is not named"
# Other ports avoid it.
in_a "$mammoth" "${launch[@]}" --hostfile "$work/hosts" --port-base 29600 -- train --steps 1 \
  --eval-every 0 --threads 1 --seq-len 16 --micro-batch 1 >"$work/other_port.log" 2>&1 ||
  { cat "$work/other_port.log"; fail "--port-base 29600"; }

# 4. MAMMOTH_* reaches the rank on the other host (its shell starts with an empty environment),
# and that rank's failure is the job's exit code.
rc=0
MAMMOTH_TEST_NAN_PARAM=h.0.mlp.c_fc.weight MAMMOTH_TEST_NAN_RANK=1 in_a "$mammoth" \
  "${launch[@]}" --hostfile "$work/hosts" --port-base 29600 -- train "${common[@]}" \
  --micro-batch 2 --detect-anomaly >"$work/nan.log" 2>&1 || rc=$?
grep -v "^\[data\]" "$work/nan.log"
[[ $rc -eq 1 ]] || fail "a failing rank: exit $rc, expected 1"
grep -q -- "-x MAMMOTH_TEST_NAN_PARAM -x MAMMOTH_TEST_NAN_RANK" "$work/nan.log" || fail "no -x"
grep -q "\[detect-anomaly\] rank 1 of 2: forward op 'linear' in module 'h.0.mlp.c_fc'" \
  "$work/nan.log" || fail "the remote rank did not get MAMMOTH_TEST_NAN_*"
grep -q "\[launch\] mpirun exited with 1" "$work/nan.log" || fail "no exit line"

# 5. Refusals by name.
refused() {  # refused PATTERN ARGS...
  local pattern="$1" rc=0
  shift
  in_a "$mammoth" launch --ssh "$work/agent" "$@" -- train >"$work/refused.log" 2>&1 || rc=$?
  [[ $rc -eq 1 ]] || { cat "$work/refused.log"; fail "$*: exit $rc"; }
  grep -qF -- "$pattern" "$work/refused.log" || { cat "$work/refused.log"; fail "no '$pattern'"; }
  if grep -q "mpirun" "$work/refused.log"; then fail "$*: started mpirun"; fi
}
printf '10.77.0.1 slots=2 gpus=2\n' >"$work/unknown_key"
refused "unknown_key:1: 'gpus=2' is not slots=N or max_slots=N" --hostfile "$work/unknown_key"
printf '10.77.0.1 slots=1\n10.77.0.1 slots=1\n' >"$work/twice"
refused "twice:2: host 10.77.0.1 is listed twice" --hostfile "$work/twice"
refused "slot lists ('10.77.0.1:0,1') are not supported" --hostfile "$work/hosts" \
  --include 10.77.0.1:0,1
refused "--exclude names host 'node9', which the hostfile does not list" --hostfile \
  "$work/hosts" --exclude node9
refused "--nproc-per-node 3 exceeds host 10.77.0.2 (hostfile line 3)'s max_slots=2" \
  --hostfile "$work/hosts" --nproc-per-node 3
refused "--master-addr 10.9.9.9 is not an address of this machine" --hostfile "$work/hosts" \
  --master-addr 10.9.9.9
# --exclude keeps the rest: one rank on the first host.
in_a "$mammoth" "${launch[@]}" --hostfile "$work/hosts" --exclude 10.77.0.2 --port-base 29600 \
  -- train --steps 1 --eval-every 0 --threads 1 --seq-len 16 --micro-batch 1 \
  >"$work/exclude.log" 2>&1 || { cat "$work/exclude.log"; fail "--exclude"; }
grep -q "^\[launch\] 1 rank on 1 host: .*-H 10.77.0.1:1 -np 1 " "$work/exclude.log" ||
  { cat "$work/exclude.log"; fail "--exclude did not drop the host"; }
# Open MPI's bare host line (one slot) with --include; --nproc-per-node 2 on both: dp 4.
printf '10.77.0.1\n10.77.0.2 slots=1\n' >"$work/bare_hosts"
in_a "$mammoth" "${launch[@]}" --hostfile "$work/bare_hosts" --include 10.77.0.1 \
  --port-base 29600 -- train --steps 1 --eval-every 0 --threads 1 --seq-len 16 --micro-batch 1 \
  >"$work/include.log" 2>&1 || { cat "$work/include.log"; fail "--include"; }
grep -q "^\[launch\] 1 rank on 1 host: .*-H 10.77.0.1:1 -np 1 " "$work/include.log" ||
  { cat "$work/include.log"; fail "--include with a bare host line"; }
in_a "$mammoth" "${launch[@]}" --hostfile "$work/hosts" --nproc-per-node 2 --port-base 29600 \
  -- train --steps 2 --eval-every 0 --threads 1 --seq-len 16 --micro-batch 1 \
  >"$work/four.log" 2>&1 || { cat "$work/four.log"; fail "--nproc-per-node 2"; }
grep -q "^\[launch\] 4 ranks on 2 hosts: .*-H 10.77.0.1:2,10.77.0.2:2 -np 4 " "$work/four.log" ||
  { cat "$work/four.log"; fail "--nproc-per-node 2: not 4 ranks"; }
grep -q "x 4 dp = " "$work/four.log" || { cat "$work/four.log"; fail "--nproc-per-node 2: not dp 4"; }

# 6. --elastic across the hosts: the killed rank's host loses its slot.
MAMMOTH_FAULT=kill@2:3 in_a "$mammoth" "${launch[@]}" --hostfile "$work/hosts" \
  --nproc-per-node 2 --port-base 29600 --elastic --max-restarts 1 -- train --steps 4 \
  --eval-every 0 --threads 1 --seq-len 16 --micro-batch 1 --grad-accum 3 --dp 4 --save-every 2 \
  --save-dir "$work/elastic" --comm-timeout 20 >"$work/elastic.log" 2>&1 ||
  { cat "$work/elastic.log"; fail "--elastic over two hosts"; }
grep -a "^\[launch\] --elastic" "$work/elastic.log"
grep -q "^\[launch\] --elastic restart 1 of 1: rank 2 on 10.77.0.2 exited on signal 9 (Killed); 3 ranks left: dp 3 " \
  "$work/elastic.log" || fail "--elastic: the restart does not name rank 2 on 10.77.0.2"
grep -q "^\[launch\] 3 ranks on 2 hosts: .*-H 10.77.0.1:2,10.77.0.2:1 -np 3 " "$work/elastic.log" ||
  fail "--elastic: the second host did not lose one slot"
echo "PASS"
