"""The programs the software-engineering tools run inside a session's sandbox (standard library only, run by the
sandbox's python3 with their arguments as JSON on stdin, in the workspace's root: the repository). Kept apart from
swe_tools.py: this is sandbox-side source, read as text, never imported by the host.

The editor keeps its undo history in /tmp/.studio-editor, outside the workspace (so never in the diff, and never
in what verification replays).
"""

BASH = r'''
import json, os, signal, subprocess, sys, tempfile
request = json.load(sys.stdin)
limit = request["limit"]
# `python` is the sandbox's python3, as in the field's images.
BIN = "/tmp/.studio-bin"
if not os.path.lexists(BIN + "/python"):
    os.makedirs(BIN, exist_ok=True)
    os.symlink(sys.executable, BIN + "/python")
env = dict(os.environ, PATH=BIN + ":" + os.environ.get("PATH", "/usr/bin:/bin"))
with tempfile.TemporaryFile() as output:
    process = subprocess.Popen(["bash", "-c", request["command"]], stdin=subprocess.DEVNULL,
                               stdout=output, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        code = process.wait(timeout=request["timeout"])
        note = ""
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        code, note = 124, "\n[the command ran past its timeout of %g s and was killed]" % request["timeout"]
    size = output.seek(0, 2)
    output.seek(0)
    if size <= limit:
        text = output.read().decode("utf-8", "replace")
    else:
        half = limit // 2
        head = output.read(half).decode("utf-8", "replace")
        output.seek(size - half)
        tail = output.read().decode("utf-8", "replace")
        text = head + "\n[... %d characters of output elided; the first and last %d are shown ...]\n" % (
            size - 2 * half, half) + tail
sys.stdout.write(text + note)
sys.exit(code)
'''

EDITOR = r'''
import base64, hashlib, json, os, sys
REPO = os.getcwd()
HISTORY = "/tmp/.studio-editor"
SNIPPET = 4
request = json.load(sys.stdin)

def fail(message):
    sys.stdout.write(message)
    sys.exit(1)

def resolve(path):
    full = os.path.normpath(path if path.startswith("/") else os.path.join(REPO, path))
    if full != REPO and not full.startswith(REPO + "/"):
        fail("%s is outside the repository (%s); give a path inside it" % (path, REPO))
    return full

def numbered(lines, first):
    return "\n".join("%6d\t%s" % (first + i, line) for i, line in enumerate(lines))

def history_file(path):
    return os.path.join(HISTORY, hashlib.sha256(path.encode()).hexdigest() + ".json")

def remember(path, content):
    os.makedirs(HISTORY, exist_ok=True)
    stack = load(path)
    stack.append(None if content is None else base64.b64encode(content.encode()).decode())
    with open(history_file(path), "w") as handle:
        json.dump(stack[-20:], handle)

def load(path):
    try:
        with open(history_file(path)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return []

def read(path):
    if not os.path.isfile(path):
        fail("%s does not exist or is not a file" % path)
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()

def write(path, content):
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(content)

def snippet(path, content, line):
    lines = content.split("\n")
    first = max(1, line - SNIPPET)
    return "%s, lines %d-%d:\n%s" % (path, first, min(len(lines), line + SNIPPET),
                                     numbered(lines[first - 1:line + SNIPPET], first))

command, path = request["command"], resolve(request["path"])
if command == "view":
    if os.path.isdir(path):
        found = []
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            depth = root[len(path):].count("/")
            if depth >= 2:
                dirs[:] = []
            found += [os.path.join(root, name) for name in sorted(files) if not name.startswith(".")]
        sys.stdout.write("Files in %s, two levels deep:\n%s" % (path, "\n".join(found)))
        sys.exit(0)
    lines = read(path).split("\n")
    view_range = request.get("view_range")
    first, last = 1, len(lines)
    if view_range:
        first, last = view_range
        if last == -1:
            last = len(lines)
        if not 1 <= first <= len(lines) or last < first:
            fail("view_range %s does not fit the file's %d lines" % (view_range, len(lines)))
    sys.stdout.write(numbered(lines[first - 1:last], first))
elif command == "create":
    if os.path.exists(path):
        fail("%s already exists; create does not overwrite files (use str_replace)" % path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    remember(path, None)
    write(path, request["file_text"])
    sys.stdout.write("Created %s" % path)
elif command == "str_replace":
    content, old, new = read(path), request["old_str"], request.get("new_str", "")
    count = content.count(old) if old else 0
    if count == 0:
        fail("No replacement was made: old_str does not appear verbatim in %s" % path)
    if count > 1:
        lines = [n + 1 for n, line in enumerate(content.split("\n")) if old.split("\n")[0] in line]
        fail("No replacement was made: old_str appears %d times in %s (lines %s); make it unique" % (
            count, path, lines))
    remember(path, content)
    line = content[:content.index(old)].count("\n") + 1
    content = content.replace(old, new)
    write(path, content)
    sys.stdout.write("Edited " + snippet(path, content, line))
elif command == "insert":
    content, line = read(path), request["insert_line"]
    lines = content.split("\n")
    if not isinstance(line, int) or not 0 <= line <= len(lines):
        fail("insert_line must be between 0 and %d" % len(lines))
    remember(path, content)
    content = "\n".join(lines[:line] + request["new_str"].split("\n") + lines[line:])
    write(path, content)
    sys.stdout.write("Inserted into " + snippet(path, content, line + 1))
elif command == "undo_edit":
    stack = load(path)
    if not stack:
        fail("No edit of %s to undo" % path)
    previous = stack.pop()
    with open(history_file(path), "w") as handle:
        json.dump(stack, handle)
    if previous is None:
        os.unlink(path)
        sys.stdout.write("Undid the creation of %s" % path)
    else:
        write(path, base64.b64decode(previous).decode())
        sys.stdout.write("Undid the last edit of %s" % path)
else:
    fail("unknown command %r" % command)
'''

