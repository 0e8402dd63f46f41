"""MPI tests: one sh_test per (name, ranks, Catch test case) of a test binary, run by mpirun.sh."""

def mpirun_tests(prefix, binary, cases, size = "medium", tags = []):
    """Declares "<prefix>_<name>_test" for each (name, ranks, case) in `cases`.

    Each runs `binary` (a cc_binary label in this package) under //test/testing:mpirun.sh on
    `ranks` processes, selecting the Catch test case `case` (None: all of them). `tags` go on
    every test ("isa": tools/test.sh runs it again with MAMMOTH_ISA=avx2).
    """
    for name, ranks, case in cases:
        native.sh_test(
            name = "%s_%s_test" % (prefix, name),
            size = size,
            srcs = ["//test/testing:mpirun.sh"],
            args = ["-np", str(ranks), "$(location %s)" % binary] +
                   (["'%s'" % case] if case else []),
            data = [binary],
            tags = tags,
        )
