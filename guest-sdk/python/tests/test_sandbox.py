"""The standard library as a lambda sees it (`lambdastore.sandbox`): under
the mock, for the length of a workflow, as on the server (where
tests/tests/limits.rs runs the same through a component), and put back
after it."""

import os
import random
import secrets
import time
import uuid

import pytest

from lambdastore import App, Cell, lambda_object, readonly, sandbox
from lambdastore.mock import MockHost


@lambda_object
class Probe:
    calls: Cell[int]

    @readonly
    def clocks(self) -> list:
        return [time.time(), time.monotonic(), time.strftime("%Y"), time.gmtime().tm_year]

    @readonly
    def draws(self) -> list:
        return [random.random(), os.urandom(4).hex(), secrets.token_hex(4), str(uuid.uuid4()), random.Random().random()]

    @readonly
    def say(self, text: str) -> None:
        print(text)

    @readonly
    def refused(self) -> dict:
        def outcome(f):
            try:
                f()
                return "ran"
            except Exception as e:
                return type(e).__name__

        return {
            "open": outcome(lambda: open(__file__).close()),
            "stat": outcome(lambda: os.stat(__file__)),
            "exists": os.path.exists(__file__),
            "sleep": outcome(lambda: time.sleep(0.01)),
            "write": outcome(lambda: os.write(2, b"x")),
            "input": outcome(input),
        }


@pytest.fixture
def host():
    return MockHost(App(Probe))


def test_the_clocks_are_the_workflows(host):
    probe = host.create("Probe")
    host.set_now_micros(1_800_000_000_000_000)
    assert host.invoke(probe, "clocks") == [1_800_000_000.0, 1_800_000_000.0, "2027", 2027]
    assert abs(time.time() - 1_800_000_000) > 1e6  # the test's own clock is back


def test_the_draws_are_the_mocks(host):
    probe = host.create("Probe")
    host.set_seed(3)
    drawn = host.invoke(probe, "draws")
    host.set_seed(3)
    assert host.invoke(probe, "draws") == drawn
    assert host.invoke(probe, "draws") != drawn
    state = random.getstate()
    host.invoke(probe, "draws")
    assert random.getstate() == state  # the test's own generator is untouched


def test_print_goes_to_the_log(host):
    probe = host.create("Probe")
    host.invoke(probe, "say", ["hello"])
    assert [(r.level, r.message) for r in host.logs()] == [("info", "hello")]


def test_files_descriptors_input_and_sleep_are_refused_and_then_given_back(host):
    probe = host.create("Probe")
    assert host.invoke(probe, "refused") == {
        "open": "PermissionError",
        "stat": "PermissionError",
        "exists": False,
        "sleep": "PermissionError",
        "write": "OSError",
        "input": "EOFError",
    }
    with open(__file__) as f:  # outside a workflow, the test has its files
        assert f.read(3) == '"""'
    assert os.path.exists(__file__)


def test_urandom_draws_whole_words_and_refuses_a_negative_size(host):
    drawn = host.with_object(host.create("Probe"), lambda: sandbox.urandom(13))
    assert len(drawn) == 13
    assert host.with_object(1, lambda: sandbox.urandom(0)) == b""
    with pytest.raises(ValueError):
        sandbox.urandom(-1)


def test_sleep_of_nothing_is_allowed():
    sandbox._sleep(0)
    with pytest.raises(PermissionError, match="may not sleep"):
        sandbox._sleep(0.01)
    with pytest.raises(ValueError):
        sandbox._sleep(-1)


def _a_generator():
    # Made here, so that only what the test builds refers to it.
    generator = random.Random(7)
    namespace = {"random": generator.random, "seed": generator.seed, "_inst": generator}
    methods = {name: value for name, value in namespace.items() if name != "_inst"}
    return generator, methods, namespace


def test_random_is_seeded_at_the_first_draw_only_where_nothing_else_holds_its_functions():
    # A name bound from `random` before the snapshot would bypass the
    # seeding wrappers: then the generator is seeded at every call.
    generator, methods, namespace = _a_generator()
    assert not sandbox.held_elsewhere(generator, methods, namespace)
    module_global = {"draw": methods["random"]}
    assert sandbox.held_elsewhere(generator, methods, namespace)
    del module_global
    generator, methods, namespace = _a_generator()

    def bind(draw):
        return lambda: draw()

    closure = bind(methods["seed"])
    assert sandbox.held_elsewhere(generator, methods, namespace)
    del closure
    generator, methods, namespace = _a_generator()
    holder = [generator]
    assert sandbox.held_elsewhere(generator, methods, namespace)
    del holder
