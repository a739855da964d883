"""The log context: a JSON log line names the run, attempt and trajectory it was written for, as the studio's
LOGGING configures it with STUDIO_LOG_FORMAT=json; nested contexts add to each other and end with their block."""

import io
import json
import logging
import logging.config
import threading

from django.conf import settings

from workers.telemetry import log_context


def test_json_log_lines_carry_the_ids_of_their_context():
    stream = io.StringIO()
    config = settings.LOGGING
    handler = logging.StreamHandler(stream)
    handler.addFilter(logging.config.DictConfigurator(config).configure_filter(config["filters"]["context"]))
    handler.setFormatter(logging.config.DictConfigurator(config).configure_formatter(config["formatters"]["json"]))
    logger = logging.getLogger("tests.telemetry")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with log_context(run="run-1", attempt=3):
            logger.warning("claimed")
            with log_context(trajectory="traj-7"):
                logger.warning("tool call")
            elsewhere = threading.Thread(target=logger.warning, args=("another thread",))
            elsewhere.start()
            elsewhere.join()
        logger.warning("after")
    finally:
        logger.removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["message"], line.get("run"), line.get("attempt"), line.get("trajectory")) for line in lines] == [
        ("claimed", "run-1", "3", None), ("tool call", "run-1", "3", "traj-7"),
        ("another thread", None, None, None),  # a thread sets its own context (the agent does, per sample)
        ("after", None, None, None)]
    assert lines[0]["level"] == "WARNING" and lines[0]["logger"] == "tests.telemetry"
