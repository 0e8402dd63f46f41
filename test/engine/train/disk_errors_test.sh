#!/bin/bash
# Disk full and permission errors while train writes checkpoints (one process and dp 2's
# sharded form), --metrics, flight dumps, `plan --trace` and --offload nvme swap files: each is
# a non-zero exit whose message names the path and the system's reason, and the checkpoint
# written before stays intact (`mammoth ckpt verify`) and resumes.
# The small disks are tmpfs mounts (ext4 on a loop device for --nvme-dir, which needs
# O_DIRECT) in a private mount namespace; "read-only" is a remount ro, since root ignores
# permission bits. Needs root, unshare and mount (CI and the dev machine run as root); outside
# Bazel's sandbox.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # mkfs.ext4; Bazel's test PATH leaves these out
if [[ -z "${DISK_ERRORS_NS:-}" ]]; then
  exec unshare -m --propagation private env DISK_ERRORS_NS=1 "$0" "$@"
fi
mammoth="$(realpath "$1")"
mpirun_sh="$(realpath "$2")"
work="$(mktemp -d /tmp/disk_errors.XXXXXX)"  # short: Open MPI's socket paths live under TMPDIR
trap 'umount -l "$work"/full "$work"/ro "$work"/loop 2>/dev/null || true; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
export HOME="$work/home"  # the embedded corpus is tokenized into $HOME/.cache
export TMPDIR="$work"
common=(--seq-len 32 --micro-batch 2 --threads 1 --log-every 1 --eval-every 0)
mkdir -p "$work/full" "$work/ro" "$work/loop"
# One checkpoint of gpt2-tiny (model + Adam states) is about 10.3 MiB: 14 MiB holds one.
mount -t tmpfs -o size=14m tmpfs "$work/full"
mount -t tmpfs -o size=1m tmpfs "$work/ro"
mkdir "$work/ro/ck"
mount -o remount,ro "$work/ro"
# expect NAME REGEX LOG: the run failed (checked by the caller) and said REGEX.
expect() {
  grep -Eq "$2" "$3" || { tail -5 "$3"; fail "$1: no message matching '$2'"; }
  echo "ok: $1: $(grep -Eo "$2" "$3" | head -1)"
}
intact() {  # the checkpoint `latest` names is step_00000002, verifies and resumes
  local dir="$1"
  [[ "$(cat "$dir/latest")" == step_00000002 ]] || fail "$dir/latest moved: $(cat "$dir/latest")"
  "$mammoth" ckpt verify "$dir/step_00000002" >"$work/verify.log" 2>&1 ||
    { cat "$work/verify.log"; fail "$dir/step_00000002 does not verify"; }
  rm -rf "$work/copy" && mkdir "$work/copy" && cp -r "$dir/step_00000002" "$dir/latest" "$work/copy/"
  "$mammoth" train "${common[@]}" --steps 3 --save-dir "$work/copy" --resume \
    >"$work/resume.log" 2>&1 || { tail -5 "$work/resume.log"; fail "$dir does not resume"; }
  grep -q "resumed from $work/copy/step_00000002 at step 2" "$work/resume.log" ||
    fail "$dir: not resumed from step 2"
}

# 1. The disk fills during the second checkpoint: one process, then dp 2 (sharded).
"$mammoth" train "${common[@]}" --steps 4 --save-every 2 --save-dir "$work/full/one" \
  >"$work/one.log" 2>&1 && fail "a checkpoint on a full disk succeeded"
expect "checkpoint, disk full" \
  "writing $work/full/one/\.step_00000004\.tmp\.[0-9]+/[a-z]+\.safetensors\.tmp failed: No space left on device" \
  "$work/one.log"
intact "$work/full/one"
rm -rf "$work/full/one"
"$mpirun_sh" -np 2 "$mammoth" train "${common[@]}" --micro-batch 1 --steps 4 --save-every 2 \
  --comm-timeout 10 --save-dir "$work/full/two" >"$work/two.log" 2>&1 &&
  fail "a sharded checkpoint on a full disk succeeded"
