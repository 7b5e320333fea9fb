"""Status codes and the exception every failed call raises."""

import enum
from typing import Optional, Union

from . import _native


class Status(enum.IntEnum):
    """h2o_status: what went wrong (H2oError.status)."""

    OK = 0
    INVALID_ARGUMENT = 1
    OUT_OF_MEMORY = 2
    IO = 3
    MODEL_FORMAT = 4
    UNSUPPORTED = 5
    CONTEXT_FULL = 6
    BACKEND_UNAVAILABLE = 7
    INVALID_TEXT = 8
    BUFFER_TOO_SMALL = 9
    TOKENIZER = 10
    INTERNAL = 11
    CANCELLED = 12
    STATE_FORMAT = 13
    BACKEND_FAILED = 14


class H2oError(Exception):
    """A call of the library failed: `status` says how (a Status, or the raw code when this binding
    does not know it), `message` says what, as the library wrote it."""

    def __init__(self, status: int, message: str):
        self.status: Union[Status, int]
        try:
            self.status = Status(status)
        except ValueError:
            self.status = status  # a code newer than this binding
        self.message = message
        name = _native.lib.h2o_status_string(status).decode()
        super().__init__(f"{message} ({name})" if message else name)


class Cancelled(H2oError):
    """Session.cancel() stopped the call; what was processed before stays in the session."""


def check(code: int, session: Optional[int] = None) -> None:
    """Raises the call's error when `code` is not H2O_OK; the message is the session's own when
    the call was made on one, else this thread's last error."""
    if code == Status.OK:
        return
    raw = _native.lib.h2o_session_last_error(session) if session else _native.lib.h2o_last_error()
    message = raw.decode("utf-8", errors="replace") if raw else ""
    if not message and session:
        raw = _native.lib.h2o_last_error()
        message = raw.decode("utf-8", errors="replace") if raw else ""
    raise (Cancelled if code == Status.CANCELLED else H2oError)(code, message)
