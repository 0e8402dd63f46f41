"""cuda_library: compiles .cu files with nvcc into a cc_library that C++ targets depend on.

Usage (in any BUILD file):

    load("//third_party/cuda:cuda.bzl", "cuda_library", "if_cuda")

    cuda_library(
        name = "cuda_kernels",
        srcs = ["add.cu"],              # compiled by nvcc, sm_80 and sm_90 (+ sm_90 PTX)
        hdrs = ["add.h"],               # plain C++ headers other targets include
        deps = ["//base"],              # headers of these are visible to nvcc
        copts = ["-lineinfo"],          # extra nvcc flags
    )

    cc_library(
        name = "kernels",
        deps = if_cuda([":cuda_kernels"]),   # [] on a machine without the toolkit
    )

Includes are relative to the workspace root (`#include "kernels/cuda/add.h"`), as for C++.
The objects are PIC and link into cc_binary, cc_test and shared libraries alike; the
generated cc_library also carries cudart. Where CUDA is disabled (no toolkit, or
--//third_party/cuda:enable_cuda=false) the .cu files are not compiled and the library holds
only its headers, so loading never fails on a CPU-only machine.
"""

load("@local_cuda//:defs.bzl", "NVCC", "NVCC_STD")

# Ampere (A100) and Hopper (H100/H200) machine code, plus Hopper PTX that newer GPUs JIT.
CUDA_GENCODE = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

CUDA_DEFAULT_COPTS = [
    "-std=" + NVCC_STD,
    "-O3",
    "--expt-relaxed-constexpr",
    "-Xcompiler",
    "-fPIC",
] + CUDA_GENCODE

def if_cuda(if_true, if_false = []):
    """select() that picks `if_true` when the CUDA backend is built."""
    return select({
        "//third_party/cuda:cuda_enabled": if_true,
        "//conditions:default": if_false,
    })

def _bool_setting_impl(ctx):
    return []

# A boolean command-line build setting (Bazel 4 has no Skylib here, so a minimal one).
bool_setting = rule(
    implementation = _bool_setting_impl,
    build_setting = config.bool(flag = True),
)

def _cuda_objects_impl(ctx):
    if not ctx.files.srcs:
        return [DefaultInfo(files = depset())]
    if not NVCC:
        fail("[cuda_library] %s: CUDA is enabled but no nvcc was found" % ctx.label)

    dep_ctx = cc_common.merge_cc_infos(
        cc_infos = [d[CcInfo] for d in ctx.attr.deps if CcInfo in d],
    ).compilation_context

    args_common = ["-I.", "-I" + ctx.bin_dir.path, "-I" + ctx.genfiles_dir.path]
    args_common += ["-I" + p for p in dep_ctx.includes.to_list()]
    args_common += ["-I" + p for p in dep_ctx.quote_includes.to_list()]
    args_common += ["-isystem=" + p for p in dep_ctx.system_includes.to_list()]
    args_common += ["-D" + d for d in dep_ctx.defines.to_list()]
    args_common += CUDA_DEFAULT_COPTS + ctx.attr.copts

    inputs_common = depset(
        ctx.files.hdrs + ctx.files.textual_hdrs,
        transitive = [dep_ctx.headers],
    )

    objects = []
    for src in ctx.files.srcs:
        stem = src.basename[:-len(src.extension) - 1]
        obj = ctx.actions.declare_file("_objs/%s/%s.o" % (ctx.attr.name, stem))
        ctx.actions.run(
            executable = NVCC,
            arguments = args_common + ["-c", src.path, "-o", obj.path],
            inputs = depset([src], transitive = [inputs_common]),
            outputs = [obj],
            mnemonic = "NvccCompile",
            progress_message = "Compiling CUDA %s" % src.short_path,
            # nvcc runs the host gcc found on PATH.
            use_default_shell_env = True,
        )
        objects.append(obj)
    return [DefaultInfo(files = depset(objects))]

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = True),
        "textual_hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
    },
)

def cuda_library(name, srcs = [], hdrs = [], deps = [], copts = [], textual_hdrs = [], **kwargs):
    """Compiles `srcs` (.cu) with nvcc and wraps the objects in cc_library `name`.

    Args:
      name: the cc_library's name.
      srcs: .cu files.
      hdrs: headers exported to dependents (and visible to nvcc).
      deps: cc_library dependencies; their headers, includes and defines reach nvcc.
      copts: extra nvcc flags, after the defaults (CUDA_DEFAULT_COPTS).
      textual_hdrs: headers included by the .cu files but not compiled on their own (.cuh).
      **kwargs: passed to the cc_library (visibility, tags, testonly, ...).
    """
    _cuda_objects(
        name = name + "_objects",
        srcs = select({
            "//third_party/cuda:cuda_enabled": srcs,
            "//conditions:default": [],
        }),
        hdrs = hdrs,
        textual_hdrs = textual_hdrs,
        deps = deps + ["@local_cuda//:headers"],
        copts = copts,
        visibility = ["//visibility:private"],
        tags = kwargs.get("tags", []),
        testonly = kwargs.get("testonly", False),
    )
    native.cc_library(
        name = name,
        srcs = select({
            "//third_party/cuda:cuda_enabled": [":" + name + "_objects"],
            "//conditions:default": [],
        }),
        hdrs = hdrs,
        textual_hdrs = textual_hdrs,
        deps = deps + select({
            "//third_party/cuda:cuda_enabled": ["@local_cuda//:cudart"],
            "//conditions:default": [],
        }),
        # The objects hold kernels that only the CUDA runtime reaches (by registration).
        alwayslink = True,
        **kwargs
    )
