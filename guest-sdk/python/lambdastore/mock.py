"""An in-memory stand-in for the database, so an application's pytest runs
its lambdas without PostgreSQL: the Python twin of the Rust SDK's
`lambdastore_sdk::mock::MockHost`.

The mock enforces what the real host enforces:

- unknown objects, types and functions are `CallError`s;
- protected functions can only be called from inside a lambda (a nested
  call), never from outside;
- a readonly function, and everything it calls, may not write, create
  objects, spawn or set timers: trying raises `Trap`, as the real host traps;
- a field name may not contain a NUL byte (the host refuses it): `Trap` too;
- every call, top-level or nested, is a savepoint: if it fails, none of its
  writes (nor its callees') are kept, and a nested caller gets the error
  and may go on;
- a `Trap` (or exceeding the call-depth limit) aborts the whole workflow:
  the mock undoes everything the top-level call did and re-raises it in the
  test. `Trap` is a `BaseException`, so a lambda's `except Exception` does
  not catch it, as nothing in a guest catches a trap.

Time is the workflow's: `now_micros()` is constant during one top-level
call and advances by a millisecond between them. Randomness is a seeded
PRNG (the Rust mock's SplitMix64 and seed). Logs are captured. During a
workflow the standard library is what it is on the server (`sandbox.py`):
`time.time()` and the other clocks of `time` read the mock's clock (not
`datetime.now()`: the test process's `datetime` is its C implementation),
`random`, `os.urandom`, `secrets` and `uuid.uuid4()` draw from its PRNG,
`print` goes to its log, and a file, a socket or `time.sleep` raise.

    host = MockHost(app)
    counter = host.create("Counter", {"initial": 40})
    assert host.invoke(counter, "add", [2]) == 42
    assert host.cell(counter, "value") == 42
"""

import sys
from dataclasses import dataclass, field as dataclass_field
from typing import Optional

from . import host as host_module
from . import sandbox
from .errors import CallError, HostTrap, NotAllowedError, UnknownFunctionError, UnknownObjectError, BadArgumentsError
from .host import Err, Ok
from .jsontext import dumps, loads
from .keys import decode_key, key_codec

#: Nested calls beyond this depth abort the workflow (the server's
#: `lambdastore.max_call_depth`, whose default this is).
DEFAULT_MAX_DEPTH = 16
#: The longest timer name, as on the server.
MAX_TIMER_NAME = 255
#: How far from now a spawned call or a timer may be due, either way, as on
#: the server.
MAX_DUE_YEARS = 1000
_MICROS_PER_YEAR = 365 * 24 * 3600 * 1_000_000
#: The most bytes an entry's field name and key may have together, as on
#: the server (its index holds no more).
MAX_KEY_BYTES = 2048
_MASK64 = (1 << 64) - 1


class Trap(HostTrap):
    """What traps on the real host: the whole workflow is aborted, even if a
    lambda catches it (nothing in a guest catches a trap)."""

    def __init__(self, *args):
        super().__init__(*args)
        _traps.append(self)


# The traps raised in the running workflow (one at a time, in one thread).
_traps = []


def _as_jsonb(text: str) -> str:
    """A client's result, which the server makes jsonb: a NUL in a string
    fails the call there (38000), and the workflow commits nothing."""
    pending = [loads(text)]
    while pending:
        value = pending.pop()
        if isinstance(value, str) and "\0" in value:
            raise Trap("unsupported Unicode escape sequence: \\u0000 cannot be converted to text")
        if isinstance(value, dict):
            pending.extend(value)
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return text


@dataclass
class LogRecord:
    """A message a lambda logged."""

    level: str
    message: str
    #: The object whose function logged it (0 for static functions).
    object: int


@dataclass
class SpawnedCall:
    """A call a lambda spawned (or a timer it set), to run after its
    workflow commits."""

    target: int
    function: str
    #: The JSON arguments.
    args: str
    #: When it is due (microseconds since the Unix epoch); None: at once.
    due_micros: Optional[int] = None
    #: The timer of `target` it is, if a timer set it.
    timer: Optional[str] = None

    def due_at(self, now: int) -> bool:
        return self.due_micros is None or self.due_micros <= now


@dataclass
class StoredEntry:
    """One stored entry, for assertions."""

    field: str
    #: The encoded key (empty for a cell).
    key: bytes
    #: The value bytes (JSON, or empty for a set member).
    value: bytes