# run_tests: pytest on the workspace's test files, its report cut to what a small model can read: each failing
# test's summary line (the test's id and its assertion's message: the call, what it returned, what was expected),
# a few at most, the error lines of a module that could not be collected, and pytest's closing line. The exit code
# is pytest's (0 all passed, 1 some failed, 2 collection interrupted, 5 no test).
RUN_TESTS = r'''
import json, os, re, signal, subprocess, sys
request = json.load(sys.stdin)
shown, width = request["failures_shown"], request["line_chars"]

def is_test(relative):
    parts = relative.split("/")
    return relative.endswith(".py") and (any(p in ("tests", "test") for p in parts[:-1])
                                        or parts[-1].startswith("test_") or parts[-1].endswith("_test.py"))

found = []
for root, dirs, files in os.walk("."):
    dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
    found += [os.path.join(root, name)[2:] for name in sorted(files)]
tests = [path for path in found if is_test(path) and path.split("/")[-1] not in ("__init__.py", "conftest.py")]
if not tests:
    sys.stdout.write("no test files (test_*.py, *_test.py, tests/) in the repository")
    sys.exit(5)
# No plugins of the environment's and no cache or bytecode written into the workspace (its diff is the fix); a wide
# terminal so that pytest does not cut the assertion messages in its summary (this program cuts them instead).
env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONDONTWRITEBYTECODE="1", COLUMNS="1000")
command = [sys.executable, "-m", "pytest", "-q", "--tb=short", "-rfE", "-p", "no:cacheprovider", "-p", "no:warnings",
           *tests]
process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           start_new_session=True, env=env)
try:
    output, _ = process.communicate(timeout=request["timeout"])
except subprocess.TimeoutExpired:
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate()
    sys.stdout.write("the tests ran past %g s and were stopped (an endless loop?)" % request["timeout"])
    sys.exit(124)
lines = output.decode("utf-8", "replace").splitlines()

def cut(line):
    return line if len(line) <= width else line[:width] + "..."

failures = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
section, errors = "", []
for line in lines:
    header = re.match(r"^=+ (.*?) =+$", line)
    if header:
        section = header.group(1)
    elif section == "ERRORS" and line.startswith("E "):
        errors.append(line)
closing = [line for line in lines if line.strip() and not line.startswith(("=", "!"))][-1:] if lines else []
closing = [re.sub(r" in [0-9.]+s( \([0-9:]+\))?$", "", line) for line in closing]
report = [cut(line) for line in failures[:shown]]
if len(failures) > shown:
    report.append("(and %d more)" % (len(failures) - shown))
report += [cut(line) for line in errors[:6]]
sys.stdout.write("\n".join(report + closing) or "pytest said nothing")
sys.exit(process.returncode)
'''
