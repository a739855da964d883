"""Verifies a repository task inside a fresh sandbox (standard library only; runs under the sandbox's python3).

stdin:  {"nonce", "patch", "test_patch", "test_files", "timeout", "plugin"}; the repository's base snapshot
        arrives as the file repo.tar.gz in the working directory.
stdout: one line "<nonce> <json report>", the report {"stage", "detail", "results"}: stage is where it ended
        (setup | patch | test_patch | timeout | tests), results maps each pytest node id that ran to its
        outcome (passed | failed | error | skipped | xfailed | xpassed).

Order: base snapshot, then the model's diff (test files were taken out of it on the host), then the hidden test
patch, then pytest on the test files, with PYTEST_DISABLE_PLUGIN_AUTOLOAD and our own report plugin. The code
under test runs in pytest's process, as in SWE-bench's harness; the report says only what pytest itself said,
test by test, and a test that never reported (a syntax error, an exit during collection) is simply absent. Code
that rewrites pytest's own objects inside that process could still forge outcomes (as in SWE-bench), and so could
a process it starts that outlives pytest and rewrites the results file (STUDIO_REPORT, in pytest's environment)
before this harness reads it: these defences hold against the diff's files (tests, conftest.py, plugins, .pth),
not against code under test that sets out to forge pytest's report.
"""

import ctypes
import json
import os
import secrets
import signal
import subprocess
import sys
import tarfile

# Non-dumpable before the request (and its nonce) is read: no other process of the sandbox's uid, the code under
# test included, can read this one's memory or reach its stdout through /proc.
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
REQUEST = json.loads(sys.stdin.read())
WORKDIR = os.getcwd()
REPO = os.path.join(WORKDIR, "repo")
HARNESS = "/tmp/studio-harness"


def report(stage: str, detail: str = "", results: dict | None = None) -> None:
    print(REQUEST["nonce"] + " " + json.dumps({"stage": stage, "detail": detail[-4000:], "results": results or {}}))
    sys.stdout.flush()
    sys.exit(0)


def inside(root: str, path: str) -> bool:
    full = os.path.normpath(os.path.join(root, path))
    return full == root or full.startswith(root + "/")


def unpack(archive: str, target: str) -> None:
    """The snapshot's regular files, directories and symlinks that stay inside `target`; nothing else."""
    with tarfile.open(archive, "r:gz") as tar:
        members = []
        for member in tar.getmembers():
            if member.name.startswith("/") or not inside(target, member.name):
                continue
            if member.issym() and not inside(target, os.path.join(os.path.dirname(member.name), member.linkname)):
                continue
            if member.isfile() or member.isdir() or member.issym():
                member.mode = (member.mode | 0o600) & 0o777
                members.append(member)
        tar.extractall(target, members=members)
    os.unlink(archive)


def apply(patch: str, stage: str) -> None:
    if not patch.strip():
        return
    done = subprocess.run(["git", "apply", "--whitespace=nowarn", "--unsafe-paths", "-"], cwd=REPO,
                          input=patch.encode(), capture_output=True, timeout=120)
    if done.returncode != 0:
        report(stage, done.stderr.decode("utf-8", "replace"))


def main() -> None:
    try:
        unpack(os.path.join(WORKDIR, "repo.tar.gz"), REPO)
    except (OSError, tarfile.TarError) as exc:
        report("setup", f"the repository snapshot could not be unpacked: {exc}")
    apply(REQUEST["patch"], "patch")
    apply(REQUEST["test_patch"], "test_patch")
    os.makedirs(HARNESS, exist_ok=True)
    with open(os.path.join(HARNESS, "studio_report.py"), "w") as handle:
        handle.write(REQUEST["plugin"])
    results_path = os.path.join(HARNESS, secrets.token_hex(16) + ".json")  # not the nonce: pytest's env shows it
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST")}
    env.update({"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "STUDIO_REPORT": results_path,
                "PYTHONPATH": HARNESS + ":" + os.environ.get("PYTHONPATH", "")})
    command = [sys.executable, "-m", "pytest", "-p", "studio_report", "-p", "no:cacheprovider", "-q", "--tb=short",
               "-o", "addopts=", "--rootdir", REPO, *REQUEST["test_files"]]
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=REQUEST["timeout"])
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        report("timeout", f"the tests ran past {REQUEST['timeout']} s\n" + output.decode("utf-8", "replace"))
    try:
        with open(results_path) as handle:
            results = json.load(handle)
    except (OSError, ValueError):
        results = {}
    if not isinstance(results, dict):
        results = {}
    report("tests", output.decode("utf-8", "replace"), results)


main()
