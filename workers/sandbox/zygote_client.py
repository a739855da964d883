"""The host's side of a sandbox that runs the zygote (zygote.py): the protocol, the run, the verdict on how it
ended. Backends subclass it and supply the channel, liveness, destruction and the memory-kill counter."""

import base64
import time

from .protocol import Channel, ChannelClosed, ChannelTimeout
from .types import Execution, ExecutionResult, SandboxImage, Status

START_TIMEOUT = 30.0
HEARTBEAT_TIMEOUT = 3.0  # a sandbox that sends nothing for this long during a run has stopped answering
WALL_GRACE = 2.0  # the zygote enforces the wall limit; the host kills the whole sandbox this much later
CALL_TIMEOUT = 30.0  # a read, write or diff the zygote has not answered by then: the sandbox is stuck


class SandboxError(Exception):
    """The sandbox itself failed (start, reset, protocol): an infrastructure error, never the program's."""


class ZygoteSandbox:
    backend_name = ""
    memory_limited = False  # True where a cgroup bounds memory; otherwise the zygote sets RLIMIT_AS
    id: str
    image: SandboxImage
    channel: Channel
    isolation: list[str]

    @property
    def alive(self) -> bool:
        raise NotImplementedError

    def destroy(self) -> None:
        raise NotImplementedError

    def oom_kills(self) -> int:
        """How many processes the memory limit has killed so far (0 where it cannot be known)."""
        return 0

    def _expect(self, op: str, timeout: float, what: str) -> dict:
        try:
            message = self.channel.receive(timeout)
        except (ChannelClosed, ChannelTimeout) as exc:
            self.destroy()
            raise SandboxError(f"sandbox {what} failed: {type(exc).__name__} {exc}") from None
        if message.get("op") != op:
            self.destroy()
            raise SandboxError(f"sandbox {what} failed: {message.get('reason') or message}")
        return message

    def ping(self, timeout: float = 2.0) -> bool:
        try:
            self.channel.send({"op": "ping"})
            return self.channel.receive(timeout).get("op") == "pong"
        except (ChannelClosed, ChannelTimeout):
            return False

    def reset(self) -> None:
        """Back to the image's clean state, or SandboxError (and the sandbox is destroyed)."""
        try:
            self.channel.send({"op": "reset"})
        except ChannelClosed as exc:
            self.destroy()
            raise SandboxError(f"sandbox reset failed: {exc}") from None
        self._expect("ready", START_TIMEOUT, "reset")

    def call(self, message: dict, timeout: float = CALL_TIMEOUT) -> dict:
        """One of a session's requests other than a run (read_file, write_file, diff): the zygote's answer.
        Raises the OSError or ValueError the sandbox reported for the caller's path, SandboxError when the
        sandbox does not answer (and destroys it)."""
        try:
            self.channel.send(message)
            reply = self.channel.receive(timeout)
        except (ChannelClosed, ChannelTimeout) as exc:
            self.destroy()
            raise SandboxError(f"the sandbox did not answer {message.get('op')}: {type(exc).__name__} {exc}") \
                from None
        if reply.get("op") != "error":
            return reply
        error, reason = reply.get("error"), reply.get("reason", "")
        if error == "sandbox":
            self.destroy()
            raise SandboxError(reason)
        raise {"not_found": FileNotFoundError, "is_a_directory": IsADirectoryError, "permission": PermissionError,
               "invalid": ValueError}.get(error, OSError)(reason)

    def run(self, execution: Execution) -> ExecutionResult:
        limits = execution.limits or self.image.limits
        files = dict(execution.files)
        if execution.program is not None:
            files["main.py"] = execution.program.encode()
        request = {
            "op": "run", "command": execution.command, "shell": execution.shell, "collect": execution.collect,
            "cwd": execution.cwd, "env": execution.env, "keep_background": execution.keep_background,
            "prefork": execution.prefork,
            "files": {name: base64.b64encode(content).decode() for name, content in files.items()},
            "stdin": base64.b64encode(execution.stdin).decode(),
            "limits": {"cpu_seconds": limits.cpu_seconds, "wall_seconds": limits.wall_seconds,
                       "max_processes": limits.max_processes, "max_file_bytes": limits.max_file_mb * 1024 * 1024,
                       "open_files": limits.open_files, "output_bytes": limits.output_bytes,
                       "output_hard_bytes": limits.output_hard_bytes,
                       "address_space_bytes": 0 if self.memory_limited else limits.memory_mb * 4 * 1024 * 1024},
        }
        oom_before = self.oom_kills()
        started = time.monotonic()
        try:
            self.channel.send(request)
            message = self._await_result(started + limits.wall_seconds + WALL_GRACE)
        except ChannelClosed:
            self.destroy()
            return self._result(Status.KILLED, started, "the program killed its own sandbox")
        except ChannelTimeout as timeout:
            self.destroy()
            if str(timeout) == "wall":
                return self._result(Status.TIMEOUT, started, f"ran past the {limits.wall_seconds:g} s wall-clock "
                                                             "limit and was stopped from outside")
            if str(timeout) == "silent":  # not even the request was acknowledged: the program never ran
                return self._result(Status.INFRA_ERROR, started, "the sandbox did not answer the run request")
            return self._result(Status.KILLED, started, "the sandbox stopped answering (no heartbeat)")
        result = ExecutionResult(
            status=Status(message["status"]), exit_code=message.get("exit_code"), signal=message.get("signal"),
            stdout=base64.b64decode(message.get("stdout", "")), stderr=base64.b64decode(message.get("stderr", "")),
            stdout_truncated=message.get("stdout_truncated", False),
            stderr_truncated=message.get("stderr_truncated", False),
            wall_seconds=message.get("wall_seconds", time.monotonic() - started),
            cpu_seconds=message.get("cpu_seconds", 0.0), peak_memory_mb=message.get("peak_memory_mb", 0.0),
            files={name: base64.b64decode(data) for name, data in message.get("files", {}).items()},
            missing_files=message.get("missing_files", []), reason=message.get("reason", ""),
            isolation=self.isolation, backend=self.backend_name, sandbox_id=self.id, cwd=message.get("cwd", ""),
        )
        if self.oom_kills() > oom_before and result.status != Status.OK:
            result.status = Status.KILLED
            result.reason = f"ran out of its {limits.memory_mb} MB of memory"
        return result

    def _await_result(self, hard_deadline: float) -> dict:
        """The result; ChannelTimeout "wall" (past the hard deadline), "silent" (nothing at all came back: the
        sandbox never acknowledged the request) or "heartbeat" (it went quiet while the program ran)."""
        heard = False
        while True:
            remaining = hard_deadline - time.monotonic()
            if remaining <= 0:
                raise ChannelTimeout("wall")
            try:
                message = self.channel.receive(min(HEARTBEAT_TIMEOUT, remaining))
            except ChannelTimeout:
                if time.monotonic() >= hard_deadline:
                    raise ChannelTimeout("wall") from None
                raise ChannelTimeout("heartbeat" if heard else "silent") from None
            if message.get("op") != "heartbeat":
                return message
            heard = True

    def _result(self, status: Status, started: float, reason: str) -> ExecutionResult:
        return ExecutionResult(status=status, reason=reason, wall_seconds=time.monotonic() - started,
                               isolation=self.isolation, backend=self.backend_name, sandbox_id=self.id)

