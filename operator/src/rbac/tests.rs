use super::*;

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// What discovery reports for a cluster with a few custom resources.
fn served() -> Vec<ServedKind> {
    let kind = |kind: &str, group: &str, resource: &str, namespaced, scalable| ServedKind {
        kind: kind.into(),
        resolved: Resolved {
            group: group.into(),
            resource: resource.into(),
            namespaced,
            scalable,
        },
    };
    vec![
        kind(
            "ServiceMonitor",
            "monitoring.coreos.com",
            "servicemonitors",
            true,
            false,
        ),
        kind(
            "Prometheus",
            "monitoring.coreos.com",
            "prometheuses",
            true,
            true,
        ),
        kind(
            "ClusterIssuer",
            "cert-manager.io",
            "clusterissuers",
            false,
            false,
        ),
        kind(
            "Certificate",
            "cert-manager.io",
            "certificates",
            true,
            false,
        ),
        kind("Certificate", "example.com", "certificates", true, false),
    ]
}

#[test]
fn pod_metrics_grant_metrics_reads_only_when_asked() {
    assert!(metrics_rules(false, true).is_empty());
    assert!(metrics_rules(false, false).is_empty());
    let cluster = metrics_rules(true, true);
    let read = |rule: &PolicyRule| {
        (
            rule.api_groups.clone().unwrap_or_default(),
            rule.resources.clone().unwrap_or_default(),
            rule.verbs.clone(),
        )
    };
    // `kubectl top node` reads nodes' metrics and the Node objects (their allocatable).
    assert_eq!(
        cluster.iter().map(read).collect::<Vec<_>>(),
        [
            (
                names(&["metrics.k8s.io"]),
                names(&["nodes", "pods"]),
                names(&["get", "list"])
            ),
            (names(&[""]), names(&["nodes"]), names(&["get", "list"])),
        ]
    );
    let namespaced = metrics_rules(true, false);
    assert_eq!(
        namespaced.iter().map(read).collect::<Vec<_>>(),
        [(
            names(&["metrics.k8s.io"]),
            names(&["pods"]),
            names(&["get", "list"])
        )]
    );
}

#[test]
fn resolves_the_spellings_accounts_use() {
    for spelling in [
        "Deployment",
        "deployment",
        "deployments",
        "Deployment.apps",
        "deployments.apps",
    ] {
        let resolved = resolve(spelling, &[]).unwrap();
        assert_eq!(
            (resolved.group.as_str(), resolved.resource.as_str()),
            ("apps", "deployments")
        );
        assert!(resolved.scalable);
    }
    assert_eq!(
        resolve("NetworkPolicy", &[]).unwrap().group,
        "networking.k8s.io"
    );
}

#[test]
fn custom_kinds_resolve_to_what_the_cluster_serves() {
    let served = served();
    // The real plural, scope and scale subresource, not guesses.
    let prometheus = resolve("Prometheus.monitoring.coreos.com", &served).unwrap();
    assert_eq!(prometheus.resource, "prometheuses");
    assert!(prometheus.scalable);
    let issuer = resolve("ClusterIssuer", &served).unwrap();
    assert_eq!(issuer.group, "cert-manager.io");
    assert!(!issuer.namespaced);
    assert_eq!(
        resolve("servicemonitors", &served).unwrap().group,
        "monitoring.coreos.com"
    );
    // Served by two groups: it must carry its group.
    assert!(resolve("Certificate", &served).is_none());
    assert_eq!(
        resolve("certificates.cert-manager.io", &served)
            .unwrap()
            .group,
        "cert-manager.io"
    );
    // Not served at all (its CRD is not installed): unknown, not guessed.
    assert!(resolve("Widget.example.org", &served).is_none());
    assert!(resolve("ServiceMonitor", &[]).is_none());
}

fn read_only(kinds: &[&str]) -> AccountKinds {
    AccountKinds {
        watched: watched(&names(kinds), &[], &[], &[]).unwrap(),
        deployed: None,
    }
}

