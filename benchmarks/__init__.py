"""Research harnesses beside the package, run from the repository root:

- ``python -m benchmarks.study``: the studies' tables and pictures, rebuilt from run folders;
- ``python -m benchmarks.operator_benchmark``: the CDR operator's cost per stage against one linear layer;
- ``python -m benchmarks.operator_alternatives``: what was tried for the operator's speed and not kept.

The benchmark users run, ``python -m iris_timm.tools.benchmark``, stays in the package.
"""
