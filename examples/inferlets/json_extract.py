"""JSON extraction under a schema: the reply is generated under the schema's
grammar, so it always parses and has the schema's shape. Input: {"text": str,
"schema": object (optional)}."""

import json

import folio

DEFAULT_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


def main(input):
    schema = input.get("schema", DEFAULT_SCHEMA)
    ctx = folio.Context(system="Extract the facts as JSON.")
    ctx.user("Text: " + input["text"] + "\nGive the person's name, age and city as JSON.")
    g = ctx.reply(max_tokens=96, json_schema=schema)
    return {"extracted": json.loads(g.text), "finish": g.finish}
