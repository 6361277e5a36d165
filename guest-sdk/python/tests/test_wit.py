"""The component glue (`lambdastore.wit`) against the real generated
bindings, with the host imports replaced by the mock's: what runs inside
the component, minus the component."""

import importlib.util
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import lambdastore
from lambdastore import App, Cell, LambdaError, constructor, lambda_object, readonly
from lambdastore import host as host_module
from lambdastore.mock import MockHost

WIT = Path(__file__).resolve().parents[2] / "wit"


@lambda_object
class Note:
    text: Cell[str]

    @constructor
    def new(self, text: str):
        self.text.set(text)

    @readonly
    def read(self) -> str:
        return self.text.get_or_default()

    def fail(self):
        raise LambdaError("no")

    def peek(self, other: int):
        return lambdastore.call(other, "read")

    def poke(self, other: int):
        try:
            lambdastore.call(other, "missing")
        except lambdastore.UnknownFunctionError as e:
            return ["caught", e.value]

    def fan(self, others: list[int]):
        return [[t, type(o).__name__] for t, o in lambdastore.map_call(others, "read")]


app = App(Note)


@pytest.fixture(scope="module")
def wit(tmp_path_factory):
    tool = shutil.which("componentize-py") or shutil.which("componentize-py", path=sys.prefix + "/bin")
    if tool is None:
        pytest.skip("componentize-py is not installed")
    out = tmp_path_factory.mktemp("bindings")
    subprocess.run([tool, "-d", str(WIT), "-w", "lambda", "bindings", str(out)], check=True, capture_output=True)
    sys.path.insert(0, str(out))
    import lambdastore.wit as wit_module
    yield wit_module
    sys.path.remove(str(out))
    # No test after these may find the bindings or their host.
    for name in [m for m in sys.modules if m.split(".")[0] in ("wit_world", "componentize_py_types")]:
        del sys.modules[name]
    del sys.modules["lambdastore.wit"]
    host_module.install(None)


@pytest.fixture
def through_wit(wit, monkeypatch):
    """A mock whose lambdas reach it through the WIT import functions."""
    from wit_world.imports import host, later

    mock = MockHost(app)
    imports = mock._imports
    wit_host = wit.WitHost()

    def raising(f):
        # The bindings raise `Err(call-error)` for a failed result.
        def wrapper(*args):
            try:
                return f(*args)
            except lambdastore.CallError as e:
                from componentize_py_types import Err

                raise Err(wit._TO_WIT_ERROR[type(e)](e.value)) from None
        return wrapper

    def map_call(targets, function, args):
        from componentize_py_types import Err, Ok

        return [(t, Err(wit._TO_WIT_ERROR[type(o)](o.value)) if isinstance(o, lambdastore.CallError) else Ok(o))
                for t, o in imports.map_call(targets, function, args)]

    def scan(field, start, end, limit, direction):
        from wit_world.imports import types

        backward = direction == types.Direction.BACKWARD
        return [types.Entry(k, v) for k, v in imports.scan(field, start, end, limit, backward)]

    for name in ("self_id", "get", "put", "delete", "now_micros", "random_u64"):
        monkeypatch.setattr(host, name, getattr(imports, name))
    for name in ("call", "create", "call_static", "spawn"):
        monkeypatch.setattr(host, name, raising(getattr(imports, name)))
    for name in ("spawn_at", "set_timer", "clear_timer"):
        monkeypatch.setattr(later, name, raising(getattr(imports, name)))
    monkeypatch.setattr(host, "map_call", map_call)
    monkeypatch.setattr(host, "scan", scan)
    monkeypatch.setattr(host, "log", lambda level, message: imports.log(level.name.lower(), message))
    # The lambdas' host is the WIT one, as inside a component.
    monkeypatch.setattr(mock, "_imports", wit_host)
    return mock


def test_describe_converts_to_the_wit_records(wit):
    from wit_world.imports import types

    desc = app.wit_world()().describe()
    assert desc.sdk == "lambdastore-python 0.1.0"
    [note] = desc.types
    assert note.fields == [types.FieldDesc("text", types.FieldKind.CELL)]
    assert note.functions[0] == types.FunctionDesc("new", types.FunctionKind.CONSTRUCTOR, False, False)
    assert note.functions[1] == types.FunctionDesc("read", types.FunctionKind.METHOD, False, True)


def test_dispatch_returns_json_or_raises_the_wit_error(wit):
    from componentize_py_types import Err
    from wit_world.imports import types

    world = app.wit_world()()
    with pytest.raises(Err) as error:
        world.dispatch(types.FunctionKind.METHOD, "Note", "nope", 1, "null")
    assert error.value.value == types.CallError_UnknownFunction("Note.nope")
    with pytest.raises(Err) as error:
        world.dispatch(types.FunctionKind.STATIC, "Nope", "f", 0, "null")
    assert error.value.value == types.CallError_UnknownFunction("Nope")


def test_lambdas_run_through_the_wit_imports(through_wit):
    mock = through_wit
    a = mock.create("Note", ["hello"])
    b = mock.create("Note", {"text": "world"})
    assert mock.invoke(a, "read") == "hello"
    assert mock.invoke(a, "peek", [b]) == "world"
    assert mock.invoke(a, "poke", [b]) == ["caught", "Note.missing"]
    assert mock.invoke(a, "fan", [[a, 99]]) == [[a, "Ok"], [99, "Err"]]
    with pytest.raises(lambdastore.ApplicationError, match="no"):
        mock.invoke(a, "fail")


class _Recorder:
    """A host that only records what was asked of it."""

    def __init__(self):
        self.asked = []

    def __getattr__(self, name):
        return lambda *args: self.asked.append(name)


@pytest.mark.parametrize("example", ["counter", "forum", "wallet", "sandbox"])
def test_the_warm_up_before_the_snapshot_runs_no_application_function(wit, example):
    # Building a component imports the app, whose `app.wit_world()` warms
    # the SDK's side of a call up (wit.warm_up) for the snapshot: that must
    # not run a lambda, which would ask the host, nor fail.
    recorder = _Recorder()
    previous = host_module.install(recorder)
    try:
        path = Path(__file__).resolve().parents[1] / "examples" / example / "app.py"
        name = f"warmed_{example}"
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
        sys.modules[name].WitWorld()  # as componentize-py does before the snapshot
    finally:
        host_module.install(previous)
        sys.modules.pop(name, None)
    assert recorder.asked == []