/// An account that deploys `deploy_kinds` (`None`: what it watches).
fn deploying(kinds: &[&str], deploy_kinds: Option<&[&str]>) -> AccountKinds {
    let watched = watched(&names(kinds), &[], &[], &[]).unwrap();
    let deploy_kinds = deploy_kinds.map(names);
    let deployed = deployed(deploy_kinds.as_deref(), &watched, &[]).unwrap();
    AccountKinds {
        watched,
        deployed: Some(deployed),
    }
}

/// The verbs `rules` grant on `resource` of `group` (directly or through `*`), in
/// `VERB_ORDER`.
fn verbs_on(rules: &[PolicyRule], group: &str, resource: &str) -> Vec<String> {
    let mut verbs: BTreeSet<String> = BTreeSet::new();
    for rule in rules {
        let in_group = rule.api_groups.as_ref().unwrap().iter().any(|g| g == group);
        let names = rule.resources.as_ref().unwrap();
        if in_group && names.iter().any(|r| r == resource || r == "*") {
            verbs.extend(rule.verbs.iter().cloned());
        }
    }
    let mut verbs: Vec<String> = verbs.into_iter().collect();
    verbs.sort_by_key(|verb| VERB_ORDER.iter().position(|v| v == verb));
    verbs
}

fn all_verbs() -> Vec<String> {
    names(VERB_ORDER)
}

#[test]
fn read_only_rules_cover_the_kinds_and_what_their_reads_need() {
    let rules = super::rules(
        &[read_only(&[
            "Deployment",
            "StatefulSet",
            "ConfigMap",
            "Namespace",
        ])],
        false,
        &[],
    );
    let read = names(READ_VERBS);
    for (group, resource) in [
        ("apps", "deployments"),
        ("apps", "statefulsets"),
        ("", "configmaps"),
        // rollout history of a Deployment, of a StatefulSet
        ("apps", "replicasets"),
        ("apps", "controllerrevisions"),
        // logs of their pods, and events of anything
        ("", "pods"),
        ("", "events"),
    ] {
        assert_eq!(
            verbs_on(&rules, group, resource),
            read,
            "{group}/{resource}"
        );
    }
    assert_eq!(verbs_on(&rules, "", "pods/log"), names(&["get"]));
    assert!(
        verbs_on(&rules, "", "namespaces").is_empty(),
        "namespaces dropped from a Role"
    );
    for (group, resource) in [
        ("", "secrets"),
        ("", "services"),
        ("batch", "jobs"),
        ("apps", "deployments/scale"),
        ("", "pods/exec"),
    ] {
        assert!(
            verbs_on(&rules, group, resource).is_empty(),
            "{group}/{resource}: {rules:?}"
        );
    }
    assert!(
        rules
            .iter()
            .all(|r| !r.verbs.iter().any(|v| WRITE_VERBS.contains(&v.as_str()))),
        "ReadOnly writes nothing: {rules:?}"
    );
    // One rule per group and set of verbs.
    let core_read = rules
        .iter()
        .find(|r| r.api_groups == Some(names(&[""])) && r.verbs == read)
        .unwrap();
    assert_eq!(
        core_read.resources,
        Some(names(&["configmaps", "events", "pods"]))
    );
}

#[test]
fn deploy_writes_the_deploy_kinds_with_scale_and_only_reads_the_rest() {
    let rules = super::rules(&[deploying(&["Deployment", "Namespace"], None)], true, &[]);
    assert_eq!(verbs_on(&rules, "apps", "deployments"), all_verbs());
    assert_eq!(verbs_on(&rules, "", "namespaces"), all_verbs());
    assert_eq!(
        verbs_on(&rules, "apps", "deployments/scale"),
        names(SCALE_VERBS)
    );
    // Read for rollout history and undo, never written.
    assert_eq!(verbs_on(&rules, "apps", "replicasets"), names(READ_VERBS));
    assert_eq!(verbs_on(&rules, "", "pods"), names(READ_VERBS));
    assert!(verbs_on(&rules, "", "pods/exec").is_empty());
}

