"""The timing harness of the MicroPython benchmarks (MicroPython code): `specmesh bench`'s board script
(host/projection/mpy/boardbench.py, which receives this file's text in place of its import line) and the kernels
benchmark run by the unix VM (tools/bench/_mp_kernels.py)."""

from time import ticks_diff, ticks_us


def best(fn, args=(), reps=5, budget_us=0, batch_us=2000):
    """Microseconds per call of fn(*args): the fastest of at least `reps` timings (and as many more as fit
    in `budget_us`) of n calls each, n doubled until n calls take `batch_us` (0: one call). The work is
    deterministic, so the fastest timing is the one other work disturbed least."""
    fn(*args)
    n = 1
    while batch_us:
        t = ticks_us()
        for _ in range(n):
            fn(*args)
        if ticks_diff(ticks_us(), t) >= batch_us:
            break
        n *= 2
    fastest = 1 << 30
    done = 0
    t0 = ticks_us()
    while done < reps or ticks_diff(ticks_us(), t0) < budget_us:
        t = ticks_us()
        for _ in range(n):
            fn(*args)
        fastest = min(fastest, ticks_diff(ticks_us(), t))
        done += 1
    return fastest / n


def greedy_step(e, at=32):
    """A call that decodes one greedy token at position `at` of engine `e` and rolls it back, after a
    prefix of `at` tokens run here: a token's cost, to time again and again."""
    for i in range(at):
        e.forward([(7 * i + 3) % e.vocab], i)
    one = [1]

    def step():
        e.forward(one, at)
        one[0] = e.argmax(0)
        e.rollback(at)
    return step
