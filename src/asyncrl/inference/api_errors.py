"""The server's errors as OpenAI clients expect them: `{"error": {message, type, code}}`."""

from __future__ import annotations

from fastapi.responses import JSONResponse


class APIError(Exception):
    """A request the server refuses: its HTTP status, a message a user can act on, a type."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def error_response(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(
        status_code=status, content={"error": {"message": message, "type": kind, "code": status}}
    )