#[test]
fn deploy_kinds_default_to_the_watched_kinds_and_may_name_unwatched_ones() {
    let w = watched(&names(&["ConfigMap"]), &[], &[], &[]).unwrap();
    assert_eq!(deployed(None, &w, &[]).unwrap(), w);
    assert_eq!(
        deployed(Some(&names(&["Job", "Widget"])), &w, &[]).unwrap_err(),
        names(&["Widget"])
    );

    // A Job deployed without being watched.
    let rules = super::rules(
        &[deploying(&["ConfigMap"], Some(&["ConfigMap", "Job"]))],
        false,
        &[],
    );
    assert_eq!(verbs_on(&rules, "batch", "jobs"), all_verbs());
    assert_eq!(verbs_on(&rules, "", "configmaps"), all_verbs());
    assert_eq!(verbs_on(&rules, "", "pods"), names(READ_VERBS), "Job logs");
    assert_eq!(verbs_on(&rules, "", "pods/log"), names(&["get"]));

    // `deployKinds: []`: read-only under a Deploy agent.
    let rules = super::rules(&[deploying(&["ConfigMap"], Some(&[]))], false, &[]);
    assert_eq!(verbs_on(&rules, "", "configmaps"), names(READ_VERBS));

    // Watched but not deployable: read only.
    let rules = super::rules(
        &[deploying(&["ConfigMap", "Service"], Some(&["ConfigMap"]))],
        false,
        &[],
    );
    assert_eq!(verbs_on(&rules, "", "services"), names(READ_VERBS));
}

#[test]
fn deployable_pods_may_be_exec_attached_and_port_forwarded() {
    let rules = super::rules(&[deploying(&["Pod"], None)], false, &[]);
    for stream in ["pods/exec", "pods/attach", "pods/portforward"] {
        assert_eq!(
            verbs_on(&rules, "", stream),
            names(STREAM_VERBS),
            "{stream}"
        );
    }
    let rules = super::rules(&[read_only(&["Pod"])], false, &[]);
    assert!(verbs_on(&rules, "", "pods/exec").is_empty());
}

#[test]
fn watched_secrets_are_list_watch_only_and_deployable_ones_are_readable() {
    let ro = super::rules(&[read_only(&["Secret"])], false, &[]);
    assert_eq!(verbs_on(&ro, "", "secrets"), names(SECRET_READ_VERBS));
    // Deploy: client-side apply and replace read the live Secret; create, update and
    // patch answer with the whole object, so `get` reveals nothing writing does not.
    let deploy = super::rules(&[deploying(&["Secret"], None)], false, &[]);
    assert_eq!(verbs_on(&deploy, "", "secrets"), all_verbs());
    // Not watched and not deployable: nothing at all.
    let none = super::rules(&[deploying(&["ConfigMap"], None)], false, &[]);
    assert!(verbs_on(&none, "", "secrets").is_empty());
}

