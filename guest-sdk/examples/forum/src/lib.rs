//! CloudForum, the LambdaStore paper's example application: accounts post
//! threads to communities and comment on threads. Each user action is one
//! workflow of nested calls across objects.

use lambdastore_sdk::prelude::*;
use serde::{Deserialize, Serialize};

/// How many threads `list_threads` returns by default.
const DEFAULT_LIST_LIMIT: u32 = 20;

/// A user.
#[lambda_object]
pub struct Account {
    name: Cell<String>,
}

/// A community: an ordered index of its threads.
#[lambda_object]
pub struct Community {
    name: Cell<String>,
    /// Keyed by (creation time, thread), so a reverse scan is newest first.
    threads: Map<(i64, ThreadRef), ThreadSummary>,
}

/// A thread and its comments.
#[lambda_object]
pub struct Thread {
    author: Cell<AccountRef>,
    community: Cell<CommunityRef>,
    title: Cell<String>,
    text: Cell<String>,
    comment_count: Cell<u64>,
    /// Keyed by comment id: 1, 2, … in posting order.
    comments: Map<u64, Comment>,
}

/// What a community keeps about each of its threads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadSummary {
    /// The thread's title.
    pub title: String,
    /// Who started it.
    pub author: AccountRef,
}

/// A comment, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Comment {
    /// Who wrote it.
    pub author: AccountRef,
    /// Its text.
    pub text: String,
    /// When (transaction time, microseconds since the epoch).
    pub at: i64,
}

/// A comment with its id, as `get_thread` returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommentView {
    /// Comment id, from 1.
    pub id: u64,
    /// The comment.
    #[serde(flatten)]
    pub comment: Comment,
}

/// A whole thread, as `get_thread` returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadView {
    /// The thread's object id.
    pub id: ThreadRef,
    /// Who started it.
    pub author: AccountRef,
    /// Where.
    pub community: CommunityRef,
    /// Its title.
    pub title: String,
    /// Its text.
    pub text: String,
    /// How many comments it has.
    pub comment_count: u64,
    /// Its comments, oldest first.
    pub comments: Vec<CommentView>,
}

/// A thread as `list_threads` returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadListing {
    /// The thread's object id.
    pub id: ThreadRef,
    /// When it was posted.
    pub at: i64,
    /// Its summary.
    #[serde(flatten)]
    pub summary: ThreadSummary,
}

fn non_empty(what: &str, value: &str) -> Result<()> {
    if value.trim().is_empty() {
        bail!("{what} must not be empty");
    }
    Ok(())
}

#[lambda_functions]
impl Account {
    /// A user called `name`.
    #[constructor]
    fn new(&self, name: String) -> Result<()> {
        non_empty("name", &name)?;
        self.name.set(&name);
        Ok(())
    }

    /// The user's name.
    #[readonly]
    fn name(&self) -> String {
        self.name.get_or_default()
    }

    /// Starts a thread in `community`; returns the new thread.
    fn create_thread(&self, community: CommunityRef, title: String, text: String) -> Result<ThreadRef> {
        let me = AccountRef::from_id(self_id());
        let thread = ThreadRef::new(me, community, title.clone(), text)?;
        // If the community refuses (or does not exist), the error undoes
        // the thread created above.
        community.add_thread(thread, title, me)?;
        Ok(thread)
    }

    /// Comments on `thread`; returns the comment's id.
    fn add_comment(&self, thread: ThreadRef, text: String) -> Result<u64> {
        Ok(thread.add_comment(AccountRef::from_id(self_id()), text)?)
    }
}

#[lambda_functions]
impl Community {
    /// A community called `name`.
    #[constructor]
    fn new(&self, name: String) -> Result<()> {
        non_empty("name", &name)?;
        self.name.set(&name);
        Ok(())
    }

    /// The community's name.
    #[readonly]
    fn name(&self) -> String {
        self.name.get_or_default()
    }

    /// Indexes a new thread. Protected: threads are added by
    /// `Account::create_thread`, not by clients.
    #[protected]
    fn add_thread(&self, thread: ThreadRef, title: String, author: AccountRef) {
        self.threads.insert(&(now_micros(), thread), &ThreadSummary { title, author });
    }

    /// The newest `limit` threads (default 20), newest first.
    #[readonly]
    fn list_threads(&self, limit: Option<u32>) -> Vec<ThreadListing> {
        self.threads
            .iter()
            .rev()
            .limit(limit.unwrap_or(DEFAULT_LIST_LIMIT))
            .map(|((at, id), summary)| ThreadListing { id, at, summary })
            .collect()
    }
}

#[lambda_functions]
impl Thread {
    /// A thread by `author` in `community`.
    #[constructor]
    fn new(&self, author: AccountRef, community: CommunityRef, title: String, text: String) -> Result<()> {
        non_empty("title", &title)?;
        self.author.set(&author);
        self.community.set(&community);
        self.title.set(&title);
        self.text.set(&text);
        self.comment_count.set(&0);
        Ok(())
    }

    /// Appends a comment; returns its id (the new comment count).
    /// Protected: comments are added by `Account::add_comment`.
    #[protected]
    fn add_comment(&self, author: AccountRef, text: String) -> Result<u64> {
        non_empty("comment", &text)?;
        let id = self.comment_count.get_or_default() + 1;
        self.comments.insert(&id, &Comment { author, text, at: now_micros() });
        self.comment_count.set(&id);
        Ok(id)
    }