expect "sharded checkpoint, disk full" \
  "$work/full/two/\.step_00000004\.tmp\.[0-9]+/[a-z_0-9.]+ failed: No space left on device" \
  "$work/two.log"
intact "$work/full/two"
rm -rf "$work/full/two"

# 2. A read-only --save-dir.
"$mammoth" train "${common[@]}" --steps 2 --save-dir "$work/ro/ck" >"$work/ro.log" 2>&1 &&
  fail "a checkpoint in a read-only directory succeeded"
expect "checkpoint, read-only" "$work/ro/ck[^ ]*: Read-only file system" "$work/ro.log"

# 3. --metrics on a full disk and in a read-only directory.
dd if=/dev/zero of="$work/full/fill" bs=64k 2>/dev/null || true  # ENOSPC ends it
"$mammoth" train "${common[@]}" --steps 2 --metrics "$work/full/m.jsonl" >"$work/m1.log" 2>&1 &&
  fail "--metrics on a full disk succeeded"
expect "metrics, disk full" \
  "writing --metrics $work/full/m.jsonl failed \(disk full\?\): No space left on device" "$work/m1.log"
"$mammoth" train "${common[@]}" --steps 2 --metrics "$work/ro/m.jsonl" >"$work/m2.log" 2>&1 &&
  fail "--metrics in a read-only directory succeeded"
expect "metrics, read-only" "cannot open --metrics $work/ro/m.jsonl: Read-only file system" \
  "$work/m2.log"

# 4. plan --trace on a full disk and in a read-only directory.
plan=(plan --show-schedule --pp 4 --micro-batches 8)
"$mammoth" "${plan[@]}" --trace "$work/full/t.json" >"$work/t1.log" 2>&1 &&
  fail "--trace on a full disk succeeded"
expect "trace, disk full" \
  "writing --trace file '$work/full/t.json' failed \(disk full\?\): No space left on device" \
  "$work/t1.log"
"$mammoth" "${plan[@]}" --trace "$work/ro/t.json" >"$work/t2.log" 2>&1 &&
  fail "--trace in a read-only directory succeeded"
expect "trace, read-only" "cannot create --trace file '$work/ro/t.json': Read-only file system" \
  "$work/t2.log"

# 5. Flight dumps (a rank stalls, the other times out) into a full and a read-only directory:
# the job still fails, naming the stalled rank, and says which dump it could not write.
for where in full ro; do
  MAMMOTH_FAULT=stall@1:2 MAMMOTH_FLIGHT_DIR="$work/$where/flight" \
    "$mpirun_sh" -np 2 "$mammoth" train "${common[@]}" --steps 3 --comm-timeout 2 \
    >"$work/f_$where.log" 2>&1 && fail "a stalled rank's job succeeded"
  expect "flight dump, $where" \
    "\[flight\] could not write $work/$where/flight/rank_0\.json: .*(No space left on device|Read-only file system)" \
    "$work/f_$where.log"
done

# 6. --offload nvme: swap files are reserved (fallocate) before training, so a disk too small
# is named then; a read-only one is named when the swap directory is made.
truncate -s 16M "$work/loop.img"
mkfs.ext4 -q -F "$work/loop.img"
mount -o loop "$work/loop.img" "$work/loop"
mkdir "$work/loop/nv"
dd if=/dev/zero of="$work/loop/fill" bs=1M count=6 2>/dev/null
nvme=(--steps 2 --offload nvme --device-mem 4M --chunk-mb 1)
"$mammoth" train "${common[@]}" "${nvme[@]}" --nvme-dir "$work/loop/nv" >"$work/n1.log" 2>&1 &&
  fail "--nvme-dir on a full disk succeeded"
expect "nvme, disk full" "\[nvme\] .*$work/loop/nv.*" "$work/n1.log"
mount -o remount,ro "$work/loop"
"$mammoth" train "${common[@]}" "${nvme[@]}" --nvme-dir "$work/loop/nv" >"$work/n2.log" 2>&1 &&
  fail "--nvme-dir on a read-only disk succeeded"
expect "nvme, read-only" "\[nvme\] .*$work/loop/nv.*Read-only file system" "$work/n2.log"
echo PASS
