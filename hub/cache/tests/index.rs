//! The object indexes against a plain scan: any sequence of applies, deletes, snapshots
//! (a kind's objects replaced at once) and reads gives the answers a scan of a plain map by
//! uid gives.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeMap, ops::Bound, sync::Arc};

use proptest::prelude::*;
use scale_agent_hub_cache::{CachedObject, Objects};
use scale_agent_testkit::properties::config;

// Few namespaces and names, so that reads hit and uids share names (a missed DELETED);
// "a" and "a-b" sort differently as tuples and as etcd keys.
const NAMESPACES: &[&str] = &["", "a", "a-b", "b"];
const NAMES: &[&str] = &["x", "y", "z"];

fn object(ns: usize, name: usize, uid: u8, rv: u32) -> Arc<CachedObject> {
    Arc::new(CachedObject {
        namespace: NAMESPACES[ns].into(),
        name: NAMES[name].into(),
        uid: format!("uid-{uid}"),
        resource_version: rv.to_string(),
        json: br#"{"metadata":{}}"#.to_vec().into(),
        truncated: false,
    })
}

#[derive(Clone, Debug)]
enum Step {
    Apply(usize, usize, u8, u32),
    Delete(u8),
    Snapshot(Vec<(usize, usize, u8, u32)>),
    DropNamespace(usize),
}

fn step() -> impl Strategy<Value = Step> {
    let spec = (0..NAMESPACES.len(), 0..NAMES.len(), 0u8..10, 1u32..50);
    prop_oneof![
        6 => spec.clone().prop_map(|(n, m, u, r)| Step::Apply(n, m, u, r)),
        3 => (0u8..10).prop_map(Step::Delete),
        1 => proptest::collection::vec(spec, 0..12).prop_map(Step::Snapshot),
        1 => (0..NAMESPACES.len()).prop_map(Step::DropNamespace),
    ]
}

type Model = BTreeMap<String, Arc<CachedObject>>;

fn uids<'a>(objects: impl Iterator<Item = &'a Arc<CachedObject>>) -> Vec<String> {
    objects.map(|o| o.uid.clone()).collect()
}

/// Every read the indexes answer, against a scan of the model.
fn check(objects: &Objects, model: &Model) {
    assert_eq!(objects.len(), model.len());
    assert_eq!(objects.is_empty(), model.is_empty());
    // All of them, in (namespace, name, uid) order.
    let mut all: Vec<&Arc<CachedObject>> = model.values().collect();
    all.sort_by(|a, b| (&a.namespace, &a.name, &a.uid).cmp(&(&b.namespace, &b.name, &b.uid)));
    assert_eq!(uids(objects.values()), uids(all.iter().copied()));
    for uid in 0..10u8 {
        let uid = format!("uid-{uid}");
        assert_eq!(objects.get(&uid), model.get(&uid));
        assert_eq!(objects.contains_key(&uid), model.contains_key(&uid));
        let after: Vec<String> = model
            .range::<str, _>((Bound::Excluded(uid.as_str()), Bound::Unbounded))
            .map(|(u, _)| u.clone())
            .collect();
        assert_eq!(uids(objects.range_by_uid(Bound::Excluded(&uid))), after);
    }
    for ns in NAMESPACES {
        let scanned: Vec<&Arc<CachedObject>> =
            all.iter().copied().filter(|o| o.namespace == *ns).collect();
        assert_eq!(
            uids(objects.in_namespace(ns)),
            uids(scanned.iter().copied())
        );
        assert_eq!(
            uids(objects.in_scope(Some(ns))),
            uids(scanned.iter().copied())
        );
        for name in NAMES {
            // Of two uids with one name, the newest resourceVersion; the first uid of
            // equals.
            let newest = scanned
                .iter()
                .filter(|o| o.name == *name)
                .min_by_key(|o| {
                    (
                        std::cmp::Reverse(o.resource_version.parse::<u32>().unwrap()),
                        o.uid.clone(),
                    )
                })
                .map(|o| o.uid.clone());
            assert_eq!(
                objects.by_name(ns, name).map(|o| o.uid.clone()),
                newest,
                "{ns}/{name}"
            );
        }
    }
    assert_eq!(uids(objects.in_scope(None)), uids(all.iter().copied()));
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn indexes_answer_as_a_scan_does(steps in proptest::collection::vec(step(), 0..80)) {
        let mut objects = Objects::default();
        let mut model = Model::new();
        // A reader's copy, taken before the later steps: it keeps its answers.
        let mut pinned: Option<(Objects, Model)> = None;
        for (i, step) in steps.into_iter().enumerate() {
            match step {
                Step::Apply(ns, name, uid, rv) => {
                    let o = object(ns, name, uid, rv);
                    let replaced = objects.insert(o.clone());
                    prop_assert_eq!(replaced, model.insert(o.uid.clone(), o));
                }
                Step::Delete(uid) => {
                    let uid = format!("uid-{uid}");
                    prop_assert_eq!(objects.remove(&uid), model.remove(&uid));
                }
                Step::Snapshot(specs) => {
                    let all: Vec<Arc<CachedObject>> = specs
                        .into_iter()
                        .map(|(n, m, u, r)| object(n, m, u, r))
                        .collect();
                    objects = all.iter().cloned().collect();
                    model = all.into_iter().map(|o| (o.uid.clone(), o)).collect();
                }
                Step::DropNamespace(ns) => {
                    objects.retain(|o| o.namespace != NAMESPACES[ns]);
                    model.retain(|_, o| o.namespace != NAMESPACES[ns]);
                }
            }
            check(&objects, &model);
            if i % 7 == 0 {
                pinned = Some((objects.clone(), model.clone()));
            }
            if let Some((objects, model)) = &pinned {
                check(objects, model);
            }
        }
    }
}