@dataclass
class _Store:
    """What a savepoint restores."""

    entries: dict = dataclass_field(default_factory=dict)  # (object, field, key) -> value
    objects: dict = dataclass_field(default_factory=dict)  # id -> type name
    spawned: list = dataclass_field(default_factory=list)

    def copy(self):
        # Keys and values are immutable bytes and strings: shallow copies suffice.
        return _Store(dict(self.entries), dict(self.objects), list(self.spawned))


@dataclass
class _Frame:
    """One running function."""

    object: int
    type_name: str
    function: str
    readonly: bool


class MockHost:
    """The in-memory host for application `app` (a `lambdastore.App`)."""

    def __init__(self, app):
        self.app = app
        self.desc = app.describe()
        self._store = _Store()
        self._stack = []
        # Object ids are never reused, even after a rollback (like a sequence).
        self._next_id = 1
        self._now_micros = 1_700_000_000_000_000
        self._rng = 0x1A3B_DA57_0BE5
        self._max_depth = DEFAULT_MAX_DEPTH
        self._logs = []
        self._imports = _Imports(self)
        self._log_stream = None

    # --- As a client: each call is a workflow of its own. ---

    def create(self, type_name: str, args=None) -> int:
        """Creates an object of `type_name` and runs its constructor with
        `args` (a dict by name, a list by position, or None); its id."""
        return self._entry(lambda: self._create(type_name, dumps(args)))

    def invoke(self, object_id: int, function: str, args=None):
        """Calls method `function` of `object_id` with `args`: the decoded
        result, or the call's `CallError` raised."""
        return loads(self._entry(lambda: _as_jsonb(self._call(object_id, function, dumps(args)))))

    def invoke_static(self, type_name: str, function: str, args=None):
        """Calls static `function` of `type_name` with `args`: the decoded result."""
        return loads(self._entry(lambda: _as_jsonb(self._call_static(type_name, function, dumps(args)))))

    def run_spawned(self) -> list:
        """Runs each spawned call (timers too) that is due at the mock's
        clock as its own workflow, the earliest due first and in spawn order
        among equals (calls they spawn run too, once due): their outcomes,
        `Ok(result)` or `Err(error)`. Calls not due yet stay queued: move
        the clock with `set_now_micros` and run again."""
        results = []
        while True:
            now = self._now_micros
            due = [(c.due_micros if c.due_micros is not None else -(1 << 63), i)
                   for i, c in enumerate(self._store.spawned) if c.due_at(now)]
            if not due:
                return results
            call = self._store.spawned.pop(min(due)[1])
            try:
                results.append(Ok(self.invoke(call.target, call.function, loads(call.args))))
            except CallError as e:
                results.append(Err(e))

    def take_spawned(self) -> list:
        """Calls spawned by committed workflows and not run yet, removed from the queue."""
        spawned, self._store.spawned = self._store.spawned, []
        return spawned

    def with_object(self, object_id: int, f):
        """Runs `f()` as if inside a method of `object_id` (without
        savepoint), so a test can read or prepare fields directly."""
        frame = _Frame(object_id, self._store.objects.get(object_id, ""), "with_object", False)
        previous = host_module.install(self._imports)
        self._stack.append(frame)
        try:
            return f()
        finally:
            self._stack.pop()
            host_module.install(previous)

    # --- Inspecting the store. ---

    def object_type(self, object_id: int):
        """The type of `object_id`, or None if it does not exist."""
        return self._store.objects.get(object_id)

    def objects(self) -> list:
        """All objects and their types, by id."""
        return sorted(self._store.objects.items())

    def entries(self, object_id: int) -> list:
        """The stored entries of `object_id`, by field and key."""
        return [StoredEntry(f, k, v) for (o, f, k), v in sorted(self._store.entries.items()) if o == object_id]

    def cell(self, object_id: int, field: str):
        """The decoded value of cell `field` of `object_id`, or None."""
        raw = self._store.entries.get((object_id, field, b""))
        return None if raw is None else loads(raw)

    def map(self, object_id: int, field: str, key_type) -> list:
        """The decoded `(key, value)` entries of map `field` of `object_id`
        (keys of `key_type`), in key order."""
        codec = key_codec(key_type)
        return [(decode_key(codec, e.key), loads(e.value)) for e in self.entries(object_id) if e.field == field]

    def logs(self) -> list:
        """Everything lambdas logged, oldest first (rolled-back calls
        included: the server log is not transactional either)."""
        return list(self._logs)

    def now_micros(self) -> int:
        """The clock of the next workflow."""
        return self._now_micros

    def set_now_micros(self, micros: int) -> None:
        """Sets the clock of the next workflow."""
        self._now_micros = micros

    def set_seed(self, seed: int) -> None:
        """Reseeds the random number generator."""
        self._rng = seed & _MASK64

    def set_max_depth(self, depth: int) -> None:
        """Sets how deep nested calls may go before the workflow is aborted."""
        self._max_depth = depth

    # --- Workflows, savepoints and the rules of the host. ---

    def _entry(self, f):
        """A call from test code (no lambda running) is a client's call: a
        workflow of its own. From a lambda it is a nested call."""
        if self._stack:
            return f()
        before = self._store.copy()
        previous = host_module.install(self._imports)
        self._log_stream = sys.stderr  # the test's, not the sandbox's
        _traps.clear()
        try:
            with sandbox.applied():
                result = f()
        except BaseException as e:
            if _traps or not isinstance(e, CallError):
                # A trap (caught by a lambda or not): nothing of the
                # workflow is kept.
                self._store = before
                self._stack.clear()
                if _traps and e is not _traps[0]:
                    raise _traps[0] from None
            raise
        else:
            if _traps:
                self._store = before
                self._stack.clear()
                raise _traps[0]
            return result
        finally:
            host_module.install(previous)
            # The next workflow is a later transaction.
            self._now_micros += 1_000

    def _function(self, type_name, function, kind):
        spec = self.desc.type_desc(type_name)
        f = spec.function(function) if spec else None
        if f is None or f.kind != kind:
            raise UnknownFunctionError(f"{type_name}.{function}")
        return f

    def _check_visibility(self, type_name, f):
        """Protected functions are for lambdas of the application only."""
        if f.protected and not self._stack:
            raise NotAllowedError(f"{type_name}.{f.name} is protected: only lambdas of its application may call it")

    def _run(self, frame, kind, args):
        """Runs the function of `frame` inside a savepoint."""
        # As the server's `lambdastore.max_call_depth`: that many calls
        # nested in the top-level one.
        if len(self._stack) > self._max_depth:
            raise Trap(f"call depth limit ({self._max_depth}) exceeded calling {frame.type_name}.{frame.function}")
        savepoint = self._store.copy()
        self._stack.append(frame)
        try:
            return self.app.dispatch(kind, frame.type_name, frame.function, frame.object, args)
        except CallError:
            self._store = savepoint
            raise
        finally:
            self._stack.pop()

    def _call(self, object_id, function, args):
        type_name = self._store.objects.get(object_id)
        if type_name is None:
            raise UnknownObjectError(object_id)
        f = self._function(type_name, function, "method")
        self._check_visibility(type_name, f)
        return self._run(_Frame(object_id, type_name, function, f.readonly), "method", args)

    def _call_static(self, type_name, function, args):
        f = self._function(type_name, function, "static")
        self._check_visibility(type_name, f)
        return self._run(_Frame(0, type_name, function, f.readonly), "static", args)

    def _create(self, type_name, args):
        spec = self.desc.type_desc(type_name)
        if spec is None:
            raise UnknownFunctionError(type_name)
        self._check_write(f"create a {type_name}")
        object_id = self._next_id
        self._next_id += 1
        ctor = next((f for f in spec.functions if f.kind == "constructor"), None)
        if ctor is None:
            if loads(args) not in (None, [], {}):
                raise BadArgumentsError(f"{type_name} has no constructor, so it takes no arguments")
            self._store.objects[object_id] = type_name
            return object_id
        self._check_visibility(type_name, ctor)
        savepoint = self._store.copy()
        # Inside the savepoint: a failed constructor leaves no object.
        self._store.objects[object_id] = type_name
        try:
            self._run(_Frame(object_id, type_name, ctor.name, False), "constructor", args)
        except CallError:
            self._store = savepoint
            raise
        return object_id

    def _field_object(self, what, field):
        """The object whose `field` a host function reads or writes; a NUL
        in the name traps, as PostgreSQL's text would end there."""
        if "\0" in field:
            running = f' of "{self._stack[-1].type_name}.{self._stack[-1].function}"' if self._stack else ""
            raise Trap(f"field name {field!r}{running} contains a NUL byte")
        return self._current_object(what)

    def _current_object(self, what):
        if not self._stack:
            raise Trap(
                f"{what}: no lambda is running; call functions through MockHost.create/invoke, "
                "or use MockHost.with_object"
            )
        frame = self._stack[-1]
        if frame.object == 0:
            raise Trap(f"{what}: static function {frame.type_name}.{frame.function} has no object")
        return frame.object

    def _check_write(self, what):
        """Writes inside a readonly function (or its callees) trap on the
        real host, which aborts the workflow."""
        for frame in reversed(self._stack):
            if frame.readonly:
                raise Trap(f"readonly function {frame.type_name}.{frame.function} may not write (tried to {what})")


