"""Dataclasses as serde structs, object types named before their
declaration, and fields stored under another name than their attribute's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import pytest

from lambdastore import (
    U64, App, ApplicationError, BadArgumentsError, Cell, Map, constructor, lambda_object, readonly, static,
    stored_as,
)
from lambdastore.jsontext import dumps
from lambdastore.mock import MockHost


@dataclass
class Point:
    x: int
    y: int
    label: Optional[str] = None


@dataclass
class Shape:
    owner: Gallery
    points: list[Point]
    tags: list[str] = field(default_factory=list)


@lambda_object
class Gallery:
    # Named before Sketch is declared: a reference, keyed by its id.
    sketches: Map[tuple[U64, Sketch], Shape]
    favourite: Cell[Optional[Sketch]]
    name_: Cell[str] = stored_as("name")

    @constructor
    def new(self, name: str):
        self.name_.set(name)

    @readonly
    def name(self) -> str:
        return self.name_.get_or_default()

    def add(self, n: U64, sketch: Sketch, shape: Shape) -> list:
        self.sketches.insert((n, sketch), shape)
        return [type(shape).__name__, shape.points[0].x]

    @readonly
    def shapes(self) -> list[Shape]:
        return [shape for _, shape in self.sketches.iter()]


@lambda_object
class Sketch:
    @static
    def origin(at: Point) -> Point:
        return Point(at.x, at.y, "origin")


APP = App(Gallery, Sketch)


@pytest.fixture
def host():
    return MockHost(APP)


def test_a_dataclass_is_a_json_object_of_its_fields_in_order():
    assert dumps(Point(1, 2)) == '{"x":1,"y":2,"label":null}'
    assert dumps([Shape(7, [Point(0, 1, "a")])]) == '[{"owner":7,"points":[{"x":0,"y":1,"label":"a"}],"tags":[]}]'


def test_dataclass_parameters_and_results(host):
    assert host.invoke_static("Sketch", "origin", {"at": {"x": 3, "y": 4}}) == {"x": 3, "y": 4, "label": "origin"}
    # By position too, as serde reads a struct from an array.
    assert host.invoke_static("Sketch", "origin", [[3, 4, None]])["x"] == 3
    gallery = host.create("Gallery", ["g"])
    sketch = host.invoke_static("Sketch", "origin", [{"x": 0, "y": 0}])
    assert sketch["label"] == "origin"
    assert host.invoke(gallery, "add", [1, 99, {"owner": gallery, "points": [{"x": 5, "y": 6}]}]) == ["Shape", 5]
    assert host.invoke(gallery, "shapes") == [
        {"owner": gallery, "points": [{"x": 5, "y": 6, "label": None}], "tags": []},
    ]


def test_dataclass_arguments_are_checked_like_serde(host):
    def bad(at):
        with pytest.raises(BadArgumentsError) as error:
            host.invoke_static("Sketch", "origin", {"at": at})
        return error.value.value

    assert bad({"x": 1}) == "parameter `at`: missing field `y`"
    assert bad({"x": 1, "y": "2"}) == 'parameter `at`: invalid type: string "2", expected i64'
    assert bad("here") == 'parameter `at`: invalid type: string "here", expected struct Point'
    assert bad([1]) == "parameter `at`: invalid length 1, expected struct Point with 3 elements"
    assert bad([1, 2, None, 4]) == "parameter `at`: invalid length 4, expected fewer elements in array"
    # Unknown fields are ignored, as serde does by default.
    assert host.invoke_static("Sketch", "origin", {"at": {"x": 1, "y": 2, "z": 3}})["x"] == 1


def test_a_stored_struct_reads_back_as_its_dataclass(host):
    gallery = host.create("Gallery", ["g"])
    host.invoke(gallery, "add", [2, 11, {"owner": gallery, "points": [{"x": 1, "y": 1}], "tags": ["t"]}])

    def read():
        [((n, sketch), shape)] = list(Gallery.sketches.iter())
        return n, sketch, shape

    assert host.with_object(gallery, read) == (2, 11, Shape(gallery, [Point(1, 1)], ["t"]))
    # Keyed by (u64, i64 id): the ids' bytes as the Rust SDK encodes them.
    [key] = [e.key for e in host.entries(gallery) if e.field == "sketches"]
    assert key == (2).to_bytes(8, "big") + (11 + (1 << 63)).to_bytes(8, "big")


def test_a_value_is_stored_as_its_type_writes_it():
    # As the Rust SDK stores its typed value: declared fields in order (an
    # unknown one dropped, a default one written), a float as a float.
    @lambda_object
    class Holder:
        point: Cell[Point]
        ratio: Cell[float]

        def store(self, point: dict, ratio: int) -> None:
            self.point.set(point)
            self.ratio.set(ratio)

    holder = MockHost(App(Holder))
    h = holder.create("Holder")
    holder.invoke(h, "store", [{"y": 2, "x": 1, "junk": [1, 2, 3]}, 5])
    stored = {e.field: e.value for e in holder.entries(h)}
    assert stored == {"point": b'{"x":1,"y":2,"label":null}', "ratio": b"5.0"}


def test_a_struct_without_defaults_has_no_default_value():
    @lambda_object
    class Holder:
        shape: Cell[Shape]
        point: Cell[Point]

        def read_shape(self):
            return self.shape.get_or_default()

    holder = MockHost(App(Holder))
    with pytest.raises(ApplicationError, match="struct Shape has no default value"):
        holder.invoke(holder.create("Holder"), "read_shape")


def test_a_field_may_be_stored_under_the_name_of_a_function(host):
    gallery = host.create("Gallery", {"name": "modern"})
    assert host.invoke(gallery, "name") == "modern"
    assert host.cell(gallery, "name") == "modern"
    assert [f.name for f in APP.describe().types[0].fields] == ["sketches", "favourite", "name"]


def test_declaration_mistakes_with_names_are_reported():
    with pytest.raises(TypeError, match="both a field and a function"):
        @lambda_object
        class Clash:
            name: Cell[str]

            def name(self):
                pass

    with pytest.raises(TypeError, match="another field is stored as `a`"):
        @lambda_object
        class Twice:
            a: Cell[str]
            b: Cell[str] = stored_as("a")

    with pytest.raises(TypeError, match="has no field type"):
        @lambda_object
        class Unannotated:
            a = stored_as("b")

    # A name never declared is caught by the App, not taken for an object type.
    @lambda_object
    class Typo:
        other: Cell[Sketchh]  # noqa: F821

    with pytest.raises(TypeError, match="Typo names `Sketchh`, which is not defined"):
        App(Typo)
    # Declared later, but not one of the App's types.
    with pytest.raises(TypeError, match="Gallery names `Sketch`"):
        App(Gallery)
