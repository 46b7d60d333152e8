// The component's entry point (written by the build): runs the program's
// `main(input)` and turns what it throws into the run's error.
import * as program from "./program.js";
import { emit, FolioError } from "./folio.js";

export function run(input) {
  let data = null;
  if (input.trim() !== "") {
    try {
      data = JSON.parse(input);
    } catch (e) {
      // A thrown string is the export's `err`; a thrown Error would trap.
      throw `the input is not JSON: ${e.message}`;
    }
  }
  const main = program.main ?? program.default;
  if (typeof main !== "function") throw "the program exports no main(input) function";
  let out;
  try {
    out = main(data);
  } catch (e) {
    if (e instanceof FolioError) throw e.message;
    if (e instanceof Error) throw `${e.name}: ${e.message}`;
    throw String(e);
  }
  if (out !== undefined && out !== null) emit(out);
}
