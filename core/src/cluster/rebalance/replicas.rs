//! The light-replica half of a rebalancing plan: which hot objects get
//! one more light replica and which replicas go, from the CPU time each
//! object's calls kept the nodes busy since the last run (the extension's
//! cluster/affinity.rs). A light replica spreads an object's compute, not
//! its writes: the owner still validates and applies every write.
//!
//! Per object, at most one step per run:
//! - **drop** a replica that can no longer serve (its object is gone, or
//!   now stored on the replica's node, or the node left the cluster);
//! - **drop** one replica it added itself (the last) when the object's
//!   calls mostly wrote, or when, with one server fewer, each would be busy
//!   under half of `threshold` cores; a replica added by hand
//!   (`add_light_replica`) stays until it is dropped by hand or can no
//!   longer serve: whoever placed it had a reason the counts do not show;
//! - **add** one on the least busy node that is neither its owner nor a
//!   replica, when the object's calls mostly read and each of its servers
//!   (owner and replicas) was busy at least `threshold` cores with them.
//!
//! Adding at `threshold` per server and dropping under half of it leaves a
//! band between, so that a steady load neither adds nor drops.

use super::Object;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A window shorter than this counts as this long: one slow call in a
/// window of a few milliseconds is no sustained load.
pub const MIN_WINDOW_S: f64 = 1.0;

/// An existing light replica.
#[derive(Deserialize, Clone, Debug)]
pub struct ReplicaAt {
    pub object_id: i64,
    pub node: String,
    /// Added by a rebalancing run (else by hand): only those go when the
    /// load falls.
    #[serde(default)]
    pub by_rebalancer: bool,
}

#[derive(Serialize, Debug, PartialEq, Clone, Copy)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Add,
    Drop,
}

#[derive(Serialize, Debug, PartialEq)]
pub struct ReplicaStep {
    pub object_id: i64,
    pub node: String,
    pub action: Action,
    pub reason: String,
}

/// What the light-replica half of a plan reads besides the objects: the
/// JSON fields of `rebalance::Input` that belong to it.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct Input {
    /// The light replicas of the objects planned for, and of objects that
    /// no longer exist; last added last.
    pub replicas: Vec<ReplicaAt>,
    /// Nodes a replica may be on (every active primary).
    pub replica_nodes: Vec<String>,
    /// CPU time calls took on each node.
    pub busy_ms_by_node: BTreeMap<String, f64>,
    /// Seconds the counts cover; None if nothing was counted.
    pub window_s: Option<f64>,
    /// Cores (`lambdastore.light_replica_threshold`); 0 leaves replicas
    /// alone, except those that cannot serve.
    pub replica_threshold: f64,
}

/// The steps, in object order.
pub fn plan(objects: &[Object], input: &Input) -> Vec<ReplicaStep> {
    let mut replicas_of: BTreeMap<i64, Vec<&ReplicaAt>> = BTreeMap::new();
    let mut steps = Vec::new();
    for replica in &input.replicas {
        let object = objects.iter().find(|o| o.id == replica.object_id);
        let broken = match object {
            None => Some("the object no longer exists".to_string()),
            Some(o) if o.node == replica.node => Some(format!("the object is stored on {} now", o.node)),
            Some(_) if !input.replica_nodes.contains(&replica.node) => {
                Some("the node is not an active node".to_string())
            }
            Some(_) => None,
        };
        match broken {
            Some(reason) => steps.push(step(replica.object_id, &replica.node, Action::Drop, reason)),
            None => replicas_of.entry(replica.object_id).or_default().push(replica),
        }
    }
    if input.replica_threshold <= 0.0 {
        return steps;
    }
    let seconds = input.window_s.unwrap_or(MIN_WINDOW_S).max(MIN_WINDOW_S);
    let mut busy_by_node = input.busy_ms_by_node.clone();
    let mut objects: Vec<&Object> = objects.iter().collect();
    objects.sort_by_key(|o| o.id);
    for o in objects {
        let mine = replicas_of.get(&o.id).map(Vec::as_slice).unwrap_or_default();
        let replicas: Vec<&str> = mine.iter().map(|r| r.node.as_str()).collect();
        let last_ours = mine.iter().rev().find(|r| r.by_rebalancer);
        let cores = o.busy_ms / 1000.0 / seconds;
        let mostly_writes = o.writes * 2 > o.calls;
        let load = || {
            format!(
                "its calls kept {cores:.2} cores busy over {seconds:.0} s on {} nodes (threshold {} per node), {} of {} wrote",
                replicas.len() + 1,
                input.replica_threshold,
                o.writes,
                o.calls
            )
        };
        if mostly_writes {
            if let Some(last) = last_ours {
                let reason = format!("{}: replicas spread compute, not writes", load());
                steps.push(step(o.id, &last.node, Action::Drop, reason));
            }
        } else if let Some(last) = last_ours.filter(|_| cores / (replicas.len() as f64) < input.replica_threshold / 2.0)
        {
            steps.push(step(o.id, &last.node, Action::Drop, format!("the load fell: {}", load())));
        } else {
            add_if_hot(o, &replicas, cores, input, &mut busy_by_node, &load, &mut steps);
        }
    }
    steps
}

