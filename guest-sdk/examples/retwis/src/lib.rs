//! Retwis, the Twitter clone of the LambdaStore paper's evaluation: users
//! follow users, post short texts, and read a timeline of the newest posts
//! of everyone they follow (and their own).
//!
//! Posting fans out on write: `create_post` makes one synchronous nested
//! call per follower inside its workflow (the paper's "map call"), so that
//! reading a timeline is one range scan of one object.
//!
//! # Stored layout
//!
//! `bench/sql` has PL/pgSQL and raw-SQL baselines that read and write these
//! rows of `lambdastore.entries` directly, so the layout is part of the
//! benchmark's contract:
//!
//! | field | key | value |
//! | --- | --- | --- |
//! | `name` | empty (a cell) | JSON string |
//! | `post_count` | empty (a cell) | JSON number: the author's last post id |
//! | `followers` | the follower's id (`i64`, sign bit flipped, big-endian) | empty |
//! | `posts` | post id (`u64`, big-endian) | [`Post`] as JSON |
//! | `timeline` | (`at`, author, post id): 3 × 8 bytes | [`Post`] as JSON |
//!
//! A post is identified by (author, post id), post ids counting 1, 2, … per
//! author, so timeline keys are unique without host randomness and a reverse
//! scan of `timeline` is newest first (ties in `at` by author, then id).

use lambdastore_sdk::prelude::*;
use serde::{Deserialize, Serialize};

/// How many posts `get_timeline` returns by default.
const DEFAULT_TIMELINE_LIMIT: u32 = 50;

/// A user: their own posts and their timeline.
#[lambda_object]
pub struct User {
    name: Cell<String>,
    /// The id of this user's newest post (0 before the first).
    post_count: Cell<u64>,
    /// Who receives this user's posts.
    followers: Set<UserRef>,
    /// This user's posts, by post id.
    posts: Map<u64, Post>,
    /// Own and followed users' posts, keyed so that a reverse scan is newest first.
    timeline: Map<(i64, UserRef, u64), Post>,
}

/// A post, as stored (in its author's posts and in every timeline it was
/// delivered to) and as `get_timeline` returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Post {
    /// Who wrote it.
    pub author: UserRef,
    /// Its id among its author's posts: 1, 2, … in posting order.
    pub id: u64,
    /// When (host clock, microseconds since the Unix epoch).
    pub at: i64,
    /// Its text.
    pub text: String,
}

impl Post {
    fn timeline_key(&self) -> (i64, UserRef, u64) {
        (self.at, self.author, self.id)
    }
}

fn me() -> UserRef {
    UserRef::from_id(self_id())
}

#[lambda_functions]
impl User {
    /// A user called `name`.
    #[constructor]
    fn new(&self, name: String) -> Result<()> {
        if name.trim().is_empty() {
            bail!("name must not be empty");
        }
        self.name.set(&name);
        self.post_count.set(&0);
        Ok(())
    }

    /// Makes this user a follower of `target`: `target`'s posts from now on
    /// appear in this user's timeline.
    fn follow(&self, target: UserRef) -> Result<()> {
        if target == me() {
            bail!("a user cannot follow themselves");
        }
        Ok(target.add_follower(me())?)
    }

    /// Records `follower`. Protected: followers are added by `follow`.
    #[protected]
    fn add_follower(&self, follower: UserRef) {
        self.followers.insert(&follower);
    }

    /// Bulk setup: adds every one of `followers` as a follower of this user
    /// in one call, instead of one `follow` workflow each. The followers are
    /// not checked to exist: one that does not makes `create_post` fail.
    fn add_followers(&self, followers: Vec<UserRef>) -> Result<()> {
        if followers.contains(&me()) {
            bail!("a user cannot follow themselves");
        }
        for follower in &followers {
            self.followers.insert(follower);
        }
        Ok(())
    }

    /// Posts `text`: stores it in this user's posts and timeline and
    /// delivers it to every follower's timeline, all in this one workflow.
    /// Returns the new post's id.
    fn create_post(&self, text: String) -> Result<u64> {
        let id = self.post_count.get_or_default() + 1;
        self.post_count.set(&id);
        let post = Post { author: me(), id, at: now_micros(), text };
        self.posts.insert(&id, &post);
        self.timeline.insert(&post.timeline_key(), &post);
        for follower in self.followers.iter() {
            follower.deliver(post.clone())?;
        }
        Ok(id)
    }

    /// Adds `post` to this user's timeline. Protected: posts are delivered
    /// by their author's `create_post`.
    #[protected]
    fn deliver(&self, post: Post) {
        self.timeline.insert(&post.timeline_key(), &post);
    }

    /// The newest `limit` posts (default 50) of this user's timeline, newest first.
    #[readonly]
    fn get_timeline(&self, limit: Option<u32>) -> Vec<Post> {
        self.timeline.iter().rev().limit(limit.unwrap_or(DEFAULT_TIMELINE_LIMIT)).map(|(_, post)| post).collect()
    }
}

lambdastore_sdk::app!(User);

#[cfg(test)]
mod tests {
    use super::*;
    use lambdastore_sdk::mock::MockHost;
    use serde_json::json;

    fn user(host: &MockHost, name: &str) -> ObjectId {
        host.create("User", json!({"name": name})).unwrap()
    }

    fn post(host: &MockHost, author: ObjectId, text: &str) -> u64 {
        let id = host.invoke(author, "create_post", json!({"text": text}));
        id.unwrap().as_u64().unwrap()
    }

