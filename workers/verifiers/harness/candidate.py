# The candidate's side of the harness (see runner.py): loads solution.py and answers calls with plain data;
# codec.py is prepended to it.
# It runs as `python3 -S -E -c <this> READ_FD WRITE_FD` in the candidate's folder; everything it needs is
# imported before that folder goes on sys.path, so a local json.py or sitecustomize.py changes nothing here.
import json
import sys

requests = open(int(sys.argv[1]))
replies = open(int(sys.argv[2]), "w")
sys.argv = ["solution.py"]
sys.path[:0] = [".", "/image/site"]


try:
    import solution
    load_error = None
except BaseException as exc:  # a syntax error or an exit at import: every call reports it
    load_error = f"importing solution.py failed: {type(exc).__name__}: {exc}"

for line in requests:
    request = json.loads(line)
    try:
        if "names" in request:  # the module's own top-level functions and classes, for the tests to call
            own = [] if load_error else [name for name, value in vars(solution).items()
                                         if not name.startswith("_") and callable(value)
                                         and getattr(value, "__module__", None) == "solution"]
            replies.write(json.dumps({"names": own}) + "\n")
            replies.flush()
            continue
        if load_error:
            raise RuntimeError(load_error)
        args = decode(request["args"])
        result = getattr(solution, request["name"])(*args, **decode(request["kwargs"]))
        reply = {"result": encode(result), "args": encode(args)}
    except BaseException as exc:
        reply = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    replies.write(json.dumps(reply) + "\n")
    replies.flush()
