"""The one exception tree. Each class knows its HTTP status and CLI exit code.

    LlmgwError                      500 / exit 1
    ├── DefinitionError             400 / exit 1   a model or config is wrong; names the field
    │   ├── ConfigError             400 / exit 2   server.yaml cannot be used; fix the file
    │   └── PlacementError          400 / exit 1   no node of the fleet could ever run a profile
    ├── RefusedError                409 / exit 1   the change is valid but not allowed here
    ├── NotFoundError               404 / exit 1
    ├── AuthError                   401 / exit 1
    ├── ForbiddenError              403 / exit 1
    ├── RateLimitedError            429 / exit 1
    ├── BackendPermissionError      502 / exit 1   the scheduler refuses llmgw's own token
    └── UnavailableError            503 / exit 1   a dependency is down; retry later
        ├── StoreUnavailableError   503            the database cannot be reached
        └── BackendUnavailableError 503            Nomad (or the local scheduler) cannot be reached

The API maps these to responses in exactly one place (``llmgw.api.errors``), the
CLI to exit codes in exactly one place (``llmgw.cli.output``). A message says
what went wrong, where, and what to do.
"""

from __future__ import annotations


class LlmgwError(Exception):
    status: int = 500
    exit_code: int = 1
    kind: str = "internal_error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def __str__(self) -> str:
        return self.message


class DefinitionError(LlmgwError):
    """A model definition or request body is wrong; ``field`` is its key path."""

    status = 400
    kind = "invalid_definition"


class ConfigError(DefinitionError):
    """The server's configuration cannot be used; raised before anything binds."""

    exit_code = 2
    kind = "invalid_config"


class PlacementError(DefinitionError):
    """No node in the fleet could ever satisfy a profile (not merely: none is free now)."""

    kind = "unplaceable"


class RefusedError(LlmgwError):
    status = 409
    kind = "refused"


class NotFoundError(LlmgwError):
    status = 404
    kind = "not_found"


class AuthError(LlmgwError):
    status = 401
    kind = "unauthorized"


class ForbiddenError(LlmgwError):
    status = 403
    kind = "forbidden"


class RateLimitedError(LlmgwError):
    status = 429
    kind = "rate_limited"

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BackendPermissionError(LlmgwError):
    """The scheduler answered and refused llmgw's own credentials an action: its ACL
    policy lacks a capability. Not the caller's fault (so not 403), and not an outage (so
    not 503): retrying with back-off changes nothing until an operator grants it.
    ``needs`` names what the refused call requires, one item per capability and target."""

    status = 502
    kind = "backend_permission"

    def __init__(self, message: str, *, needs: tuple[str, ...] = (),
                 field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.needs = needs


class UnavailableError(LlmgwError):
    status = 503
    kind = "unavailable"


class StoreUnavailableError(UnavailableError):
    kind = "store_unavailable"


class BackendUnavailableError(UnavailableError):
    kind = "backend_unavailable"
