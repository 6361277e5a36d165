"""Field operations, on the mock host's store (mirroring fields.rs's examples)."""

from typing import Optional

import pytest

from lambdastore import U64, U32, App, ApplicationError, Cell, Map, MultiMap, Set, lambda_object
from lambdastore.mock import MockHost, Trap


@lambda_object
class Profile:
    owner: Cell[str]
    count: Cell[int]
    note: Cell[Optional[str]]
    scores: Map[str, U32]
    events: Map[U64, str]
    tags: MultiMap[str, str]
    members: Set[int]

    def read_count(self):
        return self.count.get()


@pytest.fixture
def run():
    host = MockHost(App(Profile))
    profile = host.create("Profile")
    return lambda f: host.with_object(profile, f)


def test_cells_get_set_and_clear(run):
    def body():
        assert Profile.owner.get() is None
        assert Profile.owner.get("nobody") == "nobody"
        assert Profile.count.get_or_default() == 0
        Profile.owner.set("ada")
        assert Profile.owner.get() == "ada"
        assert Profile.owner.clear()
        assert not Profile.owner.clear()
        assert Profile.owner.get_or_default() == ""
        Profile.note.set(None)
        assert Profile.note.get("unset") is None, "a stored null is a value"

    run(body)


def test_values_must_fit_the_field_type(run):
    def body():
        with pytest.raises(TypeError, match="field `count`"):
            Profile.count.set("five")
        with pytest.raises(TypeError, match="field `count`"):
            Profile.count.set(1 << 63)

    run(body)


def test_a_key_past_what_the_servers_index_holds_aborts_the_workflow(run):
    def body():
        Profile.scores.insert("k" * 2000, 1)
        Profile.scores.insert("k" * 3000, 1)

    with pytest.raises(Trap, match="an entry's field name and key are 30.. bytes together"):
        run(body)


def test_maps_in_key_order(run):
    def body():
        scores = Profile.scores
        scores.insert("bob", 3)
        scores.insert("ada", 5)
        assert scores.get("ada") == 5
        assert scores.get("eve") is None
        assert scores.contains_key("bob")
        assert list(scores.iter()) == [("ada", 5), ("bob", 3)]
        assert list(scores) == list(scores.iter()), "a field iterates like its iter()"
        assert scores.first() == ("ada", 5)
        assert scores.last() == ("bob", 3)
        assert scores.remove("bob")
        assert not scores.remove("bob")
        assert list(scores.iter().rev().limit(1)) == [("ada", 5)]
        assert not scores.is_empty()
        scores.remove("ada")
        assert scores.is_empty() and scores.first() is None

    run(body)


def test_ranges_reverse_and_limit_across_pages(run):
    def body():
        events = Profile.events
        # More than one page (128) of entries.
        for i in range(300):
            events.insert(i, f"event {i}")
        assert [k for k, _ in events.iter().rev().limit(3)] == [299, 298, 297]
        assert [k for k, _ in events.range(3, 5, inclusive=True)] == [3, 4, 5]
        assert [k for k, _ in events.range(3, 5)] == [3, 4]
        assert [k for k, _ in events.range(290)] == list(range(290, 300))
        assert [k for k, _ in events.range(end=2).rev()] == [1, 0]
        assert len(list(events.iter())) == 300
        assert [k for k, _ in events.iter().rev()] == list(range(299, -1, -1))
        assert len(list(events.iter().limit(200))) == 200

    run(body)


def test_multimaps_keep_several_values_per_key(run):
    def body():
        tags = Profile.tags
        tags.insert("rust", "fast")
        tags.insert("rust", "safe")
        tags.insert("wasm", "portable")
        assert sorted(tags.get_all("rust")) == ["fast", "safe"]
        assert len(list(tags.iter())) == 3
        assert sorted(tags) == [("rust", "fast"), ("rust", "safe"), ("wasm", "portable")]
        assert [k for k, _ in tags.range("rust", "rust", inclusive=True)] == ["rust", "rust"]
        assert tags.remove_all("rust") == 2
        assert not tags.contains_key("rust")
        assert tags.contains_key("wasm")

    run(body)


def test_sets_hold_ordered_members(run):
    def body():
        members = Profile.members
        assert members.is_empty()
        members.insert(42)
        members.insert(-7)
        members.insert(42)
        assert members.contains(42)
        assert list(members.iter()) == list(members) == [-7, 42]
        assert list(members.range(0)) == [42]
        assert list(members.range(-7, 42, inclusive=True).rev()) == [42, -7]
        assert members.remove(42)
        assert not members.contains(42)

    run(body)


def test_a_stored_value_that_does_not_decode_fails_the_call():
    # Written by "an older version": a string where the type now says int.
    host = MockHost(App(Profile))
    profile = host.create("Profile")
    host.with_object(profile, lambda: host_put(b'"five"'))
    with pytest.raises(ApplicationError) as error:
        host.invoke(profile, "read_count")
    assert error.value.value == (
        "field `count`: stored value does not decode as i64: invalid type: string \"five\", expected i64"
    )


def host_put(raw):
    from lambdastore import host

    host.current().put("count", b"", raw)


def test_the_mock_shows_stored_entries_as_the_rust_sdk_writes_them(run):
    def body():
        Profile.owner.set("é")
        Profile.events.insert(1, "x")

    run(body)
    host = MockHost(App(Profile))
    profile = host.create("Profile")
    host.with_object(profile, body)
    assert host.cell(profile, "owner") == "é"
    assert host.map(profile, "events", U64) == [(1, "x")]
    stored = {(e.field, e.key): e.value for e in host.entries(profile)}
    assert stored[("owner", b"")] == '"é"'.encode()
    assert stored[("events", b"\x00" * 7 + b"\x01")] == b'"x"'
