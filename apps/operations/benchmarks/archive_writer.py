"""The entry point of `bench archive`'s concurrent writer processes. They are spawned (a fresh interpreter), so
this module imports nothing of Django's models at its top: the child sets Django up first, on the caller's
database, then runs archive.writer_steps."""


def writer_process(database: dict, run_id, attempt: int, steps: int, seed: int, ready, go, results) -> None:
    import django
    from django.conf import settings

    django.setup()
    settings.DATABASES["default"].update(database)  # the caller's (under pytest, the test database)
    from .archive import writer_steps

    writer_steps(run_id, attempt, steps, seed, ready, go, results)
