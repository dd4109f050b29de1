"""schemathesis hooks for scripts/schemathesis.sh (named by scripts/schemathesis.toml).

Schema-valid data refused with 400 fails the run (positive_data_acceptance, ST202) on every
route, but for the rules of a send that JSON Schema cannot state (docs/contract.md section
1): such a 400 is dropped only when every problem its `errors` lists is one of RULES, on a
send route; so is a send's 422 `idempotency_key_reused` (an earlier request's doing). Any other 400 to schema-valid data (a rule the document could state and does
not) still fails. Each rule is tested in src/domain/attributes.rs, tests/api/send.rs and
tests/api/batch.rs.
"""

import json

import schemathesis

SEND_ROUTES = {"/v1/queues/{queue}/messages", "/v1/queues/{queue}/messages/batch"}

# (the field a problem is located at, words of its message)
RULES = (
    # Two values at once: a session id and a partition key given together must be equal
    # (Service Bus requires it). JSON Schema compares no value with another's.
    ("Message-Partition-Key", "must equal session_id"),
    ("partition_key", "must equal session_id"),
    # One batch cannot hold one idempotency key twice: `uniqueItems` compares whole
    # entries, not one field of them.
    ("idempotency_key", "repeats entry "),
    # Limits in UTF-8 bytes, which JSON Schema does not count (`maxLength` counts
    # characters): an entry's body (any JSON value, at most SENDGATE_MAX_BODY_BYTES of
    # text, 64 in this run), a property's value (32 KiB) and all properties (64 KiB).
    ("body", " bytes (SENDGATE_MAX_BODY_BYTES)"),
    ("properties", ": a value must be at most "),
    ("properties", "the properties must be at most "),
    ("Message-Properties", ": a value must be at most "),
    ("Message-Properties", "the properties must be at most "),
)




def sent(body, loc):
    """The value the request's body held where `loc` (`["body", "messages", 3, ...]`) points."""
    value = body
    for step in loc[1:]:
        try:
            value = value[step]
        except (IndexError, KeyError, TypeError):
            return None
    return value


def unstateable(error, case):
    """Whether one problem of a 400's `errors` breaks one of RULES, or is a batch entry's
    `time_to_live_s` sent as a whole number written with a fraction (`72.0`): an integer to
    JSON Schema, which cannot tell it from `72`, and not one to the gateway (contract
    section 1: whole seconds)."""
    loc = error.get("loc") or []
    field = loc[-1] if loc else None
    msg = error.get("msg", "")
    if field == "time_to_live_s" and loc[:1] == ["body"]:
        value = sent(case.body, loc)
        return isinstance(value, float) and value.is_integer()
    return any(field == name and words in msg for name, words in RULES)


def reused_key(response):
    """A 422 `idempotency_key_reused`: the key was sent before with another message inside
    the duplicate-detection window (contract section 1). It depends on an earlier request,
    not on this one's data, which no schema can state; the generator reuses keys."""
    try:
        return json.loads(response.content or b"{}").get("code") == "idempotency_key_reused"
    except (ValueError, AttributeError):
        return False


@schemathesis.hook
def filter_failure(context, failure, case, response):
    if failure.code != "ST202" or case.operation.path not in SEND_ROUTES:
        return True
    if response.status_code == 422:
        return not reused_key(response)
    if response.status_code != 400:
        return True
    try:
        errors = json.loads(response.content or b"{}").get("errors") or []
    except ValueError:
        return True
    return not (errors and all(unstateable(error, case) for error in errors))
