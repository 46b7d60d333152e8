"""The component's entry point (written by the build): runs the program's
``main(input)`` and turns what it raises into the run's error."""

import json

import folio
import program
import wit_world
from componentize_py_types import Err


class WitWorld(wit_world.WitWorld):
    def run(self, input: str) -> None:
        try:
            data = json.loads(input) if input.strip() else None
        except ValueError as e:
            raise Err(f"the input is not JSON: {e}")
        try:
            out = program.main(data)
        except folio.FolioError as e:
            raise Err(str(e))
        except Exception as e:
            raise Err(f"{type(e).__name__}: {e}")
        if out is not None:
            folio.emit(out)
