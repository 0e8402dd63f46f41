"""Loss-curve checks for the `mammoth train` shell tests.

Each run of a test writes `--metrics WORK/NAME.jsonl` (one JSON object per logged step); the
checks compare runs step by step against a reference run:

    import curves
    runs = curves.Runs(work)
    runs.learns("single", steps=8)                    # steps 1..8 logged, the loss falls
    runs.matches("tp2", "single", tol=1e-4)           # same steps, relative difference < tol
    runs.matches("resumed", "single", tol=1e-4, steps=[5, 6, 7, 8])  # a resumed run's tail
    runs.matches("tp2", "single", tol=1e-3, key="grad_norm")

Every check prints the largest relative difference it found, so a passing log still shows how
close the runs were.
"""
import json
import os


def losses(metrics):
    """The logged losses of one --metrics file (PATH.jsonl), in step order."""
    name = os.path.basename(metrics)[:-len(".jsonl")]
    column = Runs(os.path.dirname(metrics)).column(name)
    return [column[step] for step in sorted(column)]


class Runs:
    def __init__(self, work):
        self.work = work

    def rows(self, name):
        with open(f"{self.work}/{name}.jsonl") as f:
            return [json.loads(line) for line in f if line.strip()]

    def column(self, name, key="loss"):
        """{step: value of key} of run `name`."""
        return {r["step"]: r[key] for r in self.rows(name)}

    def learns(self, name, steps, drop=0.3):
        """Run `name` logged steps 1..steps and its loss fell by more than `drop`."""
        loss = self.column(name)
        assert sorted(loss) == list(range(1, steps + 1)), (name, sorted(loss))
        assert loss[steps] < loss[1] - drop, (name, loss)
        return loss

    def matches(self, name, reference, tol, key="loss", steps=None):
        """Run `name` logged `steps` (default: the reference's steps), and at each its `key`
        is within relative `tol` of the reference's. Returns the largest difference."""
        got, want = self.column(name, key), self.column(reference, key)
        steps = sorted(want) if steps is None else list(steps)
        assert sorted(got) == steps, (name, "logged steps", sorted(got), "expected", steps)
        missing = [s for s in steps if s not in want]
        assert not missing, (reference, "lacks steps", missing)
        worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in steps)
        print(f"{name} vs {reference}: steps {steps[0]}..{steps[-1]}, "
              f"largest relative {key} difference {worst:.2e}")
        assert worst < tol, (name, key, worst, tol)
        return worst
