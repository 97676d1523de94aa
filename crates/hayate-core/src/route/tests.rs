#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

fn seg() -> impl Strategy<Value = String> {
    prop_oneof!["a", "b", "c"].prop_map(String::from)
}

fn pat_seg() -> impl Strategy<Value = String> {
    prop_oneof![3 => seg(), 1 => Just("*".to_string()), 1 => Just("**".to_string())]
}

pub(super) fn expr() -> impl Strategy<Value = KeyExpr> {
    proptest::collection::vec(pat_seg(), 1..5).prop_map(|v| KeyExpr::new(&v.join("/")).unwrap())
}

pub(super) fn key() -> impl Strategy<Value = Key> {
    proptest::collection::vec(seg(), 1..6).prop_map(|v| Key::new(&v.join("/")).unwrap())
}

fn id() -> impl Strategy<Value = SubKey> {
    (0..3u64, 0..6u32)
}

#[derive(Debug, Clone)]
enum Op {
    Subscribe(SubKey, KeyExpr, Option<&'static str>, u32),
    Unsubscribe(SubKey),
    Lookup(Key),
}

fn op() -> impl Strategy<Value = Op> {
    let group = prop_oneof![2 => Just(None), 1 => Just(Some("g")), 1 => Just(Some("h"))];
    prop_oneof![
        3 => (id(), expr(), group, any::<u32>()).prop_map(|(i, e, g, t)| Op::Subscribe(i, e, g, t)),
        1 => id().prop_map(Op::Unsubscribe),
        3 => key().prop_map(Op::Lookup),
    ]
}

/// A route as plain data: fan-out (id, target)s, then (group, members) in order.
type Plain = (Vec<(SubKey, u32)>, Vec<(String, Vec<(SubKey, u32)>)>);

/// The brute-force matcher: every subscription, by id, looked at one by one.
type Model = BTreeMap<SubKey, (KeyExpr, Option<&'static str>, u32)>;

/// What a route must be, from the model: fan-out targets in id order, and the groups in the
/// order of their first member's id, each with its members in id order. `admit` leaves
/// targets out as [`Table::route`]'s does.
fn want_route(model: &Model, key: &Key, admit: impl Fn(u32) -> bool) -> Plain {
    let mut fanout = Vec::new();
    let mut groups: Vec<(String, Vec<(SubKey, u32)>)> = Vec::new();
    for (id, (e, g, t)) in model {
        if !e.matches(key) || !admit(*t) {
            continue;
        }
        match g {
            None => fanout.push((*id, *t)),
            Some(g) => match groups.iter_mut().find(|(n, _)| n == g) {
                Some((_, v)) => v.push((*id, *t)),
                None => groups.push((g.to_string(), vec![(*id, *t)])),
            },
        }
    }
    (fanout, groups)
}

fn got_route(r: &Route<(SubKey, u32)>) -> Plain {
    let groups = r
        .groups
        .iter()
        .map(|g| (g.id.to_string(), g.members.clone()))
        .collect();
    (r.fanout.clone(), groups)
}

fn check_groups(table: &Table<u32>, model: &Model) -> Result<(), TestCaseError> {
    let mut want: BTreeMap<String, usize> = BTreeMap::new();
    for (_, g, _) in model.values() {
        if let Some(g) = g {
            *want.entry(g.to_string()).or_default() += 1;
        }
    }
    let got: BTreeMap<String, usize> = table.groups().map(|(g, n)| (g.to_string(), n)).collect();
    prop_assert_eq!(got, want);
    Ok(())
}

proptest! {
    /// Random subscribes (new ids and replacements), unsubscribes and lookups: the table,
    /// and a route cache in front of it, agree with matching every subscription on its own.
    #[test]
    fn table_agrees_with_brute_force(ops in proptest::collection::vec(op(), 1..60)) {
        let mut table: Table<u32> = Table::new();
        let mut model = Model::new();
        let mut cache: RouteCache<Route<(SubKey, u32)>> = RouteCache::new(3);
        let mut generation = 1u64;
        for op in ops {
            match op {
                Op::Subscribe(id, e, g, t) => {
                    let interned = table.insert(id, e.clone(), g, t);
                    prop_assert_eq!(interned.as_deref(), g);
                    model.insert(id, (e, g, t));
                    generation += 1;
                }
                Op::Unsubscribe(id) => {
                    let removed = table.remove(id);
                    let was = model.remove(&id);
                    prop_assert_eq!(removed.is_some(), was.is_some());
                    if let (Some(r), Some((e, g, t))) = (removed, was) {
                        prop_assert_eq!(&r.sub.expr, &e);
                        prop_assert_eq!(r.sub.group.as_deref(), g);
                        prop_assert_eq!(r.sub.target, t);
                        let left = g.is_some() && model.values().any(|(_, h, _)| *h == g);
                        prop_assert_eq!(r.group_emptied, g.is_some() && !left);
                    }
                    generation += 1;
                }
                Op::Lookup(k) => {
                    let all = |_: u32| true;
                    let route = table.route(&k, |id, s| Some((id, s.target)));
                    prop_assert_eq!(got_route(&route), want_route(&model, &k, all));
                    let ids: Vec<SubKey> = table.matching(&k).map(|(id, _)| id).collect();
                    let want_ids: Vec<SubKey> =
                        model.iter().filter(|(_, (e, ..))| e.matches(&k)).map(|(id, _)| *id).collect();
                    prop_assert_eq!(ids, want_ids);
                    // A target left out by `admit`; a group left with none is not routed.
                    let odd = |t: u32| t % 2 == 1;
                    let some = table.route(&k, |id, s| odd(s.target).then_some((id, s.target)));
                    prop_assert_eq!(got_route(&some), want_route(&model, &k, odd));
                    let cached = cache.get_or_build(generation, &k, || {
                        (generation, Arc::new(table.route(&k, |id, s| Some((id, s.target)))))
                    });
                    prop_assert_eq!(got_route(&cached), want_route(&model, &k, all));
                    prop_assert!(cache.len() <= 3);
                    check_turns(&route)?;
                }
            }
            prop_assert_eq!(table.len(), model.len());
            check_groups(&table, &model)?;
        }
        // Everything removed, the trie is empty again.
        table.retain(|_, _| false);
        prop_assert!(table.is_empty() && table.index.is_empty() && table.groups().count() == 0);
    }
}

/// A group's members take turns: one turn per pick, shared by every route of the group; a
/// rotation gives each member once, from the one whose turn it is.
fn check_turns(route: &Route<(SubKey, u32)>) -> Result<(), TestCaseError> {
    for g in &route.groups {
        let n = g.members.len();
        let t = g.rr.turn();
        let rotation: Vec<_> = g.rr.rotation(&g.members).copied().collect();
        let want: Vec<_> = (0..n).map(|k| g.members[(t + 1 + k) % n]).collect();
        prop_assert_eq!(rotation, want);
        let picked = g.rr.pick(&g.members).copied();
        prop_assert_eq!(picked, Some(g.members[(t + 2) % n]));
    }
    Ok(())
}

#[test]
fn turns_are_per_group_and_kept_across_keys() {
    let mut table = Table::new();
    table.insert((1, 1), KeyExpr::new("a/*").unwrap(), Some("g"), 'x');
    table.insert((1, 2), KeyExpr::new("a/**").unwrap(), Some("g"), 'y');
    table.insert((2, 1), KeyExpr::new("a/b").unwrap(), Some("h"), 'z');
    let ab = table.route(&Key::new("a/b").unwrap(), |_, s| Some(s.target));
    let ac = table.route(&Key::new("a/c").unwrap(), |_, s| Some(s.target));
    let picks: String = [&ab, &ac, &ab, &ac]
        .iter()
        .map(|r| {
            *r.group("g")
                .unwrap()
                .rr
                .pick(&r.group("g").unwrap().members)
                .unwrap()
        })
        .collect();
    assert_eq!(picks, "xyxy");
    assert_eq!(ab.group("h").unwrap().members, vec!['z']);
    assert!(ac.group("h").is_none());
    assert!(table.remove((2, 1)).unwrap().group_emptied);
    assert!(!table.has_group("h"));
    assert!(!table.remove((1, 1)).unwrap().group_emptied);
    assert!(table.has_group("g"));
}

#[test]
fn route_built_across_a_change_is_not_kept() {
    let mut cache: RouteCache<u8> = RouteCache::new(8);
    let k = Key::new("a").unwrap();
    assert_eq!(*cache.get_or_build(2, &k, || (1, Arc::new(1))), 1);
    assert!(cache.is_empty());
    assert_eq!(*cache.get_or_build(2, &k, || (2, Arc::new(2))), 2);
    assert_eq!(*cache.get_or_build(2, &k, || (2, Arc::new(3))), 2);
    assert_eq!(*cache.get_or_build(3, &k, || (3, Arc::new(4))), 4);
}
