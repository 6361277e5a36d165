"""The Rust forum's tests (guest-sdk/examples/forum/src/lib.rs), on the mock host."""

from dataclasses import dataclass

import pytest

from app import ThreadView, app
from lambdastore import ApplicationError, NotAllowedError, call
from lambdastore.mock import MockHost


@dataclass
class Forum:
    host: MockHost
    alice: int
    bob: int
    rust: int


@pytest.fixture
def f():
    host = MockHost(app)
    alice = host.create("Account", {"name": "alice"})
    bob = host.create("Account", {"name": "bob"})
    rust = host.create("Community", {"name": "rust"})
    return Forum(host, alice, bob, rust)


def post(f, title):
    return f.host.invoke(f.alice, "create_thread", {"community": f.rust, "title": title, "text": "body"})


def test_create_thread_creates_and_indexes_it(f):
    thread = post(f, "hello")
    assert f.host.object_type(thread) == "Thread"
    view = ThreadView(**f.host.invoke(thread, "get_thread", None))
    assert view.id == thread
    assert (view.author, view.community) == (f.alice, f.rust)
    assert (view.title, view.comment_count) == ("hello", 0)

    listed = f.host.invoke(f.rust, "list_threads", [])
    assert listed[0]["id"] == thread
    assert listed[0]["title"] == "hello"
    assert listed[0]["author"] == f.alice


def test_list_threads_is_newest_first_and_limited(f):
    ids = [post(f, t) for t in ["one", "two", "three"]]
    listed = f.host.invoke(f.rust, "list_threads", {"limit": 2})
    assert [t["id"] for t in listed] == [ids[2], ids[1]]


def test_comments_are_numbered_and_kept_in_order(f):
    thread = post(f, "hello")

    def comment(who, text):
        return f.host.invoke(who, "add_comment", {"thread": thread, "text": text})

    assert comment(f.bob, "first") == 1
    assert comment(f.alice, "second") == 2

    view = f.host.invoke(thread, "get_thread", None)
    assert view["comment_count"] == 2
    comments = view["comments"]
    assert comments[0]["id"] == 1
    assert comments[0]["author"] == f.bob
    assert comments[0]["text"] == "first"
    assert comments[1]["text"] == "second"
    assert comments[0]["at"] < comments[1]["at"]


def test_protected_functions_are_not_for_clients(f):
    thread = post(f, "hello")
    with pytest.raises(NotAllowedError):
        f.host.invoke(thread, "add_comment", {"author": f.bob, "text": "spam"})
    with pytest.raises(NotAllowedError):
        f.host.invoke(f.rust, "add_thread", [thread, "fake", f.bob])


def test_a_failed_workflow_leaves_no_thread(f):
    before = len(f.host.objects())
    # The thread is created, then indexing fails: the community is not one.
    with pytest.raises(ApplicationError) as error:
        f.host.invoke(f.alice, "create_thread", {"community": f.bob, "title": "lost", "text": "body"})
    assert error.value == ApplicationError("unknown function Account.add_thread")
    assert len(f.host.objects()) == before
    # An empty title fails in the Thread constructor.
    with pytest.raises(ApplicationError):
        f.host.invoke(f.alice, "create_thread", {"community": f.rust, "title": " ", "text": "body"})
    assert len(f.host.objects()) == before
    assert f.host.invoke(f.rust, "list_threads", None) == []


def test_empty_comments_are_refused_without_side_effects(f):
    thread = post(f, "hello")
    with pytest.raises(ApplicationError) as error:
        f.host.invoke(f.bob, "add_comment", [thread, ""])
    assert error.value == ApplicationError("comment must not be empty")
    assert f.host.cell(thread, "comment_count") == 0


# Beyond the Rust tests: what only the Python twin could get wrong.

def test_stored_bytes_are_the_rust_forums(f):
    # serde writes a struct's fields in declaration order; the name cell is
    # `name` although the attribute is `name_`.
    thread = post(f, "hello")
    f.host.invoke(f.bob, "add_comment", [thread, "first"])
    stored = {(e.field, e.key): e.value for e in f.host.entries(thread)}
    at = f.host.invoke(thread, "get_thread", None)["comments"][0]["at"]
    assert stored[("comments", b"\x00" * 7 + b"\x01")] == f'{{"author":{f.bob},"text":"first","at":{at}}}'.encode()
    assert stored[("comment_count", b"")] == b"1"
    [(field, key, value)] = [(e.field, e.key, e.value) for e in f.host.entries(f.rust) if e.field == "threads"]
    assert value == f'{{"title":"hello","author":{f.alice}}}'.encode()
    assert [e.field for e in f.host.entries(f.alice)] == ["name"]
    assert f.host.invoke(f.alice, "name", None) == "alice"


def test_names_and_titles_must_not_be_blank_as_rust_trims():
    host = MockHost(app)
    for blank in ["", " ", "\t\n", "\u3000"]:
        with pytest.raises(ApplicationError) as error:
            host.create("Account", {"name": blank})
        assert error.value == ApplicationError("name must not be empty")
    # Rust's trim keeps the information separators that Python's strip removes.
    assert host.invoke(host.create("Community", {"name": "\x1f"}), "name", None) == "\x1f"


def test_list_threads_reads_across_pages(f):
    # More threads than one page of a scan (128), all at one transaction time.
    args = [{"community": f.rust, "title": f"t{i}", "text": ""} for i in range(130)]
    ids = f.host.with_object(f.alice, lambda: [call(f.alice, "create_thread", a) for a in args])
    listed = f.host.invoke(f.rust, "list_threads", {"limit": 129})
    assert [t["id"] for t in listed] == ids[:0:-1]
