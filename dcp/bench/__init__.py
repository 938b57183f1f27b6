"""Benchmarks: the tools behind ``dcp bench ...``, one module per benchmark.

They import the core packages (planner, profiler, runtime, sim, models, loaders); no core module imports
them (``tests/unit/test_architecture.py`` checks it). A new benchmark is a module here with
``add_arguments(parser)`` and ``run(args) -> int``, registered in ``COMMANDS`` of ``dcp/cli.py``.
"""
