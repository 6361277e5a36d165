//! The plan of `lambdastore.rebalance()`: which objects to move to which
//! node, from the calls counted since the last run (the extension's
//! cluster/affinity.rs). Pure, so that its unit tests run without a server.
//!
//! Two aims, in this order, greedily, one move at a time, each object at
//! most once per run and at most `max_moves` moves:
//! 1. Even out load. While the busiest node received more than
//!    (1 + `tolerance`) times the mean of calls, move the object from it to
//!    the least busy node that lowers the higher of the two loads most
//!    (a hot object, on a skewed load), losing the fewest partner calls.
//! 2. Bring partners together. Move the object whose move keeps the most
//!    nested calls on one node: calls with objects on the target node less
//!    calls with objects on its own, if positive, and only where the target
//!    stays within the bound of aim 1, so the two aims never undo each
//!    other and a second run over the same counts plans nothing.
//!
//! Load is calls received; a pair's calls count in both directions.
//!
//! Before both, the light replicas (replicas.rs): an object that has
//! replicas after this run is not moved, nor counted in any node's load:
//! its replicas are where its load goes.

pub mod replicas;

use replicas::{ReplicaAt, ReplicaStep};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, HashSet};

#[derive(Deserialize)]
pub struct Input {
    /// The nodes that may hold objects (host:port).
    pub nodes: Vec<String>,
    pub objects: Vec<Object>,
    pub pairs: Vec<Pair>,
    pub max_moves: usize,
    pub tolerance: f64,
    /// The light replicas' part (replicas.rs).
    #[serde(flatten)]
    pub light: replicas::Input,
}

#[derive(Deserialize)]
pub struct Object {
    pub id: i64,
    pub node: String,
    /// Calls it received.
    pub calls: i64,
    /// Of them, calls that wrote entries (top-level calls only).
    #[serde(default)]
    pub writes: i64,
    /// CPU time its top-level calls took, on every node.
    #[serde(default)]
    pub busy_ms: f64,
}

/// Nested calls `from` made to `to`.
#[derive(Deserialize)]
pub struct Pair {
    pub from: i64,
    pub to: i64,
    pub calls: i64,
}

#[derive(Serialize, Debug)]
pub struct Plan {
    pub moves: Vec<Move>,
    /// Light replicas to add and drop.
    pub replicas: Vec<ReplicaStep>,
    /// Nested calls between the objects planned for.
    pub nested_calls: i64,
    /// Of them, between objects on two nodes: now, and had the moves been
    /// made before these calls.
    pub cross_node_calls: Effect<i64>,
    pub cross_node_share: Effect<f64>,
    /// Calls received per node.
    pub load: Effect<BTreeMap<String, i64>>,
}

#[derive(Serialize, Debug)]
pub struct Effect<T> {
    pub before: T,
    pub after: T,
}

#[derive(Serialize, Debug, PartialEq)]
pub struct Move {
    pub object_id: i64,
    pub from: String,
    pub to: String,
    pub reason: String,
}

struct Model<'a> {
    nodes: &'a [String],
    node_of: HashMap<i64, usize>,
    calls: HashMap<i64, i64>,
    /// Per object, its partners and the calls between them (both ways).
    partners: HashMap<i64, Vec<(i64, i64)>>,
    load: Vec<i64>,
    moved: HashSet<i64>,
    tolerance: f64,
}