    /// The thread with all its comments, oldest first.
    #[readonly]
    fn get_thread(&self) -> Result<ThreadView> {
        let (Some(author), Some(community)) = (self.author.get(), self.community.get()) else {
            bail!("thread {} is not initialized", self_id());
        };
        Ok(ThreadView {
            id: ThreadRef::from_id(self_id()),
            author,
            community,
            title: self.title.get_or_default(),
            text: self.text.get_or_default(),
            comment_count: self.comment_count.get_or_default(),
            comments: self.comments.iter().map(|(id, comment)| CommentView { id, comment }).collect(),
        })
    }
}

lambdastore_sdk::app!(Account, Community, Thread);

#[cfg(test)]
mod tests {
    use super::*;
    use lambdastore_sdk::mock::MockHost;
    use serde_json::json;

    struct Forum {
        host: MockHost,
        alice: ObjectId,
        bob: ObjectId,
        rust: ObjectId,
    }

    fn forum() -> Forum {
        let host = MockHost::for_app::<App>();
        let alice = host.create("Account", json!({"name": "alice"})).unwrap();
        let bob = host.create("Account", json!({"name": "bob"})).unwrap();
        let rust = host.create("Community", json!({"name": "rust"})).unwrap();
        Forum { host, alice, bob, rust }
    }

    fn post(f: &Forum, title: &str) -> ObjectId {
        let args = json!({"community": f.rust, "title": title, "text": "body"});
        f.host.invoke(f.alice, "create_thread", args).unwrap().as_i64().unwrap()
    }

    #[test]
    fn create_thread_creates_and_indexes_it() {
        let f = forum();
        let thread = post(&f, "hello");
        assert_eq!(f.host.object_type(thread).as_deref(), Some("Thread"));
        let view: ThreadView =
            serde_json::from_value(f.host.invoke(thread, "get_thread", json!(null)).unwrap()).unwrap();
        assert_eq!(view.id.id(), thread);
        assert_eq!((view.author.id(), view.community.id()), (f.alice, f.rust));
        assert_eq!((view.title.as_str(), view.comment_count), ("hello", 0));

        let listed = f.host.invoke(f.rust, "list_threads", json!([])).unwrap();
        assert_eq!(listed[0]["id"], json!(thread));
        assert_eq!(listed[0]["title"], json!("hello"));
        assert_eq!(listed[0]["author"], json!(f.alice));
    }

    #[test]
    fn list_threads_is_newest_first_and_limited() {
        let f = forum();
        let ids: Vec<ObjectId> = ["one", "two", "three"].iter().map(|t| post(&f, t)).collect();
        let listed = f.host.invoke(f.rust, "list_threads", json!({"limit": 2})).unwrap();
        let listed: Vec<i64> = listed.as_array().unwrap().iter().map(|t| t["id"].as_i64().unwrap()).collect();
        assert_eq!(listed, [ids[2], ids[1]]);
    }

    #[test]
    fn comments_are_numbered_and_kept_in_order() {
        let f = forum();
        let thread = post(&f, "hello");
        let comment = |who, text: &str| f.host.invoke(who, "add_comment", json!({"thread": thread, "text": text}));
        assert_eq!(comment(f.bob, "first").unwrap(), json!(1));
        assert_eq!(comment(f.alice, "second").unwrap(), json!(2));

        let view = f.host.invoke(thread, "get_thread", json!(null)).unwrap();
        assert_eq!(view["comment_count"], json!(2));
        let comments = view["comments"].as_array().unwrap();
        assert_eq!(comments[0]["id"], json!(1));
        assert_eq!(comments[0]["author"], json!(f.bob));
        assert_eq!(comments[0]["text"], json!("first"));
        assert_eq!(comments[1]["text"], json!("second"));
        assert!(comments[0]["at"].as_i64() < comments[1]["at"].as_i64());
    }

    #[test]
    fn protected_functions_are_not_for_clients() {
        let f = forum();
        let thread = post(&f, "hello");
        let err = f.host.invoke(thread, "add_comment", json!({"author": f.bob, "text": "spam"}));
        assert!(matches!(err, Err(CallError::NotAllowed(_))));
        let err = f.host.invoke(f.rust, "add_thread", json!([thread, "fake", f.bob]));
        assert!(matches!(err, Err(CallError::NotAllowed(_))));
    }

    #[test]
    fn a_failed_workflow_leaves_no_thread() {
        let f = forum();
        let before = f.host.objects().len();
        // The thread is created, then indexing fails: the community is not one.
        let args = json!({"community": f.bob, "title": "lost", "text": "body"});
        let err = f.host.invoke(f.alice, "create_thread", args).unwrap_err();
        assert_eq!(err, CallError::Application("unknown function Account.add_thread".into()));
        assert_eq!(f.host.objects().len(), before);
        // An empty title fails in the Thread constructor.
        let args = json!({"community": f.rust, "title": " ", "text": "body"});
        assert!(f.host.invoke(f.alice, "create_thread", args).is_err());
        assert_eq!(f.host.objects().len(), before);
        assert_eq!(f.host.invoke(f.rust, "list_threads", json!(null)).unwrap(), json!([]));
    }

    #[test]
    fn empty_comments_are_refused_without_side_effects() {
        let f = forum();
        let thread = post(&f, "hello");
        let err = f.host.invoke(f.bob, "add_comment", json!([thread, ""])).unwrap_err();
        assert_eq!(err, CallError::Application("comment must not be empty".into()));
        assert_eq!(f.host.cell::<u64>(thread, "comment_count"), Some(0));
    }
}
