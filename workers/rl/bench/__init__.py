"""The RL engine run whole from the command line, without the studio: the benchmarks (`manage.py bench engine|
pipeline|serve|trainer`, Django-free, each `run(**options) -> dict`) and the data-parallel demo torchrun starts
(distributed_demo.py)."""
