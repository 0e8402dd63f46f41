"""gpu_cc_test: a Catch2 test that needs a CUDA device.

Built everywhere (CI compiles and links it; without the CUDA backend it is the stub
//test/kernels/cuda:no_cuda_main.cc that says so and fails), tagged "gpu" so that tools/test.sh
counts it as "needs GPU" instead of running it, and linked statically so that
tools/gpu_check.sh can pack the one binary, device code included, for a lent GPU machine.

cpu_twin names a second test built from the same source with cpu_define set and run in CI: the
source's CPU stand-in for the device (deps plus cpu_deps, Catch2's main, sized cpu_size).
"""

load("//third_party/cuda:cuda.bzl", "if_cuda")

def gpu_cc_test(
        name,
        src,
        deps,
        size = "small",
        cpu_twin = None,
        cpu_define = None,
        cpu_deps = [],
        cpu_size = "medium",
        **kwargs):
    if cpu_twin:
        native.cc_test(
            name = cpu_twin,
            size = cpu_size,
            srcs = [src],
            local_defines = [cpu_define],
            deps = deps + cpu_deps + [
                "//test/testing:catch_main",
                "//third_party/catch2",
            ],
        )
    native.cc_test(
        name = name,
        size = size,
        srcs = if_cuda([src], ["//test/kernels/cuda:no_cuda_main.cc"]),
        linkstatic = True,
        tags = ["gpu"],
        deps = [
            "//base",
            "//third_party/catch2",
        ] + if_cuda(deps + [
            "//kernels/cuda",
            "//memory/cuda",
            "//test/testing:catch_main",
        ]),
        **kwargs
    )
