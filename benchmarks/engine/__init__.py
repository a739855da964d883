"""The engine's benchmarks, Django-free like the engine (a contract of `make lint`): `manage.py bench` hands them
what they need from the studio's wiring (a sandbox backend, the models directory), and gpu_check.py runs on a GPU
machine where Django is not installed."""
