"""Print the control API's OpenAPI document: ``python -m llmgw.api.openapi > api/openapi.json``.

The document is generated from the route handlers and checked in; a test fails
when the checked-in copy is stale, so the published contract cannot drift
from the code.
"""

from __future__ import annotations

import json
from typing import Any

from llmgw.catalog.decode import to_builtins


def document() -> dict[str, Any]:
    from llmgw.api.app import create_app
    from llmgw.config import ServerConfig
    from llmgw.control.context import AppContext

    # Generating the schema touches no context; an empty one keeps it I/O-free.
    app = create_app(AppContext(config=ServerConfig(), models=None, backend=None,  # type: ignore[arg-type]
                                store=None))  # type: ignore[arg-type]
    schema: dict[str, Any] = app.openapi_schema.to_schema()
    return schema


def render() -> str:
    # Defaults in the schema are msgspec values (a default Scaling, say);
    # msgspec turns them into JSON, sorted so the checked-in file is stable.
    plain = to_builtins(document(), sort_keys=True)
    return json.dumps(plain, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(render(), end="")
