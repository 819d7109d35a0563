"""schemathesis hooks (tests/openapi/run loads this module).

A write's `Idempotency-Key` names one request: generated keys repeat (hypothesis shrinks
to the same few strings), and a key sent before with another body is rightly answered 422,
which would hide the rest of what a generated write checks. Each valid key is made unique
before its request is sent; an invalid one (the negative phase's) is sent as generated,
to be refused with 400."""

import re
import uuid

import schemathesis

VALID = re.compile(r"^[ -~]{1,255}$")


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    headers = case.headers or {}
    for name in list(headers):
        if name.lower() == "idempotency-key" and isinstance(headers[name], str) and VALID.match(headers[name]):
            headers[name] = f"schemathesis-{uuid.uuid4()}"
    return None