class _Imports:
    """The host interface of a `MockHost`: what `lambdastore.host.current()`
    is while the mock runs a workflow (the component's imports, in tests)."""

    def __init__(self, mock):
        self.mock = mock

    def self_id(self):
        return self.mock._stack[-1].object if self.mock._stack else 0

    def get(self, field, key):
        object_id = self.mock._field_object("get", field)
        return self.mock._store.entries.get((object_id, field, bytes(key)))

    def put(self, field, key, value):
        object_id = self.mock._field_object("put", field)
        self.mock._check_write(f"put into field `{field}`")
        # As the server: a longer key aborts the workflow (54000 there).
        size = len(field.encode("utf-8")) + len(key)
        if size > MAX_KEY_BYTES:
            raise Trap(
                f"an entry's field name and key are {size} bytes together, "
                f"more than the {MAX_KEY_BYTES} an index entry holds"
            )
        self.mock._store.entries[(object_id, field, bytes(key))] = bytes(value)

    def delete(self, field, key):
        object_id = self.mock._field_object("delete", field)
        self.mock._check_write(f"delete from field `{field}`")
        return self.mock._store.entries.pop((object_id, field, bytes(key)), None) is not None

    def scan(self, field, start, end, limit, backward):
        object_id = self.mock._field_object("scan", field)
        keys = sorted(
            k for (o, f, k) in self.mock._store.entries
            if o == object_id and f == field and (start is None or k >= start) and (end is None or k < end)
        )
        if backward:
            keys.reverse()
        return [(k, self.mock._store.entries[(object_id, field, k)]) for k in keys[:limit]]

    def call(self, target, function, args):
        return self.mock._call(target, function, args)

    def map_call(self, targets, function, args):
        # As the host does it: `call`, each target once, in the order given.
        outcomes, seen = [], set()
        for target in targets:
            if target in seen:
                continue
            seen.add(target)
            try:
                outcomes.append((target, self.mock._call(target, function, args)))
            except CallError as e:
                outcomes.append((target, e))
        return outcomes

    def create(self, type_name, args):
        return self.mock._create(type_name, args)

    def call_static(self, type_name, function, args):
        return self.mock._call_static(type_name, function, args)

    def spawn(self, target, function, args, due_micros=None):
        self.mock._current_object("spawn")
        self.mock._check_write(f"spawn {function}")
        if target not in self.mock._store.objects:
            raise UnknownObjectError(target)
        if due_micros is not None:
            self._check_due(due_micros)
        self.mock._store.spawned.append(SpawnedCall(target, function, args, due_micros))

    def _check_due(self, at_micros):
        # As the server: a time past MAX_DUE_YEARS aborts the workflow
        # (22023 there).
        if abs(at_micros - self.mock._now_micros) > MAX_DUE_YEARS * _MICROS_PER_YEAR:
            raise Trap(f"a job is due at most {MAX_DUE_YEARS} years from now, not at {at_micros} µs after 1970")

    def spawn_at(self, target, function, args, at_micros):
        self.spawn(target, function, args, at_micros)

    def set_timer(self, name, at_micros, function, args):
        self._replace_timer(name, (at_micros, function, args))

    def clear_timer(self, name):
        self._replace_timer(name, None)

    def _replace_timer(self, name, call):
        """Sets (with a call) or clears the timer `name` of the current
        object: its pending run, if any, is replaced, as on the server."""
        target = self.mock._current_object("set a timer")
        self.mock._check_write(f"set or clear timer `{name}`")
        size = len(name.encode("utf-8"))
        if not 0 < size <= MAX_TIMER_NAME:
            raise Trap(f"a timer's name is 1 to {MAX_TIMER_NAME} bytes, not {size}")
        if call is not None:
            self._check_due(call[0])
            self.mock._function(self.mock._store.objects.get(target, ""), call[1], "method")
        self.mock._store.spawned = [
            s for s in self.mock._store.spawned if not (s.target == target and s.timer == name)
        ]
        if call is not None:
            at, function, args = call
            self.mock._store.spawned.append(SpawnedCall(target, function, args, at, name))

    def now_micros(self):
        return self.mock._now_micros

    def random_u64(self):
        # SplitMix64, as the Rust mock.
        self.mock._rng = (self.mock._rng + 0x9E3779B97F4A7C15) & _MASK64
        z = self.mock._rng
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        return z ^ (z >> 31)

    def log(self, level, message):
        object_id = self.self_id()
        print(f"[lambda {object_id} {level}] {message}", file=self.mock._log_stream or sys.stderr)
        self.mock._logs.append(LogRecord(level, message, object_id))
