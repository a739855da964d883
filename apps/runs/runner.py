"""Placeholder: filled below."""


def start_embedded_runner_if_enabled():
    return None
