"""CloudForum, the LambdaStore paper's example application: accounts post
threads to communities and comment on threads. Each user action is one
workflow of nested calls across objects. The Python twin of
guest-sdk/examples/forum: the same types, functions, stored bytes and errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from lambdastore import (
    U32, U64, App, Cell, LambdaError, Map, constructor, lambda_object, new, now_micros, protected, readonly, ref,
    self_id, stored_as,
)

#: How many threads `list_threads` returns by default.
DEFAULT_LIST_LIMIT = 20

#: What Rust's `str::trim` removes (Unicode White_Space); Python's
#: `str.strip()` also removes the separators U+001C..U+001F.
WHITESPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
    "\u2028\u2029\u202f\u205f\u3000"


@dataclass
class ThreadSummary:
    """What a community keeps about each of its threads."""

    title: str
    author: Account


@dataclass
class Comment:
    """A comment, as stored."""

    author: Account
    text: str
    #: When (transaction time, microseconds since the epoch).
    at: int


@dataclass
class CommentView:
    """A comment with its id (from 1), as `get_thread` returns it."""

    id: U64
    author: Account
    text: str
    at: int


@dataclass
class ThreadView:
    """A whole thread, as `get_thread` returns it; comments oldest first."""

    id: Thread
    author: Account
    community: Community
    title: str
    text: str
    comment_count: U64
    comments: list[CommentView]


@dataclass
class ThreadListing:
    """A thread as `list_threads` returns it."""

    id: Thread
    at: int
    title: str
    author: Account


def non_empty(what: str, value: str) -> None:
    if not value.strip(WHITESPACE):
        raise LambdaError(f"{what} must not be empty")


@lambda_object
class Account:
    """A user."""

    # The field `name`; the attribute `name` is the function.
    name_: Cell[str] = stored_as("name")

    @constructor
    def new(self, name: str):
        """A user called `name`."""
        non_empty("name", name)
        self.name_.set(name)

    @readonly
    def name(self) -> str:
        """The user's name."""
        return self.name_.get_or_default()

    def create_thread(self, community: Community, title: str, text: str) -> Thread:
        """Starts a thread in `community`; returns the new thread."""
        me = self_id()
        thread = new(Thread, author=me, community=community, title=title, text=text)
        # If the community refuses (or does not exist), the error undoes
        # the thread created above.
        ref(Community, community).add_thread(thread, title, me)
        return thread

    def add_comment(self, thread: Thread, text: str) -> U64:
        """Comments on `thread`; returns the comment's id."""
        return ref(Thread, thread).add_comment(author=self_id(), text=text)


@lambda_object
class Community:
    """A community: an ordered index of its threads."""

    name_: Cell[str] = stored_as("name")
    #: Keyed by (creation time, thread), so a reverse scan is newest first.
    threads: Map[tuple[int, Thread], ThreadSummary]

    @constructor
    def new(self, name: str):
        """A community called `name`."""
        non_empty("name", name)
        self.name_.set(name)

    @readonly
    def name(self) -> str:
        """The community's name."""
        return self.name_.get_or_default()

    @protected
    def add_thread(self, thread: Thread, title: str, author: Account):
        """Indexes a new thread. Protected: threads are added by
        `Account.create_thread`, not by clients."""
        self.threads.insert((now_micros(), thread), ThreadSummary(title, author))

    @readonly
    def list_threads(self, limit: Optional[U32]) -> list[ThreadListing]:
        """The newest `limit` threads (default 20), newest first."""
        newest = self.threads.iter().rev().limit(DEFAULT_LIST_LIMIT if limit is None else limit)
        return [ThreadListing(thread, at, summary.title, summary.author) for (at, thread), summary in newest]


@lambda_object
class Thread:
    """A thread and its comments."""

    author: Cell[Account]
    community: Cell[Community]
    title: Cell[str]
    text: Cell[str]
    comment_count: Cell[U64]
    #: Keyed by comment id: 1, 2, ... in posting order.
    comments: Map[U64, Comment]

    @constructor
    def new(self, author: Account, community: Community, title: str, text: str):
        """A thread by `author` in `community`."""
        non_empty("title", title)
        self.author.set(author)
        self.community.set(community)
        self.title.set(title)
        self.text.set(text)
        self.comment_count.set(0)

    @protected
    def add_comment(self, author: Account, text: str) -> U64:
        """Appends a comment; returns its id (the new comment count).
        Protected: comments are added by `Account.add_comment`."""
        non_empty("comment", text)
        comment_id = self.comment_count.get_or_default() + 1
        self.comments.insert(comment_id, Comment(author, text, now_micros()))
        self.comment_count.set(comment_id)
        return comment_id

    @readonly
    def get_thread(self) -> ThreadView:
        """The thread with all its comments, oldest first."""
        author, community = self.author.get(), self.community.get()
        if author is None or community is None:
            raise LambdaError(f"thread {self_id()} is not initialized")
        return ThreadView(
            id=self_id(),
            author=author,
            community=community,
            title=self.title.get_or_default(),
            text=self.text.get_or_default(),
            comment_count=self.comment_count.get_or_default(),
            comments=[CommentView(i, c.author, c.text, c.at) for i, c in self.comments.iter()],
        )


app = App(Account, Community, Thread)
WitWorld = app.wit_world()
