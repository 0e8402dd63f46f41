#!/bin/sh
# Placeholder for Bazel's downloaded coverage tools: Mammoth builds offline without them.
echo "remote_coverage_tools: coverage is not supported in Mammoth's offline Bazel setup" >&2
exit 1
