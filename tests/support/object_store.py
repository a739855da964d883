"""An S3-compatible object store for the tests that need one (mark them `s3`): moto's server (`moto[server]`, pinned
in the dev extra), a real HTTP server speaking the S3 protocol in a process of its own, so that s3fs, botocore's
signing, multipart uploads and every host of a test go over the network exactly as against a bucket.

.ci/run starts one beside PostgreSQL and Redis and names it in STUDIO_TEST_S3_ENDPOINT; elsewhere the first test
that needs it starts one on a free port, for the rest of the session. Each test gets a bucket of its own.
"""

from __future__ import annotations

import atexit
import functools
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.support.servers import free_port

# moto accepts any credentials; these only have to be present for botocore to sign.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "studio-tests", "AWS_SECRET_ACCESS_KEY": "studio-tests",
               "AWS_DEFAULT_REGION": "us-east-1"}


def _answers(endpoint: str) -> bool:
    """Whether an HTTP server answers at `endpoint` (moto's has a /moto-api/ page; another server's 404 is an
    answer too)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


@functools.cache
def s3_endpoint() -> str:
    """The endpoint URL of the session's S3-compatible server; starts one if STUDIO_TEST_S3_ENDPOINT names none.
    RuntimeError says why there is none."""
    named = os.environ.get("STUDIO_TEST_S3_ENDPOINT")
    if named:
        if not _answers(named):
            raise RuntimeError(f"nothing answers as an S3 server at STUDIO_TEST_S3_ENDPOINT={named}")
        return named
    try:
        import moto.server  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(f"moto[server] does not import ({exc}); `make setup` installs the dev extra")
    port = free_port()
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"studio-tests-moto-{port}.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    atexit.register(_stop, process, Path(log.name))
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not _answers(endpoint):
        if process.poll() is not None or time.monotonic() > deadline:
            _stop(process, None)
            raise RuntimeError(f"moto's S3 server did not start on port {port} (its log: {log.name})")
        time.sleep(0.1)
    return endpoint


def _stop(process: subprocess.Popen, log: Path | None) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    if log is not None:
        log.unlink(missing_ok=True)


def s3_environment() -> dict[str, str]:
    """The AWS SDK variables that point botocore (and every child process given them) at the test server."""
    return {**CREDENTIALS, "AWS_ENDPOINT_URL_S3": s3_endpoint()}


def new_bucket() -> str:
    """A fresh, empty bucket on the test server; returns its name."""
    import boto3

    name = f"studio-{uuid.uuid4().hex[:12]}"
    environment = s3_environment()
    client = boto3.client("s3", endpoint_url=environment["AWS_ENDPOINT_URL_S3"],
                          aws_access_key_id=environment["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=environment["AWS_SECRET_ACCESS_KEY"],
                          region_name=environment["AWS_DEFAULT_REGION"])
    client.create_bucket(Bucket=name)
    return name
