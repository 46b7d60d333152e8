"""The host-call overhead figure: `n` calls of the cheapest host function."""

import folio


def main(input):
    n = int(input.get("n", 100000))
    t0 = folio.elapsed_us()
    for _ in range(n):
        folio.elapsed_us()
    t1 = folio.elapsed_us()
    # The loop alone, for subtraction.
    for _ in range(n):
        pass
    t2 = folio.elapsed_us()
    return {"n": n, "calls_us": t1 - t0, "loop_us": t2 - t1, "us_per_call": (t1 - t0 - (t2 - t1)) / n}