fn add_if_hot(
    o: &Object,
    replicas: &[&str],
    cores: f64,
    input: &Input,
    busy_by_node: &mut BTreeMap<String, f64>,
    load: &dyn Fn() -> String,
    steps: &mut Vec<ReplicaStep>,
) {
    if cores / ((replicas.len() + 1) as f64) < input.replica_threshold {
        return;
    }
    let busy = |node: &str| busy_by_node.get(node).copied().unwrap_or(0.0);
    let target = input
        .replica_nodes
        .iter()
        .filter(|n| **n != o.node && !replicas.contains(&n.as_str()))
        .min_by(|a, b| busy(a).total_cmp(&busy(b)));
    if let Some(node) = target {
        // The new replica takes its share: the next hot object goes elsewhere.
        let share = o.busy_ms / (replicas.len() + 2) as f64;
        *busy_by_node.entry(node.clone()).or_default() += share;
        steps.push(step(o.id, node, Action::Add, load()));
    }
}

fn step(object_id: i64, node: &str, action: Action, reason: String) -> ReplicaStep {
    ReplicaStep { object_id, node: node.to_string(), action, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: [&str; 3] = ["coord", "w1", "w2"];

    fn nodes() -> Vec<String> {
        NODES.iter().map(|n| n.to_string()).collect()
    }

    fn object(id: i64, owner: &str, calls: i64, writes: i64, busy_ms: f64) -> Object {
        Object { id, node: owner.to_string(), calls, writes, busy_ms }
    }

    /// Replicas the rebalancer added.
    fn replicas(of: &[(i64, &str)]) -> Vec<ReplicaAt> {
        of.iter().map(|(id, node)| ReplicaAt { object_id: *id, node: node.to_string(), by_rebalancer: true }).collect()
    }

    fn run(
        objects: Vec<Object>,
        existing: &[(i64, &str)],
        busy: &[(&str, f64)],
        window_s: Option<f64>,
    ) -> Vec<ReplicaStep> {
        let input = Input {
            replicas: replicas(existing),
            replica_nodes: nodes(),
            busy_ms_by_node: busy.iter().map(|(n, ms)| (n.to_string(), *ms)).collect(),
            window_s,
            replica_threshold: 0.5,
        };
        plan(&objects, &input)
    }

    fn actions(steps: &[ReplicaStep]) -> Vec<(i64, &str, Action)> {
        steps.iter().map(|s| (s.object_id, s.node.as_str(), s.action)).collect()
    }

    #[test]
    fn a_hot_object_whose_calls_read_gets_a_replica_on_the_least_busy_node() {
        // 9 s of calls in 10 s: 0.9 cores; w2 is busier than the coordinator.
        let steps = run(vec![object(1, "w1", 900, 0, 9000.0)], &[], &[("w1", 9000.0), ("w2", 500.0)], Some(10.0));
        assert_eq!(actions(&steps), vec![(1, "coord", Action::Add)], "{steps:?}");
        assert!(steps[0].reason.contains("0.90 cores"), "{}", steps[0].reason);
    }

    #[test]
    fn an_object_as_hot_whose_calls_write_gets_none() {
        let steps = run(vec![object(1, "w1", 900, 600, 9000.0)], &[], &[], Some(10.0));
        assert!(steps.is_empty(), "{steps:?}");
    }

    #[test]
    fn a_second_replica_only_while_each_server_stays_busy() {
        // Two servers at 0.6 cores each: a third.
        let more = run(vec![object(1, "w1", 1200, 0, 12000.0)], &[(1, "w2")], &[], Some(10.0));
        assert_eq!(actions(&more), vec![(1, "coord", Action::Add)]);
        // Two servers at 0.4 each: within the band, nothing.
        assert!(run(vec![object(1, "w1", 800, 0, 8000.0)], &[(1, "w2")], &[], Some(10.0)).is_empty());
        // Every other node is one already: nothing more to add.
        assert!(run(vec![object(1, "w1", 9000, 0, 90000.0)], &[(1, "w2"), (1, "coord")], &[], Some(10.0)).is_empty());
    }

    #[test]
    fn replicas_go_one_per_run_as_the_load_falls_or_turns_to_writes() {
        let two = [(1, "w2"), (1, "coord")];
        // 0.3 cores for two servers after a drop: 0.15 each, under 0.25.
        let fell = run(vec![object(1, "w1", 300, 0, 3000.0)], &two, &[], Some(10.0));
        assert_eq!(actions(&fell), vec![(1, "coord", Action::Drop)], "the last added goes first");
        // Nothing counted at all: the load is gone.
        let idle = run(vec![object(1, "w1", 0, 0, 0.0)], &[(1, "w2")], &[], None);
        assert_eq!(actions(&idle), vec![(1, "w2", Action::Drop)]);
        let writes = run(vec![object(1, "w1", 900, 800, 9000.0)], &two, &[], Some(10.0));
        assert_eq!(actions(&writes), vec![(1, "coord", Action::Drop)]);
        assert!(writes[0].reason.contains("not writes"), "{}", writes[0].reason);
    }

    #[test]
    fn a_replica_added_by_hand_stays_when_the_load_falls_or_turns_to_writes() {
        let plan_for = |existing: &[ReplicaAt], objects: &[Object]| {
            let input = Input {
                replicas: existing.to_vec(),
                replica_nodes: nodes(),
                window_s: Some(10.0),
                replica_threshold: 0.5,
                ..Input::default()
            };
            actions(&plan(objects, &input))
                .into_iter()
                .map(|(id, node, a)| (id, node.to_string(), a))
                .collect::<Vec<_>>()
        };
        let (idle, writing) = (object(1, "w1", 0, 0, 0.0), object(1, "w1", 900, 800, 9000.0));
        let mut existing = replicas(&[(1, "w2"), (1, "coord")]);
        // The last added was placed by hand: the rebalancer's own goes, never that one.
        existing[1].by_rebalancer = false;
        let ours = vec![(1, "w2".to_string(), Action::Drop)];
        assert_eq!(plan_for(&existing, std::slice::from_ref(&idle)), ours);
        assert_eq!(plan_for(&existing, std::slice::from_ref(&writing)), ours);
        existing.remove(0);
        assert!(plan_for(&existing, &[idle]).is_empty());
        assert!(plan_for(&existing, &[writing]).is_empty());
        // It still counts as a server: 0.6 cores over two is not enough for a third.
        assert!(plan_for(&existing, &[object(1, "w1", 600, 0, 6000.0)]).is_empty());
        // Gone with its object, as any replica.
        assert_eq!(plan_for(&existing, &[]), vec![(1, "coord".to_string(), Action::Drop)]);
    }

    #[test]
    fn replicas_that_cannot_serve_are_dropped_even_with_the_policy_off() {
        let input = Input {
            replicas: replicas(&[(1, "w1"), (2, "gone:1"), (3, "w2")]),
            replica_nodes: nodes(),
            ..Input::default()
        };
        let steps = plan(&[object(1, "w1", 0, 0, 0.0), object(2, "w1", 0, 0, 0.0)], &input);
        let why: Vec<_> = steps.iter().map(|s| (s.object_id, s.reason.as_str())).collect();
        assert_eq!(
            why,
            vec![
                (1, "the object is stored on w1 now"),
                (2, "the node is not an active node"),
                (3, "the object no longer exists")
            ]
        );
    }

    #[test]
    fn a_short_window_counts_as_a_second() {
        // One 400 ms call seen in a window of 10 ms: 0.4 cores, not 40.
        assert!(run(vec![object(1, "w1", 1, 0, 400.0)], &[], &[], Some(0.01)).is_empty());
    }

    #[test]
    fn two_hot_objects_of_one_node_get_replicas_on_different_nodes() {
        let steps = run(
            vec![object(1, "w1", 900, 0, 9000.0), object(2, "w1", 900, 0, 9000.0)],
            &[],
            &[("w1", 18000.0)],
            Some(10.0),
        );
        assert_eq!(actions(&steps), vec![(1, "coord", Action::Add), (2, "w2", Action::Add)]);
    }
}
