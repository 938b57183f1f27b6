"""Benchmarks that print figures (``dcp bench ...``); each module provides add_arguments(parser) and run(args)."""
