"""The HTTP client ``llmgw ctl`` (and the mirror tools) use to talk to the control API.

Errors come back as llmgw exceptions rebuilt from the API's error body, so
the CLI maps them to exit codes in the same one place as local errors, and
the message a person reads is the one the server wrote.
"""

from __future__ import annotations

from typing import Any

import click
import httpx

from llmgw import errors

_BY_STATUS: dict[int, type[errors.LlmgwError]] = {
    400: errors.DefinitionError,
    401: errors.AuthError,
    403: errors.ForbiddenError,
    404: errors.NotFoundError,
    409: errors.RefusedError,
    503: errors.UnavailableError,
}


class ApiClient:
    def __init__(self, url: str, token: str | None, *, timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, *, json: Any = None,
                content: bytes | None = None, content_type: str | None = None) -> Any:
        headers = {"Content-Type": content_type} if content_type else None
        try:
            resp = self._http.request(method, path, json=json, content=content, headers=headers)
        except httpx.TransportError as exc:
            raise errors.UnavailableError(
                f"cannot reach the llmgw API at {self.url}: {exc}; check --url (or LLMGW_URL) "
                "and that `llmgw serve` is running"
            ) from None
        if resp.status_code >= 400:
            raise self._error(resp)
        if resp.status_code == 204 or not resp.content:
            return None
        return resp.json()

    def _error(self, resp: httpx.Response) -> errors.LlmgwError:
        message, field = resp.text.strip() or resp.reason_phrase, None
        try:
            body = resp.json()
            message = body["error"]["message"]
            field = body["error"].get("param")
        except (ValueError, KeyError, TypeError):
            pass
        if resp.status_code == 401:
            message += " (give an admin token with --token or LLMGW_ADMIN_TOKEN)"
        cls = _BY_STATUS.get(resp.status_code, errors.LlmgwError)
        return cls(message, field=field)

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, json: Any = None) -> Any:
        return self.request("POST", path, json=json)

    def put(self, path: str, json: Any = None) -> Any:
        return self.request("PUT", path, json=json)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)


# How a ``ctl`` command receives the client its group built from --url and --token.
pass_client = click.make_pass_decorator(ApiClient)