    fn timeline(host: &MockHost, user: ObjectId, limit: Option<u32>) -> Vec<Post> {
        let posts = host.invoke(user, "get_timeline", json!({"limit": limit}));
        serde_json::from_value(posts.unwrap()).unwrap()
    }

    fn texts(posts: &[Post]) -> Vec<&str> {
        posts.iter().map(|p| p.text.as_str()).collect()
    }

    #[test]
    fn a_post_reaches_the_author_and_every_follower() {
        let host = MockHost::for_app::<App>();
        let ada = user(&host, "ada");
        let followers: Vec<ObjectId> = (0..20).map(|i| user(&host, &format!("f{i}"))).collect();
        let outsider = user(&host, "outsider");
        host.invoke(ada, "add_followers", json!({"followers": followers})).unwrap();

        assert_eq!(post(&host, ada, "hello"), 1);

        let expected =
            Post { author: UserRef::from_id(ada), id: 1, at: timeline(&host, ada, None)[0].at, text: "hello".into() };
        for reader in followers.into_iter().chain([ada]) {
            assert_eq!(timeline(&host, reader, None), std::slice::from_ref(&expected));
        }
        assert_eq!(timeline(&host, outsider, None), []);
        assert_eq!(host.map::<u64, Post>(ada, "posts"), [(1, expected)]);
    }

    #[test]
    fn follow_subscribes_to_later_posts() {
        let host = MockHost::for_app::<App>();
        let (ada, bob) = (user(&host, "ada"), user(&host, "bob"));
        post(&host, ada, "before");
        host.invoke(bob, "follow", json!({"target": ada})).unwrap();
        post(&host, ada, "after");
        assert_eq!(texts(&timeline(&host, bob, None)), ["after"]);
        assert_eq!(
            host.invoke(ada, "follow", json!([ada])),
            Err(CallError::Application("a user cannot follow themselves".into()))
        );
    }

    #[test]
    fn timeline_is_newest_first_across_authors() {
        let host = MockHost::for_app::<App>();
        let (ada, bob, cy) = (user(&host, "ada"), user(&host, "bob"), user(&host, "cy"));
        host.invoke(cy, "follow", json!([ada])).unwrap();
        host.invoke(cy, "follow", json!([bob])).unwrap();
        // The mock's clock advances between workflows.
        post(&host, ada, "a1");
        post(&host, bob, "b1");
        post(&host, cy, "c1");
        post(&host, ada, "a2");

        let posts = timeline(&host, cy, None);
        assert_eq!(texts(&posts), ["a2", "c1", "b1", "a1"]);
        assert!(posts.windows(2).all(|w| w[0].at > w[1].at));
        let ids: Vec<(ObjectId, u64)> = posts.iter().map(|p| (p.author.id(), p.id)).collect();
        assert_eq!(ids, [(ada, 2), (cy, 1), (bob, 1), (ada, 1)]);
    }

    #[test]
    fn timeline_limit_defaults_to_50() {
        let host = MockHost::for_app::<App>();
        let ada = user(&host, "ada");
        for i in 0..60 {
            post(&host, ada, &format!("p{i}"));
        }
        let all = timeline(&host, ada, None);
        assert_eq!(all.len(), 50);
        assert_eq!((all[0].id, all[49].id), (60, 11));
        assert_eq!(texts(&timeline(&host, ada, Some(3))), ["p59", "p58", "p57"]);
        assert_eq!(timeline(&host, ada, Some(0)), []);
        assert_eq!(host.cell::<u64>(ada, "post_count"), Some(60));
    }

    #[test]
    fn posts_in_one_microsecond_keep_their_order() {
        let host = MockHost::for_app::<App>();
        let ada = user(&host, "ada");
        host.set_now_micros(5);
        post(&host, ada, "first");
        host.set_now_micros(5);
        post(&host, ada, "second");
        assert_eq!(texts(&timeline(&host, ada, None)), ["second", "first"]);
    }

    #[test]
    fn protected_functions_are_not_for_clients() {
        let host = MockHost::for_app::<App>();
        let (ada, bob) = (user(&host, "ada"), user(&host, "bob"));
        let forged = json!({"post": {"author": ada, "id": 7, "at": 1, "text": "forged"}});
        assert!(matches!(host.invoke(bob, "deliver", forged), Err(CallError::NotAllowed(_))));
        assert!(matches!(host.invoke(ada, "add_follower", json!([bob])), Err(CallError::NotAllowed(_))));
        assert_eq!(timeline(&host, bob, None), []);
    }

    #[test]
    fn a_missing_follower_fails_the_whole_post() {
        let host = MockHost::for_app::<App>();
        let (ada, bob) = (user(&host, "ada"), user(&host, "bob"));
        host.invoke(ada, "add_followers", json!([[bob, 999_999]])).unwrap();
        let err = host.invoke(ada, "create_post", json!(["lost"]));
        assert!(err.is_err(), "{err:?}");
        // Nothing of the workflow is kept: not the counter, not bob's copy.
        assert_eq!(host.cell::<u64>(ada, "post_count"), Some(0));
        assert_eq!(timeline(&host, ada, None), []);
        assert_eq!(timeline(&host, bob, None), []);
    }

    #[test]
    fn get_timeline_is_readonly() {
        let host = MockHost::for_app::<App>();
        let desc = &host.app().types[0];
        let readonly: Vec<&str> = desc.functions.iter().filter(|f| f.readonly).map(|f| f.name.as_str()).collect();
        assert_eq!(readonly, ["get_timeline"]);
    }
}
