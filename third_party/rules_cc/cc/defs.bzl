"""Offline stand-in for @rules_cc//cc:defs.bzl: forwards to Bazel 4's native C++ rules.

Bazel 4.2 names @rules_cc in its own tooling and would download it; Debian's bazel-rules-cc
package is too new for Bazel 4 (it loads use_cpp_toolchain), so these thin wrappers stand in.
"""

def cc_library(**attrs):
    native.cc_library(**attrs)

def cc_binary(**attrs):
    native.cc_binary(**attrs)

def cc_test(**attrs):
    native.cc_test(**attrs)

def cc_import(**attrs):
    native.cc_import(**attrs)

def cc_toolchain(**attrs):
    native.cc_toolchain(**attrs)

def cc_toolchain_suite(**attrs):
    native.cc_toolchain_suite(**attrs)

def cc_proto_library(**attrs):
    native.cc_proto_library(**attrs)

def objc_library(**attrs):
    native.objc_library(**attrs)

def objc_import(**attrs):
    native.objc_import(**attrs)
