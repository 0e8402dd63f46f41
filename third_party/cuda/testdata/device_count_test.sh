#!/bin/bash
# Runs device_count (a cc_binary linked to a cuda_library) and checks its answer: on a machine
# without a GPU cudaGetDeviceCount must report "no CUDA device"; with one, the kernel must run.
# With --require-device (the "gpu"-tagged variant) only a working device passes.
set -euo pipefail
require_device=0
[[ "${1:-}" == "--require-device" ]] && require_device=1
out=$(third_party/cuda/testdata/device_count)
echo "$out"
case "$out" in
  "no CUDA device ("*")" | "CUDA disabled (no toolkit)")
    if [[ $require_device -eq 1 ]]; then
      echo "a CUDA device is required" >&2
      exit 1
    fi
    ;;
  "CUDA devices: "[1-9]*", kernel: 42") ;;
  *)
    echo "unexpected output: $out" >&2
    exit 1
    ;;
esac
# The binary must carry device code for sm_80 and sm_90 when CUDA is on. (cuobjdump is not
# always installed; the fatbin section and its architecture names are visible with binutils.)
if [[ "$out" != "CUDA disabled"* ]]; then
  bin=third_party/cuda/testdata/device_count
  sections=$(readelf -S "$bin")
  if [[ "$sections" != *".nv_fatbin"* ]]; then
    echo "no .nv_fatbin section in $bin" >&2
    exit 1
  fi
  archs=$(strings "$bin" | grep -o 'sm_[0-9]*' | sort -u | tr '\n' ' ')
  for sm in sm_80 sm_90; do
    if [[ " $archs" != *" $sm "* ]]; then
      echo "no $sm device code in $bin (found: $archs)" >&2
      exit 1
    fi
  done
  echo "device code: $archs"
fi