impl Model<'_> {
    /// Calls between `object` and objects on each node.
    fn partner_calls(&self, object: i64) -> Vec<i64> {
        let mut on = vec![0; self.nodes.len()];
        for (partner, calls) in self.partners.get(&object).into_iter().flatten() {
            on[self.node_of[partner]] += calls;
        }
        on
    }

    fn cap(&self) -> f64 {
        let total: i64 = self.load.iter().sum();
        total as f64 / self.nodes.len() as f64 * (1.0 + self.tolerance)
    }

    fn movable(&self) -> impl Iterator<Item = (i64, usize, i64)> + '_ {
        let mut objects: Vec<_> =
            self.node_of.iter().filter(|(id, _)| !self.moved.contains(id)).map(|(id, node)| (*id, *node)).collect();
        objects.sort_unstable();
        objects.into_iter().map(|(id, node)| (id, node, self.calls[&id]))
    }

    fn balancing_move(&self) -> Option<Move> {
        let busiest = (0..self.nodes.len()).max_by_key(|n| (self.load[*n], Reverse(*n)))?;
        let idlest = (0..self.nodes.len()).min_by_key(|n| (self.load[*n], *n))?;
        if (self.load[busiest] as f64) <= self.cap() {
            return None;
        }
        let (object, calls) = self
            .movable()
            .filter(|(_, node, calls)| *node == busiest && *calls > 0)
            .map(|(id, _, calls)| {
                let higher = (self.load[busiest] - calls).max(self.load[idlest] + calls);
                let on = self.partner_calls(id);
                // Ties: the fewest partner calls lost, then the most load
                // moved (fewer moves in all).
                (higher, on[busiest] - on[idlest], Reverse(calls), id)
            })
            .filter(|(higher, ..)| *higher < self.load[busiest])
            .min()
            .map(|(_, _, Reverse(calls), id)| (id, calls))?;
        Some(self.make(
            object,
            idlest,
            format!(
                "load: {} received {} of {} calls (mean {:.0}), this object {}",
                self.nodes[busiest],
                self.load[busiest],
                self.load.iter().sum::<i64>(),
                self.load.iter().sum::<i64>() as f64 / self.nodes.len() as f64,
                calls
            ),
        ))
    }

    /// The best affinity move within the bound; where every one would
    /// pass it, the best swap with an object of the target node (two
    /// moves), if `room` allows.
    fn affinity_moves(&self, room: usize) -> Option<Vec<Move>> {
        let cap = self.cap();
        let within = |load: i64| load as f64 <= cap;
        let movable: Vec<(i64, usize, i64)> = self.movable().collect();
        let on: HashMap<i64, Vec<i64>> = movable.iter().map(|&(id, ..)| (id, self.partner_calls(id))).collect();
        // (object, its node, its calls, target, partner calls gained)
        let candidates: Vec<_> = movable
            .iter()
            .flat_map(|&(id, node, calls)| {
                let on = &on[&id];
                (0..self.nodes.len()).map(move |target| (id, node, calls, target, on[target] - on[node]))
            })
            .filter(|&(_, node, _, target, gain)| target != node && gain > 0)
            .collect();
        let single = candidates
            .iter()
            .filter(|&&(_, _, calls, target, _)| within(self.load[target] + calls))
            .map(|&(id, node, calls, target, gain)| {
                let higher = (self.load[node] - calls).max(self.load[target] + calls);
                (gain, Reverse(higher), Reverse(id), target)
            })
            .max();
        if let Some((gain, _, Reverse(id), target)) = single {
            return Some(vec![self.make(id, target, self.affinity_reason(id, target, gain))]);
        }
        if room < 2 {
            return None;
        }
        let (gain, Reverse((id, other)), target) = candidates
            .iter()
            .flat_map(|&(id, node, calls, target, gain)| {
                let on = &on;
                movable.iter().filter_map(move |&(other, other_node, other_calls)| {
                    let fits = within(self.load[node] - calls + other_calls)
                        && within(self.load[target] + calls - other_calls);
                    if other_node != target || other == id || !fits {
                        return None;
                    }
                    // Calls between the two stay across nodes either way.
                    let total = gain + on[&other][node] - on[&other][target] - 2 * self.calls_between(id, other);
                    (total > 0).then_some((total, Reverse((id, other)), target))
                })
            })
            .max()?;
        let source = self.node_of[&id];
        let reason = format!("affinity, swapped for load: {}", self.affinity_reason(id, target, gain));
        Some(vec![self.make(id, target, reason.clone()), self.make(other, source, reason)])
    }

    fn calls_between(&self, a: i64, b: i64) -> i64 {
        self.partners.get(&a).into_iter().flatten().filter(|(p, _)| *p == b).map(|(_, calls)| calls).sum()
    }

    fn affinity_reason(&self, object: i64, target: usize, gain: i64) -> String {
        let on = self.partner_calls(object);
        let source = self.node_of[&object];
        format!(
            "affinity: {} nested calls with objects on {}, {} with objects on {} ({} more on one node)",
            on[target], self.nodes[target], on[source], self.nodes[source], gain
        )
    }

    fn make(&self, object: i64, target: usize, reason: String) -> Move {
        Move {
            object_id: object,
            from: self.nodes[self.node_of[&object]].clone(),
            to: self.nodes[target].clone(),
            reason,
        }
    }

    fn apply(&mut self, step: &Move) {
        let target = self.nodes.iter().position(|n| *n == step.to).expect("a planned node");
        let source = std::mem::replace(self.node_of.get_mut(&step.object_id).expect("a planned object"), target);
        let calls = self.calls[&step.object_id];
        self.load[source] -= calls;
        self.load[target] += calls;
        self.moved.insert(step.object_id);
    }

    fn cross_node_calls(&self, pairs: &[Pair]) -> i64 {
        pairs.iter().filter(|p| self.node_of[&p.from] != self.node_of[&p.to]).map(|p| p.calls).sum()
    }

    fn loads(&self) -> BTreeMap<String, i64> {
        self.nodes.iter().cloned().zip(self.load.iter().copied()).collect()
    }
}

