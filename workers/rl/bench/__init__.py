"""Benchmarks of the RL engine (`manage.py bench pipeline|trainer`): Django-free, each `run(**options) -> dict`."""
