"""tether's errors: one subclass of tether.Error per status code.

Every error carries `code` (the status code's name, e.g. "stale push") and
`message` (the server's or client's words, naming the tensor, shard or file
concerned).
"""

import builtins


class Error(Exception):
    """A tether request failed; `code` and `message` say how."""

    code = "unknown"

    def __init__(self, message="", code=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self):
        return f"{self.code}: {self.message}"


class InvalidArgumentError(Error, ValueError):
    code = "invalid argument"


class BadFrameError(Error):
    code = "bad frame"


class FrameTooLargeError(Error):
    code = "frame too large"


class VersionMismatchError(Error):
    code = "version mismatch"


class ProtocolError(Error):
    code = "protocol error"


class NotFoundError(Error, LookupError):
    code = "not found"


class ShapeMismatchError(Error, ValueError):
    code = "shape mismatch"


class StalePushError(Error):
    code = "stale push"


class UnavailableError(Error, ConnectionError):
    """A shard could not be reached or was lost (or the client is closed)."""

    code = "unavailable"


class TimeoutError(Error, builtins.TimeoutError):  # noqa: A001
    code = "timeout"


class IoError(Error, OSError):
    code = "i/o error"


class InternalError(Error):
    code = "internal error"


class AuthFailedError(Error, PermissionError):
    code = "authentication failed"


class CancelledError(Error):
    """The run was stopped (POST /api/stop, or the dashboard's Stop run)."""

    code = "cancelled"


class NonFiniteError(Error, ArithmeticError):
    code = "non-finite"


class NotReadyError(Error):
    """A provided tensor's initial values are not written yet."""

    code = "not ready"


class CorruptionError(Error):
    """Stored data (a checkpoint round) is damaged."""

    code = "corruption"


_BY_CODE = {
    cls.code: cls
    for cls in (InvalidArgumentError, BadFrameError, FrameTooLargeError,
                VersionMismatchError, ProtocolError, NotFoundError,
                ShapeMismatchError, StalePushError, UnavailableError,
                TimeoutError, IoError, InternalError, AuthFailedError,
                CancelledError, NonFiniteError, NotReadyError,
                CorruptionError)
}


def from_code(code, message):
    """The exception for status code name `code` (used by the binding)."""
    return _BY_CODE.get(code, Error)(message, code)
