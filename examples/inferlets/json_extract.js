// JSON extraction under a schema, in JavaScript (the same program as
// json_extract.py): the reply is generated under the schema's grammar, so it always
// parses and has the schema's shape. Input: {"text": str, "schema": object
// (optional)}.

import { Context } from "./folio.js";

const DEFAULT_SCHEMA = {
  type: "object",
  properties: {
    name: { type: "string" },
    age: { type: "integer" },
    city: { type: "string" },
  },
  required: ["name", "age", "city"],
  additionalProperties: false,
};

export function main(input) {
  const schema = input.schema ?? DEFAULT_SCHEMA;
  const ctx = new Context({ system: "Extract the facts as JSON." });
  ctx.user(`Text: ${input.text}\nGive the person's name, age and city as JSON.`);
  const g = ctx.reply({ maxTokens: 96, jsonSchema: schema });
  return { extracted: JSON.parse(g.text), finish: g.finish };
}
