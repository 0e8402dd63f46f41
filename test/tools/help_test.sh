#!/bin/bash
# `mammoth <command> --help` lists the command's flags with their defaults (Abseil's own --help
# would list only the flags of the file holding main(), i.e. none), and `mammoth --help` lists
# the commands.
set -uo pipefail
mammoth="$1"
fail() { echo "FAIL: $*" >&2; exit 1; }

"$mammoth" train --help >"$TEST_TMPDIR/train.txt" 2>&1
grep -q "Flags from tools/cmd_train.cc" "$TEST_TMPDIR/train.txt" || fail "train --help: no train flags"
for flag in --steps --device --offload --dp --zero; do
  grep -q -- "    $flag (" "$TEST_TMPDIR/train.txt" || fail "train --help does not list $flag"
done
grep -q "default: 300" "$TEST_TMPDIR/train.txt" || fail "train --help shows no defaults"
"$mammoth" analyze --help >"$TEST_TMPDIR/analyze.txt" 2>&1
grep -q -- "    --context (" "$TEST_TMPDIR/analyze.txt" || fail "analyze --help does not list --context"
"$mammoth" --help >"$TEST_TMPDIR/usage.txt" 2>&1 || fail "mammoth --help exited non-zero"
for command in train eval generate analyze bench plan ckpt; do
  grep -q "^  $command " "$TEST_TMPDIR/usage.txt" || fail "mammoth --help does not list $command"
done
echo ok