#[test]
fn everything_is_the_core_one_by_one_and_every_other_group() {
    let groups = names(&["apps", "batch"]);
    let everything_but_secrets = AccountKinds {
        watched: watched(&[], &names(&["Secret", "Event"]), &[], &[]).unwrap(),
        deployed: None,
    };
    let all = super::rules(std::slice::from_ref(&everything_but_secrets), true, &groups);
    assert!(verbs_on(&all, "", "secrets").is_empty(), "{all:?}");
    assert_eq!(verbs_on(&all, "apps", "replicasets"), names(READ_VERBS));
    assert_eq!(verbs_on(&all, "", "pods"), names(READ_VERBS));
    assert_eq!(verbs_on(&all, "", "namespaces"), names(READ_VERBS));
    assert_eq!(verbs_on(&all, "", "pods/log"), names(&["get"]));
    // Omitted from the watch, still readable for the `events` operation.
    assert_eq!(verbs_on(&all, "", "events"), names(READ_VERBS));
    // `*` covers the group: no resource of it listed again.
    assert!(
        all.iter().all(|r| {
            r.api_groups != Some(names(&["apps"])) || r.resources == Some(names(&["*"]))
        })
    );

    // Watching everything, deploying Deployments: the group's `*` stays read-only and
    // Deployments are listed with the write verbs next to it.
    let mut narrow = everything_but_secrets.clone();
    narrow.deployed = Some(watched(&names(&["Deployment"]), &[], &[], &[]).unwrap());
    let rules = super::rules(&[narrow], true, &groups);
    assert_eq!(verbs_on(&rules, "apps", "deployments"), all_verbs());
    assert_eq!(verbs_on(&rules, "apps", "statefulsets"), names(READ_VERBS));
    assert_eq!(verbs_on(&rules, "batch", "jobs"), names(READ_VERBS));

    // Deploying everything (the default for an account watching everything).
    let mut wide = everything_but_secrets;
    wide.deployed = Some(wide.watched.clone());
    let rules = super::rules(&[wide], true, &groups);
    assert_eq!(verbs_on(&rules, "batch", "jobs"), all_verbs());
    assert_eq!(verbs_on(&rules, "", "configmaps"), all_verbs());
    assert!(verbs_on(&rules, "", "secrets").is_empty(), "omitted");
}

#[test]
fn deploying_everything_writes_no_privileges_unless_they_are_named() {
    let groups = names(&[
        "apps",
        "rbac.authorization.k8s.io",
        "admissionregistration.k8s.io",
        "apiregistration.k8s.io",
        "apiextensions.k8s.io",
    ]);
    for kinds in [&[][..], &["*"]] {
        let rules = super::rules(&[deploying(kinds, None)], true, &groups);
        assert_eq!(verbs_on(&rules, "apps", "deployments"), all_verbs());
        for group in PRIVILEGE_GROUPS {
            assert_eq!(
                verbs_on(&rules, group, "anything"),
                names(READ_VERBS),
                "{group}"
            );
        }
    }
    // Named, they are deployable.
    let named = super::rules(
        &[deploying(&[], Some(&["ClusterRoleBinding", "Deployment"]))],
        true,
        &groups,
    );
    assert_eq!(
        verbs_on(&named, "rbac.authorization.k8s.io", "clusterrolebindings"),
        all_verbs()
    );
    assert_eq!(
        verbs_on(&named, "rbac.authorization.k8s.io", "roles"),
        names(READ_VERBS)
    );
}

/// The guide's operator reference says which groups the default Deploy account cannot write.
#[test]
fn the_readme_lists_the_privilege_groups() {
    let readme = include_str!("../../../docs/src/reference/operator.md");
    let line = readme
        .lines()
        .find(|l| l.contains("Deploy without `kinds`"))
        .expect("docs/src/reference/operator.md: the line on what Deploy without `kinds` grants");
    for group in PRIVILEGE_GROUPS {
        assert!(
            line.contains(&format!("`{group}`")),
            "{group} missing: {line}"
        );
    }
}

#[test]
fn a_star_watches_everything() {
    let star = watched(&names(&["*"]), &[], &[], &[]).unwrap();
    assert!(star.everything);
    assert_eq!(star, watched(&[], &[], &[], &[]).unwrap());
}

#[test]
fn no_accounts_no_rules() {
    assert!(rules(&[], true, &names(&["apps"])).is_empty());
}

#[test]
fn unknown_kinds_are_reported() {
    assert_eq!(
        watched(&names(&["Deployment", "Widget"]), &[], &[], &[]).unwrap_err(),
        names(&["Widget"])
    );
    let custom = watched(
        &names(&["Pod"]),
        &[],
        &[("ServiceMonitor".into(), "monitoring.coreos.com".into())],
        &served(),
    )
    .unwrap();
    assert_eq!(custom.resources.len(), 2);
    assert_eq!(
        watched(
            &names(&["Pod"]),
            &[],
            &[("Widget".into(), "example.org".into())],
            &served(),
        )
        .unwrap_err(),
        names(&["Widget.example.org"])
    );
}
