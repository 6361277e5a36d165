//! The tape of a call forwarded to another node: what its earlier runs
//! drew from the host, replayed in order, and what this run draws.
//!
//! A call that needs a call on a third node stops there and runs again once
//! the node that drives the transaction has made it (cluster/remote.rs). The
//! second run must take the same path as the first up to that point: it
//! reads the same entries (nothing else in the transaction may touch them
//! meanwhile, and OCC validates them at commit), and it gets from the tape
//! what the host would otherwise make up afresh. A run that asks for
//! something else than the tape holds at that point went another way (a
//! concurrent commit changed what it read): the transaction must retry.

use crate::model::{CallFailure, Draw, MethodCall};

/// A forwarded call's run went another way than an earlier run of it.
#[derive(Debug, PartialEq, Eq)]
pub struct Diverged;

#[derive(Debug, Default)]
pub struct Tape {
    /// What the earlier runs drew, in order.
    earlier: Vec<Draw>,
    /// What this run has drawn so far (a prefix of `earlier`, then new draws).
    drawn: Vec<Draw>,
}

impl Tape {
    pub fn new(earlier: Vec<Draw>) -> Self {
        Tape { earlier, drawn: Vec::new() }
    }

    /// The draw an earlier run made at this point, which must be of the
    /// kind `same` accepts; None past what the earlier runs drew (draw
    /// afresh and `record` it).
    pub fn replay(&mut self, same: impl Fn(&Draw) -> bool) -> Result<Option<Draw>, Diverged> {
        let Some(earlier) = self.earlier.get(self.drawn.len()) else { return Ok(None) };
        if !same(earlier) {
            return Err(Diverged);
        }
        let earlier = earlier.clone();
        self.drawn.push(earlier.clone());
        Ok(Some(earlier))
    }

    pub fn record(&mut self, draw: Draw) {
        self.drawn.push(draw);
    }

    /// The outcome of `call` as an earlier run got it at this point; None
    /// past what they drew (the call is needed).
    pub fn replay_call(&mut self, call: &MethodCall) -> Result<Option<Result<String, CallFailure>>, Diverged> {
        let same = |draw: &Draw| matches!(draw, Draw::Call { call: earlier, .. } if earlier == call);
        Ok(self.replay(same)?.map(|draw| match draw {
            Draw::Call { outcome, .. } => outcome,
            _ => unreachable!("replay checked the kind"),
        }))
    }

    /// What this run drew, in order.
    pub fn drawn(&self) -> &[Draw] {
        &self.drawn
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(object: i64, args: &str) -> MethodCall {
        MethodCall { object, method: "m".into(), args: args.into(), readonly: false, depth: 1 }
    }

    fn is_random(draw: &Draw) -> bool {
        matches!(draw, Draw::Random(_))
    }

    #[test]
    fn a_run_gets_what_the_earlier_run_drew_then_draws_afresh() {
        let earlier = vec![Draw::Random(7), Draw::Call { call: call(2, "{}"), outcome: Ok("1".into()) }];
        let mut tape = Tape::new(earlier.clone());
        assert_eq!(tape.replay(is_random), Ok(Some(Draw::Random(7))));
        assert_eq!(tape.replay_call(&call(2, "{}")), Ok(Some(Ok("1".into()))));
        assert_eq!(tape.replay(is_random), Ok(None), "past the tape");
        tape.record(Draw::Random(9));
        assert_eq!(tape.replay_call(&call(3, "{}")), Ok(None), "a call no run made yet is needed");
        let mut expected = earlier;
        expected.push(Draw::Random(9));
        assert_eq!(tape.drawn(), expected.as_slice());
    }

    #[test]
    fn a_run_that_asks_for_something_else_diverged() {
        let mut tape = Tape::new(vec![Draw::Call {
            call: call(2, r#"{"n":1}"#),
            outcome: Err(CallFailure::Application("no".into())),
        }]);
        assert_eq!(tape.replay_call(&call(2, r#"{"n":2}"#)), Err(Diverged), "other arguments");
        let mut tape = Tape::new(vec![Draw::Now(5)]);
        assert_eq!(tape.replay(is_random), Err(Diverged), "another kind of draw");
    }

    #[test]
    fn a_callees_own_error_is_replayed_as_such() {
        let mut tape = Tape::new(vec![Draw::Call {
            call: call(2, "{}"),
            outcome: Err(CallFailure::Application("insufficient".into())),
        }]);
        assert_eq!(tape.replay_call(&call(2, "{}")), Ok(Some(Err(CallFailure::Application("insufficient".into())))));
    }
}
