"""`describe` reports the types as declared, as the Rust macros do."""

import pytest

from lambdastore import (
    SDK_VERSION, App, Cell, Map, MultiMap, Set, constructor, lambda_object, protected, readonly, static,
)


@lambda_object
class Forum:
    title: Cell[str]
    posts: Map[int, str]
    tags: MultiMap[str, int]
    moderators: Set[str]

    @constructor
    def create(self, title: str):
        self.title.set(title)

    @readonly
    def get_title(self) -> str:
        return self.title.get_or_default()

    @protected
    def add_post(self, post: str):
        pass

    @protected
    @readonly
    def audit(self):
        pass

    @static
    @protected
    def helper_static():
        pass

    def _private(self):
        pass


def test_describe_lists_fields_and_functions_in_declaration_order():
    desc = App(Forum).describe()
    assert desc.sdk == SDK_VERSION == "lambdastore-python 0.1.0"
    [forum] = desc.types
    assert forum.name == "Forum"
    assert [(f.name, f.kind) for f in forum.fields] == [
        ("title", "cell"), ("posts", "map"), ("tags", "multi-map"), ("moderators", "set"),
    ]
    assert [(f.name, f.kind, f.protected, f.readonly) for f in forum.functions] == [
        ("create", "constructor", False, False),
        ("get_title", "method", False, True),
        ("add_post", "method", True, False),
        ("audit", "method", True, True),
        ("helper_static", "static", True, False),
    ]


def test_declaration_mistakes_are_reported():
    with pytest.raises(TypeError, match="at most one"):
        @lambda_object
        class TwoConstructors:
            @constructor
            def a(self):
                pass

            @constructor
            def b(self):
                pass

    with pytest.raises(TypeError, match="cannot be readonly"):
        @lambda_object
        class ReadonlyConstructor:
            @readonly
            @constructor
            def a(self):
                pass

    with pytest.raises(TypeError, match="fields of an object type are"):
        @lambda_object
        class NotAField:
            balance: int

    with pytest.raises(TypeError, match="@static, not @staticmethod"):
        @lambda_object
        class PlainStaticmethod:
            @staticmethod
            def f():
                pass

    with pytest.raises(TypeError, match="cannot be a key"):
        @lambda_object
        class FloatKeys:
            m: Map[float, int]

    with pytest.raises(TypeError, match="not a @lambda_object"):
        App(int)
