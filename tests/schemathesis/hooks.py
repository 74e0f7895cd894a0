"""Loaded by the API schema test (tests/tests/api_schema.rs) into Schemathesis.

`PUT /v1/datasets/{name}` takes JSONL (`application/x-ndjson`), a media type Schemathesis has no
serializer for. The document describes the body as a string: it goes on the wire as it is. A value
that is not a string (a negative test's) goes as its JSON text, one line.
"""

import json

import schemathesis


@schemathesis.serializer("application/x-ndjson")
def ndjson(ctx, value):
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value).encode("utf-8")
