"""train_sh_test: a shell test of `mammoth train` runs (single and multi-process).

The script NAME.sh gets the mammoth binary as $1 and test/testing/mpirun.sh as $2, and finds
test/testing/curves.py (the loss-curve checks) and expect_error.sh (a failing command's message)
at "$(dirname "$0")/../testing". Tag one "isa"
(tags = ["isa"]) and tools/test.sh runs it a second time with MAMMOTH_ISA=avx2.
"""

def train_sh_test(name, size = "large", data = [], tags = [], **kwargs):
    native.sh_test(
        name = name,
        size = size,
        srcs = [name + ".sh"],
        args = [
            "$(location //tools:mammoth)",
            "$(location //test/testing:mpirun.sh)",
        ],
        data = [
            "//test/testing:curves.py",
            "//test/testing:expect_error.sh",
            "//test/testing:mpirun.sh",
            "//tools:mammoth",
        ] + data,
        tags = tags,
        **kwargs
    )