/// The objects that have light replicas once `steps` are taken.
fn replicated_after(replicas: &[ReplicaAt], steps: &[ReplicaStep]) -> HashSet<i64> {
    let mut now: HashSet<(i64, &str)> = replicas.iter().map(|r| (r.object_id, r.node.as_str())).collect();
    for s in steps {
        match s.action {
            replicas::Action::Add => now.insert((s.object_id, &s.node)),
            replicas::Action::Drop => now.remove(&(s.object_id, s.node.as_str())),
        };
    }
    now.into_iter().map(|(id, _)| id).collect()
}

fn share(part: i64, whole: i64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// The moves, and what they would have changed for the calls counted.
/// Objects on nodes not in `nodes`, and pairs with an object not in
/// `objects`, are left out.
pub fn plan(input: &Input) -> Plan {
    let replica_steps = replicas::plan(&input.objects, &input.light);
    let replicated = replicated_after(&input.light.replicas, &replica_steps);
    let index: HashMap<&str, usize> = input.nodes.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect();
    let placed: Vec<_> = input
        .objects
        .iter()
        .filter(|o| !replicated.contains(&o.id))
        .filter_map(|o| Some((o.id, *index.get(o.node.as_str())?, o.calls)))
        .collect();
    let mut model = Model {
        nodes: &input.nodes,
        node_of: placed.iter().map(|(id, node, _)| (*id, *node)).collect(),
        calls: placed.iter().map(|(id, _, calls)| (*id, *calls)).collect(),
        partners: HashMap::new(),
        load: vec![0; input.nodes.len()],
        moved: HashSet::new(),
        tolerance: input.tolerance,
    };
    for (_, node, calls) in &placed {
        model.load[*node] += calls;
    }
    let pairs: Vec<Pair> = input
        .pairs
        .iter()
        .filter(|p| p.from != p.to && model.node_of.contains_key(&p.from) && model.node_of.contains_key(&p.to))
        .map(|p| Pair { from: p.from, to: p.to, calls: p.calls })
        .collect();
    for p in &pairs {
        model.partners.entry(p.from).or_default().push((p.to, p.calls));
        model.partners.entry(p.to).or_default().push((p.from, p.calls));
    }
    let (cross_before, load_before) = (model.cross_node_calls(&pairs), model.loads());
    let mut moves = Vec::new();
    while moves.len() < input.max_moves {
        let room = input.max_moves - moves.len();
        let Some(step) = model.balancing_move().map(|m| vec![m]).or_else(|| model.affinity_moves(room)) else {
            break;
        };
        for m in step {
            model.apply(&m);
            moves.push(m);
        }
    }
    let nested_calls = pairs.iter().map(|p| p.calls).sum();
    let cross_after = model.cross_node_calls(&pairs);
    Plan {
        moves,
        replicas: replica_steps,
        nested_calls,
        cross_node_calls: Effect { before: cross_before, after: cross_after },
        cross_node_share: Effect { before: share(cross_before, nested_calls), after: share(cross_after, nested_calls) },
        load: Effect { before: load_before, after: model.loads() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(objects: &[(i64, &str, i64)], pairs: &[(i64, i64, i64)], max_moves: usize) -> Input {
        Input {
            nodes: vec!["a".into(), "b".into()],
            objects: objects
                .iter()
                .map(|(id, node, calls)| Object {
                    id: *id,
                    node: node.to_string(),
                    calls: *calls,
                    writes: 0,
                    busy_ms: 0.0,
                })
                .collect(),
            pairs: pairs.iter().map(|(from, to, calls)| Pair { from: *from, to: *to, calls: *calls }).collect(),
            max_moves,
            tolerance: 0.2,
            light: replicas::Input::default(),
        }
    }

    /// Each plan applied to its input: the counts a second run would see.
    fn after(input: &Input, plan: &Plan) -> Input {
        let to: HashMap<i64, &str> = plan.moves.iter().map(|m| (m.object_id, m.to.as_str())).collect();
        let objects: Vec<_> = input
            .objects
            .iter()
            .map(|o| (o.id, to.get(&o.id).copied().unwrap_or(&o.node).to_string(), o.calls))
            .collect();
        let objects: Vec<_> = objects.iter().map(|(id, node, calls)| (*id, node.as_str(), *calls)).collect();
        let pairs: Vec<_> = input.pairs.iter().map(|p| (p.from, p.to, p.calls)).collect();
        self::input(&objects, &pairs, input.max_moves)
    }

    #[test]
    fn partners_on_two_nodes_are_brought_together_and_load_stays_even() {
        // 1 -> 2, 3 -> 4, 5 -> 6, 7 -> 8: every pair across the nodes.
        let objects = [
            (1, "a", 10),
            (2, "b", 10),
            (3, "a", 10),
            (4, "b", 10),
            (5, "b", 10),
            (6, "a", 10),
            (7, "b", 10),
            (8, "a", 10),
        ];
        let pairs = [(1, 2, 10), (3, 4, 10), (5, 6, 10), (7, 8, 10)];
        let input = input(&objects, &pairs, 8);
        let plan = plan(&input);
        assert_eq!(plan.moves.len(), 4, "{plan:?}");
        assert_eq!((plan.cross_node_calls.before, plan.cross_node_calls.after), (40, 0));
        assert_eq!(plan.cross_node_share.before, 1.0);
        assert_eq!(plan.load.after.values().copied().collect::<Vec<_>>(), vec![40, 40]);
        // Over the same counts, a second run plans nothing.
        assert!(self::plan(&after(&input, &plan)).moves.is_empty());
    }

    #[test]
    fn a_run_makes_at_most_max_moves_the_ones_that_keep_most_calls_on_one_node() {
        let objects = [(1, "a", 10), (2, "b", 10), (3, "a", 10), (4, "b", 10), (5, "b", 10), (6, "a", 10)];
        let plan = plan(&input(&objects, &[(1, 2, 10), (3, 4, 5), (5, 6, 1)], 2));
        // No single move fits the bound: one swap, of 1 and 4.
        let moved: Vec<_> = plan.moves.iter().map(|m| (m.object_id, m.to.as_str())).collect();
        assert_eq!(moved, vec![(1, "b"), (4, "a")], "{plan:?}");
        assert_eq!((plan.cross_node_calls.before, plan.cross_node_calls.after), (16, 1));
    }

    #[test]
    fn the_hot_object_of_a_skewed_load_moves_to_the_idle_node() {
        let objects = [(1, "a", 800), (2, "a", 50), (3, "a", 50), (4, "b", 10)];
        let input = input(&objects, &[], 4);
        let plan = plan(&input);
        assert_eq!(plan.moves[0].object_id, 1, "{plan:?}");
        assert_eq!(plan.moves[0].to, "b");
        assert!(plan.load.after["a"] < 800 && plan.load.after["b"] < 900);
        assert!(self::plan(&after(&input, &plan)).moves.is_empty(), "balanced as far as moves can make it");
    }

    #[test]
    fn a_balanced_cluster_without_partners_across_nodes_plans_nothing() {
        let objects = [(1, "a", 100), (2, "a", 10), (3, "b", 100), (4, "b", 10)];
        let plan = plan(&input(&objects, &[(1, 2, 10), (3, 4, 10)], 4));
        assert!(plan.moves.is_empty());
        assert_eq!(plan.cross_node_share.before, 0.0);
    }

    #[test]
    fn an_object_with_light_replicas_is_neither_moved_nor_counted_in_load() {
        let objects = [(1, "a", 800), (2, "a", 50), (3, "a", 50), (4, "b", 10)];
        let mut input = input(&objects, &[], 4);
        input.light.replica_nodes = input.nodes.clone();
        input.light.replicas = vec![ReplicaAt { object_id: 1, node: "b".into(), by_rebalancer: false }];
        let plan = plan(&input);
        assert!(plan.replicas.is_empty(), "the policy is off: {plan:?}");
        assert!(plan.moves.iter().all(|m| m.object_id != 1), "{plan:?}");
        assert_eq!(plan.load.before["a"], 100);
    }

    #[test]
    fn partners_are_not_brought_together_past_the_load_bound() {
        // All of b's load would land on a: brought together, a would take
        // everything.
        let objects = [(1, "a", 100), (2, "b", 100)];
        let plan = plan(&input(&objects, &[(1, 2, 50)], 4));
        assert!(plan.moves.is_empty(), "{plan:?}");
    }
}
